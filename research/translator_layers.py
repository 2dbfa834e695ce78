"""Which sharer layers feed each receiver layer: chosen by held-out R^2, against the shipped 21.

    python research/translator_layers.py select --raw runs/translator/raw --out runs/translator/layers --k 4
    python research/translator_layers.py fit --raw runs/translator/raw --layers runs/translator/layers --k 3 \\
        --out runs/translator/ridge-routed3

``select``: ridge sums over the raw pilot sample (``research/translator_extract.py raw``: the
aligned token at all 30 sharer layers, the alignment numbers), then for each receiver layer:

* the held-out R^2 (``check``: corpus text never fitted) of its keys and values from each single
  sharer layer (a 18 x 30 table);
* greedy forward selection: the sharer layer that adds most to the held-out R^2, up to ``--k``
  layers (the R^2 after each step on ``check`` and ``unseen``: held-out names, Countries and
  who-is-where landmarks);
* the shipped layout for comparison: one map from 21 sharer layers to every receiver layer, full
  and at rank 640.

Writes ``layers.json`` (the tables, the chosen sources per k) and the sums (``sums.safetensors``).
``fit``: the routed translator (one full map per receiver layer from its k chosen sharer layers,
``kvviz.handoffs.translate.translator.fit_ridge_routed``), lambda chosen on ``check``; saved as a
translator folder (float32) to start ``train-translator`` from.
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

SHIPPED_LAYERS = (0, 2, 3, 4, 6, 8, 9, 10, 12, 14, 15, 16, 18, 20, 21, 22, 24, 26, 27, 28, 29)
LAMBDAS = (0.01, 0.03, 0.1, 0.3)


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


class Raw:
    """A raw sample's aligned columns (all sharer layers, then the alignment numbers) and targets."""

    def __init__(self, path: Path, rows: int | None = None):
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            self.layout = json.loads(handle.metadata()["RAW_LAYOUT"])
            width = handle.get_slice("x").get_shape()[1]
            total = handle.get_slice("x").get_shape()[0]
            self.rows = total if rows is None else min(rows, total)
            self.per, self.layers = self.layout["per_layer"], self.layout["aligned_layers"]
            self.columns = list(range(self.layers * self.per)) + list(range(width - self.layout["alignment"], width))
            self.path = path

    def slices(self, chunk: int = 4096):
        from safetensors import safe_open

        index = torch.tensor(self.columns)
        with safe_open(str(self.path), "pt") as handle:
            for start in range(0, self.rows, chunk):
                end = min(start + chunk, self.rows)
                yield handle.get_slice("x")[start:end].index_select(1, index).float(), handle.get_slice("y")[start:end].float()

    def load(self) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*self.slices())
        return torch.cat(xs), torch.cat(ys)


def layer_columns(per: int, layers, alignment: bool = True, total_layers: int = 30) -> list[int]:
    """Columns of the aligned layout (all sharer layers, then 3 alignment numbers) for ``layers``."""
    cols = [c for layer in layers for c in range(layer * per, (layer + 1) * per)]
    return cols + (list(range(total_layers * per, total_layers * per + tr_align.ALIGNMENT_FEATURES)) if alignment else [])


class Moments:
    """Standardised second moments of the training sums, and the held-out sets z-scored with them."""

    def __init__(self, stats: tr_ridge.RidgeStats, held: dict):
        mx, sx, my, sy, corr_x, corr_xy = stats.moments()
        self.corr_x, self.corr_xy = corr_x.float(), corr_xy.float()  # float32: lambda >= 0.01 keeps the solves well posed
        del corr_x, corr_xy
        self.held = {name: (((x.double() - mx) / sx).float(), ((y.double() - my) / sy).float()) for name, (x, y) in held.items()}

    def solve(self, cols, outputs, lam: float) -> torch.Tensor:
        index, out = torch.tensor(cols), torch.tensor(outputs)
        block = self.corr_x[index][:, index]
        return torch.linalg.solve(block + lam * torch.eye(len(cols), dtype=block.dtype), self.corr_xy[index][:, out])

    def r2(self, weight, cols, outputs, name: str) -> tuple[float, float]:
        """Held-out R^2 of the keys' and the values' halves of ``outputs`` (pooled per half)."""
        z_x, z_y = self.held[name]
        truth = z_y[:, outputs]
        predicted = z_x[:, cols] @ weight
        err = ((predicted - truth) ** 2).sum(0)
        var = ((truth - truth.mean(0)) ** 2).sum(0)
        half = len(outputs) // 2
        return float(1 - err[:half].sum() / var[:half].sum()), float(1 - err[half:].sum() / var[half:].sum())


def receiver_outputs(layer: int, width: int = 512) -> list[int]:
    return list(range(layer * width, (layer + 1) * width))


def greedy(moments: Moments, per: int, sharer_layers: int, receiver_layer: int, k: int, lam: float) -> list[dict]:
    """Forward selection of sharer layers for one receiver layer by check R^2 (mean of K and V)."""
    chosen, steps = [], []
    outputs = receiver_outputs(receiver_layer)
    for _ in range(k):
        best = None
        for candidate in range(sharer_layers):
            if candidate in chosen:
                continue
            cols = layer_columns(per, chosen + [candidate], total_layers=sharer_layers)
            k_r2, v_r2 = moments.r2(moments.solve(cols, outputs, lam), cols, outputs, "check")
            if best is None or k_r2 + v_r2 > best[1]:
                best = (candidate, k_r2 + v_r2)
        chosen.append(best[0])
        cols = layer_columns(per, chosen, total_layers=sharer_layers)
        weight = moments.solve(cols, outputs, lam)
        steps.append({"layers": list(chosen), **{name: moments.r2(weight, cols, outputs, name) for name in moments.held}})
    return steps


def pooled(per_layer: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean over receiver layers of the K and the V R^2 (the layers' z-scored targets weigh alike)."""
    return (round(sum(k for k, _ in per_layer) / len(per_layer), 4), round(sum(v for _, v in per_layer) / len(per_layer), 4))


def sums(raw_dir: Path, out: Path, tokens: int) -> tr_ridge.RidgeStats:
    saved = out / "sums.safetensors"
    if saved.is_file():
        return tr_ridge.RidgeStats.load(saved)
    pilot = Raw(raw_dir / "pilot.safetensors", rows=tokens)
    stats = None
    for x, y in pilot.slices():
        stats = stats or tr_ridge.RidgeStats(x.shape[1], y.shape[1])
        stats.add(x, y)
        log(f"sums: {stats.n} of {pilot.rows} tokens")
    stats.save(saved, {"tokens": stats.n})
    return stats


def shipped_layout(moments: Moments, per: int, sharer_layers: int, receiver_layers: int, lam: float) -> dict:
    """The shipped layout's R^2 per receiver layer: one map from 21 sharer layers (full rank)."""
    cols = layer_columns(per, SHIPPED_LAYERS, total_layers=sharer_layers)
    out = {}
    for name in moments.held:
        per_layer = []
        for layer in range(receiver_layers):
            outputs = receiver_outputs(layer)
            per_layer.append(moments.r2(moments.solve(cols, outputs, lam), cols, outputs, name))
        out[name] = {"pooled": pooled(per_layer), "layers": [(round(k, 3), round(v, 3)) for k, v in per_layer]}
    return out


def select(args) -> int:
    out, raw_dir = Path(args.out), Path(args.raw)
    out.mkdir(parents=True, exist_ok=True)
    stats = sums(raw_dir, out, args.tokens)
    held = {name: Raw(raw_dir / f"{name}.safetensors", rows=args.heldout_tokens).load() for name in ("check", "unseen")}
    probe = Raw(raw_dir / "check.safetensors", rows=1)
    per, sharer_layers = probe.per, probe.layers
    receiver_layers = stats.xty.shape[1] // 512
    report = {"tokens": stats.n, "heldout_tokens": {n: h[0].shape[0] for n, h in held.items()}}
    moments = Moments(stats, held)
    del stats
    log("single sharer layers")
    single = [[moments.r2(moments.solve(layer_columns(per, [s], total_layers=sharer_layers), receiver_outputs(r), args.lam),
                          layer_columns(per, [s], total_layers=sharer_layers), receiver_outputs(r), "check")
               for s in range(sharer_layers)] for r in range(receiver_layers)]
    report["single_check"] = [[round((k + v) / 2, 3) for k, v in row] for row in single]
    report["single_best"] = [max(range(sharer_layers), key=lambda s, row=row: sum(row[s])) for row in single]
    log("greedy selection")
    report["greedy"] = []
    for r in range(receiver_layers):
        report["greedy"].append(greedy(moments, per, sharer_layers, r, args.k, args.lam))
        log(f"receiver layer {r}: {report['greedy'][-1][-1]['layers']} check {report['greedy'][-1][-1]['check']}")
    report["by_k"] = {}
    for k in range(1, args.k + 1):
        report["by_k"][k] = {name: pooled([tuple(report["greedy"][r][k - 1][name]) for r in range(receiver_layers)])
                             for name in moments.held}
        report["by_k"][k]["sources"] = [report["greedy"][r][k - 1]["layers"] for r in range(receiver_layers)]
    log("the shipped layout: 21 sharer layers into every receiver layer")
    report["shipped_21"] = shipped_layout(moments, per, sharer_layers, receiver_layers, args.lam_shipped)
    report["lambda"], report["lambda_shipped"] = args.lam, args.lam_shipped
    report["command"] = "python research/translator_layers.py " + " ".join(sys.argv[1:])
    (out / "layers.json").write_text(json.dumps(report, indent=1))
    log(json.dumps({k: report["by_k"][k] for k in report["by_k"]}) + " shipped " + json.dumps(
        {n: v["pooled"] for n, v in report["shipped_21"].items()}))
    return 0


def fit(args) -> int:
    from kvviz.runtime.checkpoints import model_fingerprint

    layers_dir, raw_dir, out = Path(args.layers), Path(args.raw), Path(args.out)
    report = json.loads((layers_dir / "layers.json").read_text())
    sources = report["by_k"][str(args.k)]["sources"]
    union = sorted({s for chosen in sources for s in chosen})
    stats = tr_ridge.RidgeStats.load(layers_dir / "sums.safetensors")
    probe = Raw(raw_dir / "check.safetensors", rows=1)
    stats = stats.subset(layer_columns(probe.per, union, total_layers=probe.layers))
    (sharer_facts, sharer_tokenizer), (receiver_facts, _) = prepared_facts("smollm2-135m"), prepared_facts("gemma3-270m")
    config = tr.TranslatorConfig(sharer=model_fingerprint(sharer_facts), receiver=model_fingerprint(receiver_facts), pair="embedded",
                                 sharer_layers=union, sources=sources, sharer_start=tr_align.sharer_start_token(sharer_tokenizer))
    held = {}
    for name in ("check", "unseen"):
        x, y = Raw(raw_dir / f"{name}.safetensors", rows=args.heldout_tokens).load()
        held[name] = (x[:, layer_columns(probe.per, union, total_layers=probe.layers)], y)
    results = []
    for lam in LAMBDAS:
        translator = tr.KVTranslator(config)
        tr_ridge.install_fit(translator, tr_ridge.fit_ridge_routed(stats, config, lam))
        scores = {name: tr_ridge.r_squared(translator, x, y, receiver_facts.num_layers) for name, (x, y) in held.items()}
        log(f"lambda {lam}: " + ", ".join(f"{n} K {s['k']:.3f} V {s['v']:.3f}" for n, s in scores.items()))
        results.append((scores["check"]["k"] + scores["check"]["v"], lam, scores, translator))
    _, lam, scores, translator = max(results, key=lambda item: item[0])
    translator.config.training = {"stage": "ridge (per receiver layer, its sharer layers by held-out R^2)", "tokens": stats.n,
                                  "lambda": lam, "k": args.k,
                                  "r2": {n: {"k": round(s["k"], 4), "v": round(s["v"], 4)} for n, s in scores.items()},
                                  "command": "python research/translator_layers.py " + " ".join(sys.argv[1:])}
    translator.save(out, dtype=torch.float32)
    log(f"saved {out}: lambda {lam}, {translator.num_parameters:,} parameters, "
        f"{translator.num_parameters * 2 / 1e6:.1f} MB in float16")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("select", "fit"))
    parser.add_argument("--raw", default="runs/translator/raw")
    parser.add_argument("--layers", default="runs/translator/layers", help="fit: the select folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--k", type=int, default=4, help="select: sharer layers per receiver layer at most; fit: how many")
    parser.add_argument("--tokens", type=int, default=40000, help="select: training tokens of the pilot sample")
    parser.add_argument("--heldout-tokens", type=int, default=3000)
    parser.add_argument("--lam", type=float, default=0.03, help="select: ridge lambda of the per-layer maps")
    parser.add_argument("--lam-shipped", type=float, default=0.1, help="select: lambda of the 21-layer map (the shipped one's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return {"select": select, "fit": fit}[args.mode](args)


if __name__ == "__main__":
    raise SystemExit(main())
