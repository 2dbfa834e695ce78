"""A markdown table of train-fuser runs: held-out NLL, the communication measure, the gates.

Reads what ``python -m kvviz train-fuser ... --measure N --out DIR`` leaves in each DIR
(``summary_<kind>.json``, ``<kind>/config.json``, and ``command.txt`` when the run was started with
one written beside it) and prints one row per fuser. docs/C2C.md quotes:

    python research/c2c_runs_table.py runs/A_aware runs/B_plain runs/C_nat_tmpl_aware runs/D_nat_tmpl_plain runs/E_gemma_self
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(folder: Path):
    for kind in ("c2c", "control"):
        summary_path = folder / f"summary_{kind}.json"
        if not summary_path.is_file():
            continue
        summary = json.loads(summary_path.read_text())
        config = json.loads((folder / kind / "config.json").read_text())
        trained = config.get("training", {})
        measured = summary.get("communication") or {}
        logits = [abs(x) for layer in summary.get("gate_logits", []) for x in layer]
        yield {
            "run": folder.name, "kind": kind, "pair": trained.get("pair", config.get("pair", "")), "steps": trained.get("steps"),
            "width": config.get("width"), "rope": config.get("rope", "plain"), "fuse": config.get("fuse", "kv"),
            "alignment": config.get("token_alignment", "longest") + (" + template" if config.get("fuse_template") else ""),
            "receiver": summary.get("receiver_heldout_nll"), "right": summary.get("heldout_nll"),
            "other": (measured.get("nll") or {}).get("other"), "zero": (measured.get("nll") or {}).get("zero"),
            "gain": measured.get("gain"), "ci95": measured.get("ci95"), "examples": measured.get("examples"),
            "open": summary.get("open_gates", {}), "max_logit": max(logits) if logits else None,
            "train_s": trained.get("train_seconds"),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="train-fuser output folders")
    args = parser.parse_args()
    number = lambda x, spec=".3f": "-" if x is None else format(x, spec)  # noqa: E731
    print("| run | kind | steps | W | rope | tokens | NLL receiver | NLL C2C (right context) | NLL other context | NLL sharer zeroed "
          "| gain | 95% CI | examples | open K/V of 18 | max abs gate logit | train s |")
    print("|" + "---|" * 16)
    for folder in args.runs:
        for r in rows(Path(folder)):
            ci = "-" if not r["ci95"] else f"[{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"
            print(
                f"| {r['run']} | {r['kind']} | {r['steps']} | {r['width']} | {r['rope']} | {r['alignment']} | {number(r['receiver'])} "
                f"| {number(r['right'])} | {number(r['other'])} | {number(r['zero'])} | {number(r['gain'], '+.3f')} | {ci} "
                f"| {r['examples'] or '-'} | {r['open'].get('k')}/{r['open'].get('v')} | {number(r['max_logit'])} | {number(r['train_s'], '.0f')} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
