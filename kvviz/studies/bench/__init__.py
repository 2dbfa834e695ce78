"""The benchmark: handoffs x a dataset -> one CSV row per sample and handoff, a summary, figures.

``python -m kvviz bench --pair embedded --dataset countries --handoffs receiver,skyline,text,kvcomm
--ratios 0.3,0.5 --limit 40 --out DIR`` writes into DIR:

* ``rows.csv`` (or ``rows.part-R-of-W.csv`` per process when the run is split): one row per sample
  and handoff variant: the answer, every correctness metric, every stage time, time to first
  token, bytes communicated, FLOPs per model. Rows are appended and flushed as they are produced,
  so an interrupted run resumes where it stopped (pairs of sample and variant already in any part
  file are skipped).
* ``summary.csv`` and ``summary.md``: per variant, accuracy with 95% Wilson intervals for every
  metric, mean and median latency per stage, bytes and FLOPs.
* ``figures.html``: plotly figures (accuracy with intervals, latency per stage, accuracy against
  bytes communicated).
* ``config.json``: the settings; a resumed run must use the same ones.

Four rooms: ``run`` (variants, requests, the resumable loop, the split over processes),
``rows`` (the CSV on disk), ``scoring`` (correctness and the multiple-choice likelihood),
``summary`` (per-variant statistics, markdown, figures); ``report`` writes docs/RESULTS.md from
several runs. Handoffs, their options and their variants come from the registry.

GPUs: ``accelerate launch --multi_gpu --num_processes N -m kvviz bench ...`` (each process uses
``cuda:LOCAL_RANK``). CPU: ``torchrun --standalone --nproc_per_node N -m kvviz bench ...``
(``accelerate launch --cpu`` starts a single process in accelerate 1.15). ``--summarize`` rebuilds
the summary from whatever part files DIR holds. ``--perf`` runs the performance comparison
instead (see ``kvviz.studies.perf``).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvviz.engine import flags
from kvviz.handoffs import registry
from kvviz.studies import perf
from kvviz.studies.bench.rows import row_files
from kvviz.studies.bench.run import run_bench
from kvviz.studies.bench.summary import write_summary


def configure_parser(parser) -> None:
    flags.add_model_arguments(parser)
    parser.add_argument("--dataset", default="countries", help="a registered dataset name or a JSONL file")
    parser.add_argument("--dataset-option", action="append", default=None, metavar="KEY=VALUE",
                        help="loader option, e.g. with_fact=true (openbookqa), all_paragraphs=true (hotpotqa)")
    parser.add_argument("--handoffs", default=",".join(registry.default_handoffs()),
                        help="comma-separated, or all (default: the page's columns shown at first): " + ", ".join(registry.HANDOFFS))
    parser.add_argument("--limit", type=int, default=40,
                        help="number of scored samples (after the seeded shuffle; with KVComm, its calibration sample, the first, comes on top)")
    parser.add_argument("--seed", type=int, default=0, help="sample order, random choices and sampling")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="take the first --limit samples in file order")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--no-likelihood", action="store_true", help="skip the multiple-choice likelihood column")
    parser.add_argument("--swap", action="store_true",
                        help="content or prompt? every sample also runs on its swapped note (the answer-bearing fact "
                             "changed: countries, recall, hotpotqa); the summary adds each handoff's follow rate, keep "
                             "rate and content share, paired against Skyline and the receiver alone"),
    parser.add_argument("--contradict", action="store_true",
                        help="a second counterfactual: every sample also runs on its note with one contradicting sentence "
                             "(the swap's other value) inserted after the sentence that states the answer; the summary adds "
                             "which answer each handoff gives and the gold and counter answers' first-token probabilities")
    parser.add_argument("--out", default=None, help="output folder (default runs/bench-DATASET)")
    parser.add_argument("--fresh", action="store_true", help="delete earlier rows in --out instead of resuming")
    parser.add_argument("--redo", default=None, metavar="VARIANTS",
                        help="run these variants again (e.g. c2c,kvcomm@0.3): their rows in --out are removed first")
    parser.add_argument("--summarize", action="store_true", help="only rebuild the summary from the rows in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or printed table")
    parser.add_argument("--perf", action="store_true", help="run the performance comparison instead (kvviz.studies.perf)")
    parser.add_argument("--json", action="store_true", help="--perf: print JSON")
    parser.add_argument("--lengths", default="128,256,512,1024,2048", help="--perf: context lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="--perf: repeats per measurement")
    parser.add_argument(
        "--speed-only", action="store_true",
        help="--perf: only the speed table (each model's decode and prefill beside the machine's limits, the warm full run)",
    )
    parser.add_argument("--no-page", action="store_true",
                        help="--perf --speed-only: leave out the warm run through the page (python app.py)")
    flags.add_option_arguments(parser, swept=True)


def main(args) -> int:
    flags.apply_threads(args)
    if args.perf:
        return perf.main(args)
    if args.out is None:
        args.out = str(Path("runs") / f"bench-{Path(args.dataset).stem}")
    if args.summarize:
        out = Path(args.out)
        if not row_files(out):
            raise FileNotFoundError(f"no rows*.csv in {out}")
        order = None
        if (out / "config.json").exists():
            order = json.loads((out / "config.json").read_text(encoding="utf-8")).get("variants")
        write_summary(out, order, title=f"{args.dataset} on pair {args.pair}")
        print((out / "summary.md").read_text(encoding="utf-8"))
        return 0
    return run_bench(args)
