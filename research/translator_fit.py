"""Stage 1 of the KV translator: closed-form ridge, its comparisons and its held-out R^2.

    # which features: sharer layers, the token before, the alignment numbers (raw pilot samples)
    python research/translator_fit.py pilot --raw /work/translator-runs/raw --out /work/translator-runs/pilot.json
    # the map from the corpus's ridge sums: lambda chosen on held-out text, full and reduced rank
    python research/translator_fit.py fit --stats /work/translator-runs/stats-n1 --raw /work/translator-runs/raw \\
        --ranks 256,512,768 --out /work/translator-runs/ridge-n1

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

from kvviz import translator as tr  # noqa: E402

LAMBDAS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


class Raw:
    """A raw sample (float16 on disk) and the column layout of its features."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            self.layout = json.loads(handle.metadata()["RAW_LAYOUT"])
            self.x = handle.get_tensor("x")
            self.y = handle.get_tensor("y")
            self.text = handle.get_tensor("text")
        self.per = self.layout["per_layer"]

    def columns(self, layers, neighbours: int, alignment: bool = True) -> list[int]:
        """Raw columns in ``kvviz.translator.features`` order for this configuration."""
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
            cols += range(self.x.shape[1] - self.layout["alignment"], self.x.shape[1])
        return cols

    def features(self, cols) -> torch.Tensor:
        return self.x[:, cols].float()


def stats_from_raw(raw: Raw, cols, chunk: int = 4096) -> tr.RidgeStats:
    stats = tr.RidgeStats(len(cols), raw.y.shape[1])
    index = torch.tensor(cols)
    for start in range(0, raw.x.shape[0], chunk):
        stats.add(raw.x[start : start + chunk].index_select(1, index).float(), raw.y[start : start + chunk].float())
    return stats


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
        fit = tr.fit_ridge(stats, lam, rank)
        scores = evaluate(fit, raws, cols, layers_r)
        rows.append((lam, scores, fit))
        log(f"  lambda {lam}: " + ", ".join(f"{n} K {s['k']:.3f} V {s['v']:.3f}" for n, s in scores.items()))
    lam, scores, fit = max(rows, key=lambda r: r[1][pick]["k"] + r[1][pick]["v"])
    return lam, scores, fit, [(r[0], {n: {"k": s["k"], "v": s["v"]} for n, s in r[1].items()}) for r in rows]


def pilot(args) -> int:
    raw_dir = Path(args.raw)
    train = Raw(raw_dir / "pilot.safetensors")
    held = {"check": Raw(raw_dir / "check.safetensors"), "unseen": Raw(raw_dir / "unseen.safetensors")}
    layers_r = train.y.shape[1] // (2 * 256)
    default = list(tr.DEFAULT_SHARER_LAYERS)
    configs = {
        "11 layers": (default, 0, True),
        "11 layers, no alignment numbers": (default, 0, False),
        "11 layers + the token before": (default, 1, True),
        "16 layers (even + 29)": (list(range(0, 30, 2)) + [29], 0, True),
        "last 6 layers (24-29)": (list(range(24, 30)), 0, True),
        "first 6 layers (0-5)": (list(range(0, 6)), 0, True),
        "4 layers (0, 9, 18, 27)": ([0, 9, 18, 27], 0, True),
    }
    report = {"train_tokens": train.x.shape[0], "heldout_tokens": {n: r.x.shape[0] for n, r in held.items()}, "configs": {}}
    for name, (layers, neighbours, alignment) in configs.items():
        log(f"{name}")
        cols = train.columns(layers, neighbours, alignment)
        stats = stats_from_raw(train, cols)
        lam, scores, _, sweep = best_lambda(stats, held, cols, layers_r)
        report["configs"][name] = {"layers": layers, "neighbours": neighbours, "alignment": alignment, "features": len(cols),
                                   "lambda": lam, "r2": scores, "sweep": sweep}
        Path(args.out).write_text(json.dumps(report, indent=2))
    # which sharer layer feeds each receiver layer: R^2 of a ridge map from that one sharer layer
    log("single sharer layers")
    matrix = {}
    for layer in range(train.layout["aligned_layers"]):
        cols = train.columns([layer], 0, True)
        stats = stats_from_raw(train, cols)
        fit = tr.fit_ridge(stats, 0.03)
        scores = evaluate(fit, {"check": held["check"]}, cols, layers_r)["check"]
        matrix[layer] = {"k_layers": scores["k_layers"], "v_layers": scores["v_layers"]}
        log(f"  sharer layer {layer}: K {scores['k']:.3f} V {scores['v']:.3f}")
    report["single_sharer_layer_r2_check"] = matrix
    report["command"] = "python research/translator_fit.py pilot --raw " + args.raw + " --out " + args.out
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


def fit(args) -> int:
    from kvviz.engine import load_pair
    from kvviz.fuser import model_fingerprint

    stats = tr.RidgeStats.load(Path(args.stats) / "stats.safetensors")
    progress = json.loads((Path(args.stats) / "progress.json").read_text())
    for extra in args.merge or []:
        stats.merge(tr.RidgeStats.load(Path(extra) / "stats.safetensors"))
    layers, neighbours = progress["layers"], progress["neighbours"]
    log(f"{stats.n} aligned tokens, layers {layers}, neighbours {neighbours}")
    raw_dir = Path(args.raw)
    held = {"check": Raw(raw_dir / "check.safetensors"), "unseen": Raw(raw_dir / "unseen.safetensors")}
    cols = held["check"].columns(layers, neighbours, True)
    pair = load_pair("embedded", "cpu", None, progress=lambda message: None)
    facts = (model_fingerprint(pair.sharer.facts), model_fingerprint(pair.receiver.facts))
    layers_r = pair.receiver.facts.num_layers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lam, scores, full, sweep = best_lambda(stats, held, cols, layers_r, [float(x) for x in args.lambdas.split(",")])
    report = {"tokens": stats.n, "layers": layers, "neighbours": neighbours, "lambda": lam, "full": scores, "sweep": sweep, "ranks": {}}
    log(f"best lambda {lam}")
    for rank in [int(r) for r in args.ranks.split(",") if r]:
        fitted = tr.fit_ridge(stats, lam, rank)
        report["ranks"][rank] = evaluate(fitted, held, cols, layers_r)
        log(f"rank {rank}: " + ", ".join(f"{n} K {s['k']:.3f} V {s['v']:.3f}" for n, s in report["ranks"][rank].items()))
        translator = translator_for(facts, layers, neighbours, rank)
        tr.install_fit(translator, fitted)
        translator.config.sharer_start = tr.sharer_start_token(pair.sharer.tokenizer)
        translator.config.training = {"stage": "ridge", "tokens": stats.n, "lambda": lam, "rank": rank,
                                      "r2": {n: {"k": s["k"], "v": s["v"]} for n, s in report["ranks"][rank].items()},
                                      "corpus": progress.get("corpus")}
        translator.save(out / f"rank{rank}", dtype=torch.float32)
    if args.save_full:
        translator = translator_for(facts, layers, neighbours, None)
        tr.install_fit(translator, full)
        translator.config.sharer_start = tr.sharer_start_token(pair.sharer.tokenizer)
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
    parser.add_argument("--raw", default="/work/translator-runs/raw")
    parser.add_argument("--stats", default=None)
    parser.add_argument("--merge", nargs="*", help="fit: more stats folders (other shards) to add")
    parser.add_argument("--lambdas", default=",".join(map(str, LAMBDAS)))
    parser.add_argument("--ranks", default="512")
    parser.add_argument("--save-full", action="store_true")
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return {"pilot": pilot, "fit": fit, "stats": stats_command}[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
