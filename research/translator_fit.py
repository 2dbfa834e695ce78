"""Stage 1 of the KV translator: closed-form ridge, its comparisons and its held-out R^2.

    # which features: sharer layers, the token before, the alignment numbers (raw pilot samples)
    python research/translator_fit.py pilot --raw DATA/raw --out DATA/pilot.json
    # the map from the corpus's ridge sums: lambda chosen on held-out text, full and reduced rank
    python research/translator_fit.py fit --stats DATA/stats-n1 --raw DATA/raw \\
        --ranks 256,512,768 --out DATA/ridge-n1

R^2 is pooled over the z-scored target dimensions of all receiver layers, apart for keys and
values, on two held-out sets: ``check`` (corpus text never fitted: text like the training text)
and ``unseen`` (contexts with held-out names, towns, landmarks and codes: recall's held-out split
and the evaluators' 100 Countries records). Raw samples come from
``research/translator_extract.py raw``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import ridge as tr_ridge
from kvviz.handoffs.translate import translator as tr  # noqa: E402
from kvviz.runtime.models import prepared_facts  # noqa: E402

LAMBDAS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


class Raw:
    """A raw sample (float16 on disk, read in row slices) and the column layout of its features."""

    def __init__(self, path: Path, rows: int | None = None):
        from safetensors import safe_open

        self.path = path
        with safe_open(str(path), "pt") as handle:
            self.layout = json.loads(handle.metadata()["RAW_LAYOUT"])
            self.text = handle.get_tensor("text")
            self.width = handle.get_slice("x").get_shape()[1]
        self.rows = self.text.shape[0] if rows is None else min(rows, self.text.shape[0])
        self.per = self.layout["per_layer"]
        self._x = self._y = None

    def slice(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [start, end) of (x, y), float16."""
        from safetensors import safe_open

        end = min(end, self.rows)
        with safe_open(str(self.path), "pt") as handle:
            return handle.get_slice("x")[start:end], handle.get_slice("y")[start:end]

    @property
    def x(self) -> torch.Tensor:
        if self._x is None:
            self._x, self._y = self.slice(0, self.rows)
        return self._x

    @property
    def y(self) -> torch.Tensor:
        if self._y is None:
            self._x, self._y = self.slice(0, self.rows)
        return self._y

    def columns(self, layers, neighbours: int, alignment: bool = True) -> list[int]:
        """Raw columns in ``kvviz.handoffs.translate.translator.features`` order for this configuration."""
        cols = []
        for layer in layers:
            cols += range(layer * self.per, (layer + 1) * self.per)
        if neighbours:
            base = self.layout["aligned_layers"] * self.per
            before = self.layout["before_layers"]
            for layer in layers:
                if layer not in before:
                    raise ValueError(f"raw samples hold the token before only at layers {before}")
                i = before.index(layer)
                cols += range(base + i * self.per, base + (i + 1) * self.per)
        if alignment:
            cols += range(self.width - self.layout["alignment"], self.width)
        return cols

    def features(self, cols) -> torch.Tensor:
        return self.x[:, cols].float()


def stats_from_raw(raw: Raw, cols, chunk: int = 4096) -> tr_ridge.RidgeStats:
    stats = tr_ridge.RidgeStats(len(cols), _target_width(raw))
    index = torch.tensor(cols)
    for start in range(0, raw.rows, chunk):
        x, y = raw.slice(start, start + chunk)
        stats.add(x.index_select(1, index).float(), y.float())
    return stats


def _target_width(raw: Raw) -> int:
    from safetensors import safe_open

    with safe_open(str(raw.path), "pt") as handle:
        return handle.get_slice("y").get_shape()[1]


def translator_for(pair_facts, layers, neighbours: int, rank=None, alignment: bool = True) -> tr.KVTranslator:
    sharer, receiver = pair_facts
    return tr.KVTranslator(tr.TranslatorConfig(sharer=sharer, receiver=receiver, pair="embedded",
                                                sharer_layers=list(layers), neighbours=neighbours, rank=rank))


def evaluate(fit: dict, raws: dict[str, Raw], cols, layers_r: int) -> dict:
    """R^2 of a fit on each held-out set (features taken in the fit's columns)."""
    out = {}
    for name, raw in raws.items():
        x = raw.features(cols)
        z = (x - fit["x_mean"]) / fit["x_scale"]
        predicted = z @ fit["weight"] if "weight" in fit else (z @ fit["down"]) @ fit["up"]
        truth = (raw.y.float() - fit["y_mean"]) / fit["y_scale"]
        err = ((predicted - truth) ** 2).reshape(x.shape[0], layers_r, 2, -1).sum(dim=(0, 3)).double()
        var = ((truth - truth.mean(0)) ** 2).reshape(x.shape[0], layers_r, 2, -1).sum(dim=(0, 3)).double()
        out[name] = {
            "k": round(float(1 - err[:, 0].sum() / var[:, 0].sum()), 4),
            "v": round(float(1 - err[:, 1].sum() / var[:, 1].sum()), 4),
            "k_layers": [round(float(v), 3) for v in 1 - err[:, 0] / var[:, 0]],
            "v_layers": [round(float(v), 3) for v in 1 - err[:, 1] / var[:, 1]],
        }
    return out


def best_lambda(stats, raws, cols, layers_r, lambdas=LAMBDAS, pick="check", rank=None):
    rows = []
    for lam in lambdas:
        fit = tr_ridge.fit_ridge(stats, lam, rank)
        scores = evaluate(fit, raws, cols, layers_r)
        rows.append((lam, scores, fit))
        log(f"  lambda {lam}: " + ", ".join(f"{n} K {s['k']:.3f} V {s['v']:.3f}" for n, s in scores.items()))
    lam, scores, fit = max(rows, key=lambda r: r[1][pick]["k"] + r[1][pick]["v"])
    return lam, scores, fit, [(r[0], {n: {"k": s["k"], "v": s["v"]} for n, s in r[1].items()}) for r in rows]


PILOT_LAYERS = sorted(set(range(0, 30, 2)) | set(tr.DEFAULT_SHARER_LAYERS))  # 21 sharer layers


def pilot(args) -> int:
    """Feature comparisons on the raw pilot sample, all from one set of sums over a superset of
    columns (aligned token at 21 sharer layers, the token before at the 11 default ones, the
    alignment numbers); held-out R^2 on the first ``--heldout-tokens`` of each held-out set."""
    raw_dir = Path(args.raw)
    train = Raw(raw_dir / "pilot.safetensors")
    layers_r = train.y.shape[1] // (2 * 256)
    per, default = train.per, list(tr.DEFAULT_SHARER_LAYERS)
    superset = train.columns(PILOT_LAYERS, 0, False) + train.columns(default, 1, True)[len(default) * per :]
    position = {c: i for i, c in enumerate(superset)}

    def where(layers, neighbours, alignment=True):
        return [position[c] for c in train.columns(layers, neighbours, alignment)]

    train.rows = min(args.pilot_tokens or train.rows, train.rows)
    saved = raw_dir / f"pilot-sums-{train.rows}.safetensors"
    if saved.is_file():
        stats = tr_ridge.RidgeStats.load(saved)
    else:
        log(f"sums over {train.rows} training tokens, {len(superset)} columns")
        stats = stats_from_raw(train, superset)
        stats.save(saved, {"columns": "PILOT superset"})
    held = {name: Raw(raw_dir / f"{name}.safetensors", rows=args.heldout_tokens) for name in ("check", "unseen")}
    configs = {
        "11 layers (0, 3, ..., 27, 29)": (default, 0, True),
        "11 layers, no alignment numbers": (default, 0, False),
        "11 layers + the sharer token before": (default, 1, True),
        "21 layers": (PILOT_LAYERS, 0, True),
        "early 7 (0, 2, 3, 4, 6, 8, 9)": ([0, 2, 3, 4, 6, 8, 9], 0, True),
        "middle 7 (10, 12, 14, 15, 16, 18, 20)": ([10, 12, 14, 15, 16, 18, 20], 0, True),
        "late 7 (21, 22, 24, 26, 27, 28, 29)": ([21, 22, 24, 26, 27, 28, 29], 0, True),
    }
    report = {"train_tokens": stats.n, "heldout_tokens": {n: h.rows for n, h in held.items()}, "configs": {}}

    def heldout_r2(fit, layers, neighbours, alignment):
        return evaluate(fit, held, train.columns(layers, neighbours, alignment), layers_r)

    for name, (layers, neighbours, alignment) in configs.items():
        cols = where(layers, neighbours, alignment)
        rows = []
        for lam in (0.01, 0.03, 0.1):
            fit = tr_ridge.fit_ridge(stats, lam, columns=cols)
            rows.append((lam, heldout_r2(fit, layers, neighbours, alignment)))
            log(f"{name}, lambda {lam}: " + ", ".join(f"{n} K {r['k']:.3f} V {r['v']:.3f}" for n, r in rows[-1][1].items()))
        lam, scores = max(rows, key=lambda r: r[1]["check"]["k"] + r[1]["check"]["v"])
        report["configs"][name] = {"layers": layers, "neighbours": neighbours, "alignment": alignment, "features": len(cols),
                                   "lambda": lam, "r2": scores, "sweep": [(l, {n: (r["k"], r["v"]) for n, r in s.items()}) for l, s in rows]}
        Path(args.out).write_text(json.dumps(report, indent=2))
    log("single sharer layers")
    matrix = {}
    for layer in PILOT_LAYERS:
        cols = where([layer], 0, True)
        fit = tr_ridge.fit_ridge(stats, 0.03, columns=cols)
        matrix[layer] = heldout_r2(fit, [layer], 0, True)["check"]
        log(f"  sharer layer {layer}: K {matrix[layer]['k']:.3f} V {matrix[layer]['v']:.3f}")
    report["single_sharer_layer_r2_check"] = matrix
    report["command"] = "python research/translator_fit.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def stats_command(args) -> int:
    """Ridge sums of a raw sample in a feature layout, saved like the extraction's (to merge)."""
    raw = Raw(Path(args.raw) / "pilot.safetensors")
    layers = [int(x) for x in args.layers.split(",")]
    stats = stats_from_raw(raw, raw.columns(layers, args.neighbours, True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"layers": layers, "neighbours": args.neighbours, "source": "raw pilot sample", "texts": int(raw.text.max()) + 1}
    stats.save(out / "stats.safetensors", meta)
    (out / "progress.json").write_text(json.dumps({"tokens": stats.n, **meta}, indent=2))
    log(f"{stats.n} tokens -> {out}")
    return 0


def pilot_stats(raw_dir: Path, layers, neighbours: int, tokens: int = 25000) -> tuple[tr_ridge.RidgeStats, dict]:
    """The pilot's sums (``pilot``'s superset) cut to one feature layout."""
    probe = Raw(raw_dir / "pilot.safetensors")
    default = list(tr.DEFAULT_SHARER_LAYERS)
    superset = probe.columns(PILOT_LAYERS, 0, False) + probe.columns(default, 1, True)[len(default) * probe.per :]
    position = {c: i for i, c in enumerate(superset)}
    stats = tr_ridge.RidgeStats.load(raw_dir / f"pilot-sums-{tokens}.safetensors")
    return stats.subset([position[c] for c in probe.columns(layers, neighbours, True)]), {"layers": layers, "neighbours": neighbours}


def fit(args) -> int:
    from kvviz.runtime.checkpoints import model_fingerprint

    if args.stats == "pilot":
        stats, progress = pilot_stats(Path(args.raw), [int(x) for x in args.layers.split(",")], args.neighbours)
    else:
        stats = tr_ridge.RidgeStats.load(Path(args.stats) / "stats.safetensors")
        progress = json.loads((Path(args.stats) / "progress.json").read_text())
    for extra in args.merge or []:
        stats.merge(tr_ridge.RidgeStats.load(Path(extra) / "stats.safetensors"))
    layers, neighbours = progress["layers"], progress["neighbours"]
    log(f"{stats.n} aligned tokens, layers {layers}, neighbours {neighbours}")
    raw_dir = Path(args.raw)
    held = {name: Raw(raw_dir / f"{name}.safetensors", rows=args.heldout_tokens) for name in ("check", "unseen")}
    cols = held["check"].columns(layers, neighbours, True)
    (sharer_facts, sharer_tokenizer), (receiver_facts, _) = prepared_facts("smollm2-135m"), prepared_facts("gemma3-270m")
    facts = (model_fingerprint(sharer_facts), model_fingerprint(receiver_facts))
    layers_r = receiver_facts.num_layers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lam, scores, full, sweep = best_lambda(stats, held, cols, layers_r, [float(x) for x in args.lambdas.split(",")])
    report = {"tokens": stats.n, "layers": layers, "neighbours": neighbours, "lambda": lam, "full": scores, "sweep": sweep, "ranks": {}}
    log(f"best lambda {lam}")
    ranks = [int(r) for r in args.ranks.split(",") if r]
    reduced = tr_ridge.fit_ridge(stats, lam, ranks=ranks) if ranks else {}
    for rank in ranks:
        fitted = reduced[rank]
        report["ranks"][rank] = evaluate(fitted, held, cols, layers_r)
        log(f"rank {rank}: " + ", ".join(f"{n} K {s['k']:.3f} V {s['v']:.3f}" for n, s in report["ranks"][rank].items()))
        translator = translator_for(facts, layers, neighbours, rank)
        tr_ridge.install_fit(translator, fitted)
        translator.config.sharer_start = tr_align.sharer_start_token(sharer_tokenizer)
        translator.config.training = {"stage": "ridge", "tokens": stats.n, "lambda": lam, "rank": rank,
                                      "r2": {n: {"k": s["k"], "v": s["v"]} for n, s in report["ranks"][rank].items()},
                                      "corpus": progress.get("corpus")}
        translator.save(out / f"rank{rank}", dtype=torch.float32)
    if args.save_full:
        translator = translator_for(facts, layers, neighbours, None)
        tr_ridge.install_fit(translator, full)
        translator.config.sharer_start = tr_align.sharer_start_token(sharer_tokenizer)
        translator.config.training = {"stage": "ridge", "tokens": stats.n, "lambda": lam, "rank": None,
                                      "r2": {n: {"k": s["k"], "v": s["v"]} for n, s in scores.items()}}
        translator.save(out / "full", dtype=torch.float32)
    report["command"] = "python research/translator_fit.py " + " ".join(sys.argv[1:])
    (out / "ridge.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "sweep"}, indent=2)[:4000])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("pilot", "fit", "stats"))
    parser.add_argument("--layers", default=",".join(map(str, tr.DEFAULT_SHARER_LAYERS)), help="stats: feature layers")
    parser.add_argument("--neighbours", type=int, default=1, help="stats: feature layout")
    parser.add_argument("--raw", default="runs/translator/raw")
    parser.add_argument("--stats", default=None)
    parser.add_argument("--merge", nargs="*", help="fit: more stats folders (other shards) to add")
    parser.add_argument("--lambdas", default=",".join(map(str, LAMBDAS)))
    parser.add_argument("--ranks", default="512")
    parser.add_argument("--save-full", action="store_true")
    parser.add_argument("--pilot-tokens", type=int, default=25000, help="pilot: training tokens used")
    parser.add_argument("--heldout-tokens", type=int, default=6000, help="pilot: tokens of each held-out set")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return {"pilot": pilot, "fit": fit, "stats": stats_command}[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
