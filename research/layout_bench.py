"""Run ``python -m kvviz bench`` with a candidate prompt layout for base (no chat template) models.

The project's prompt (``kvviz.core.prompts.render``) stays as it is in the code; this script changes it
for its own process only, so that a layout can be measured through the real benchmark before
anyone decides to adopt it. Every handoff reads its prompt through ``render``, so the change
reaches the receiver alone, Skyline, KVComm (its calibration sample too: the sender prefills the
new context segment, worked examples included) and the text handoff's receiver. Chat models
(SmolLM2, the sharer of the embedded pair) keep their template.

Layouts (the base model's context segment | query segment; today's is ``plain``):

* ``plain``:    ``<bos>Context: C\\n\\n`` | ``Question: Q\\nAnswer:`` (kvviz.core.prompts, unchanged)
* ``fewshot3``: ``<bos>`` + three worked examples in the same layout + ``Context: C\\n\\n`` |
  ``Question: Q\\nAnswer:``. The examples (``research/skyline_probe.py``, ``WORKED_EXAMPLES``) are
  part of the context segment: KVComm's sender prefills them with the context and sends them in
  the chosen layers, and the receiver alone reads them before its question.
* ``fewshot3-neutral``: the same with three examples that name no country (``NEUTRAL_EXAMPLES``).

C2C, AC and CIPHER are refused here: their token alignment and shipped fusers were built for
today's layout, so a number for them under another layout would not say what adopting it does.

    nice -n 10 python research/layout_bench.py --layout fewshot3 -- --pair embedded --dataset countries \\
        --handoffs receiver,skyline,kvcomm --ratios 0.3,0.5 --limit 100 --max-new-tokens 24 --threads 1 \\
        --out runs/layout-fewshot3-countries

Pair the rows of two runs with ``research/layout_compare.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from skyline_probe import NEUTRAL_EXAMPLES, worked_examples_text  # noqa: E402

PREFIXES = {"plain": "", "fewshot3": worked_examples_text(), "fewshot3-neutral": worked_examples_text(NEUTRAL_EXAMPLES)}
REFUSED = {"c2c", "c2c_control", "ac", "cipher"}


def use_layout(name: str) -> None:
    """Put the layout's prefix after the base model's ``<bos>`` in every prompt of this process."""
    import kvviz.core.prompts as prompts

    prefix = PREFIXES[name]
    if not prefix:
        return
    original = prompts.render

    def render(tokenizer, query, context=None, instruction=None, history=None):
        head, tail = original(tokenizer, query, context, instruction, history)
        if prompts.has_chat_template(tokenizer):
            return head, tail
        bos = tokenizer.bos_token or ""
        if not head.startswith(bos):
            raise RuntimeError("the base prompt no longer starts with <bos>: update research/layout_bench.py")
        return bos + prefix + head[len(bos):], tail

    # modules that imported ``render`` by name hold the original: give them the new one too
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("kvviz") and getattr(module, "render", None) is original:
            module.render = render


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", choices=sorted(PREFIXES), required=True)
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: the bench's own arguments")
    args = parser.parse_args()
    bench_args = [a for a in args.bench_args if a != "--"]
    if "--handoffs" in bench_args:
        names = set(bench_args[bench_args.index("--handoffs") + 1].split(","))
        if names & REFUSED or "all" in names:
            parser.error(f"layout runs take receiver, skyline, kvcomm, text, sharer only (not {sorted(names & REFUSED)})")
    import kvviz.handoffs  # noqa: F401   that imported render by name)
    import kvviz.handoffs.c2c.align  # noqa: F401  (imported before use_layout, so that it reaches every module

    use_layout(args.layout)
    from kvviz.cli import main as kvviz_main

    return kvviz_main(["bench", *bench_args])


if __name__ == "__main__":
    raise SystemExit(main())
