"""Prompt layouts for a base (no chat template) receiver, measured without changing kvviz's own.

The project's prompt (``kvviz.core.prompts.render``) stays as it is in the code; the ``bench`` and
``run`` commands change it for their own process only, so that a layout can be measured through
the real benchmark before anyone decides to adopt it. Four commands (each ``--help`` has its
options):

* ``probe``: why does a reference answer go wrong? One context question on the receiver model,
  per prompt layout (``LAYOUTS``), for the receiver reading the context (Skyline's prompt) and
  alone: the answer of kvviz's decode loop (fast greedy head), the same with the exact head
  (``KVVIZ_FAST_HEAD=0`` does this for a whole run), and transformers' own ``generate`` on the
  same prompt (greedy, no kvviz code in the loop): if these agree, the answer is the model's; the
  first answer token's top candidates with their probabilities; the log-likelihood of each
  candidate answer given the prompt (summed over its tokens), so a learner sees by how much the
  model prefers one answer over another; how the prompt's tokens split up, and the project's
  metrics (token F1 > 0.5, containment) of the answer against the gold answers. ``fewshot3``
  puts three worked examples (written for kvviz, none from a dataset or preset) in front of the
  plain layout, ``fewshot3-neutral`` three with no country in them.

      python research/layout_bench.py probe --context "Kofi is standing under Big Ben." \\
          --query "Which country is Kofi in?" --gold "United Kingdom,UK,England,Britain" \\
          --candidates " The United Kingdom., The United States., United Kingdom, England, London"

* ``bench``: ``python -m kvviz bench`` with a candidate layout. Every handoff reads its prompt
  through ``render``, so the change reaches the receiver alone, Skyline, KVComm (its calibration
  sample too: the sender prefills the new context segment, worked examples included) and the
  text handoff's receiver. Chat models (SmolLM2, the sharer of the embedded pair) keep their
  template. Layouts (the base model's context segment | query segment; today's is ``plain``):

  - ``plain``:    ``<bos>Context: C\\n\\n`` | ``Question: Q\\nAnswer:`` (kvviz.core.prompts, unchanged)
  - ``fewshot3``: ``<bos>`` + three worked examples in the same layout + ``Context: C\\n\\n`` |
    ``Question: Q\\nAnswer:``. The examples (``WORKED_EXAMPLES``) are part of the context segment:
    KVComm's sender prefills them with the context and sends them in the chosen layers, and the
    receiver alone reads them before its question.
  - ``fewshot3-neutral``: the same with three examples that name no country (``NEUTRAL_EXAMPLES``).

  C2C, AC and CIPHER are refused: their token alignment and shipped fusers were built for today's
  layout, so a number for them under another layout would not say what adopting it does.

      nice -n 10 python research/layout_bench.py bench --layout fewshot3 -- --pair embedded \\
          --dataset countries --handoffs receiver,skyline,kvcomm --ratios 0.3,0.5 --limit 100 \\
          --max-new-tokens 24 --threads 1 --out runs/layout-fewshot3-countries

* ``compare``: two benchmark runs of the same samples under two layouts, paired. Per variant
  (receiver, skyline, kvcomm@R ...): accuracy of each run by both of the project's metrics (token
  F1 > 0.5, the benchmark's ``correct``; and "contains a gold answer"), the samples only one run
  got right and McNemar's exact p, empty answers, the median answer length in words, how many
  answers repeat a worked example's answer where the gold answer is something else (the few-shot
  layout's copying risk), and the median prefill times of the second run over the first
  (receiver prefill; KVComm's sender prefill), measured in the two runs: compare them only when
  both ran side by side on the same machine.

      python research/layout_bench.py compare runs/layout-plain-countries runs/layout-fewshot3-countries

* ``run``: another research script under a layout, in this process (its ``__main__``), with the
  same refusal as ``bench`` for the handoffs it names; the preset candidates, for instance:

      python research/layout_bench.py run --layout fewshot3 research/preset_candidates.py -- \\
          --handoffs receiver,text,kvcomm,skyline,sharer --no-layers --out runs/preset-candidates-fewshot3.json

(``probe`` was research/skyline_probe.py, ``compare`` research/layout_compare.py.)
"""

from __future__ import annotations

import argparse
import os
import runpy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Three worked examples (written for kvviz): a place, a number, a person; none is a preset or a
# dataset record. Used by the few-shot layouts of ``probe``, ``bench`` and ``run``.
WORKED_EXAMPLES = (
    ("Priya is reading a book in the Louvre.", "Which country is Priya in?", "France"),
    ("The bus to the airport leaves from stop 7 at 6:40.", "When does the bus to the airport leave?", "6:40"),
    ("Tomas painted the fence, and his sister Ines fixed the gate.", "Who fixed the gate?", "Ines"),
)


# The same number of examples with no country in them (is a copied "France" the example's fault?).
NEUTRAL_EXAMPLES = (
    ("The bus to the airport leaves from stop 7 at 6:40.", "When does the bus to the airport leave?", "6:40"),
    ("Tomas painted the fence, and his sister Ines fixed the gate.", "Who fixed the gate?", "Ines"),
    ("Ravi keeps his bike in the shed behind the library.", "Where does Ravi keep his bike?", "In the shed behind the library"),
)


def worked_examples_text(examples=WORKED_EXAMPLES) -> str:
    return "".join(f"Context: {c}\n\nQuestion: {q}\nAnswer: {a}\n\n" for c, q, a in examples)


# ``probe``'s layouts: (prefix, context part, query part); {C} context, {Q} question. The context
# part is left out for the receiver alone.
LAYOUTS = {
    "plain": ("", "Context: {C}\n\n", "Question: {Q}\nAnswer:"),  # today's base layout (kvviz.core.prompts)
    "fewshot3": (worked_examples_text(), "Context: {C}\n\n", "Question: {Q}\nAnswer:"),
    "fewshot3-neutral": (worked_examples_text(NEUTRAL_EXAMPLES), "Context: {C}\n\n", "Question: {Q}\nAnswer:"),
    "instructed": ("", "Context: {C}\n\n", "Question: {Q}\nAnswer briefly.\nAnswer:"),
    "fact-first": ("", "{C}\n\n", "Question: {Q}\nAnswer:"),
}


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


def probe(args) -> int:
    """One context question on the receiver per prompt layout (the module's docstring)."""
    import torch

    from kvviz.core.prompts import encode
    from kvviz.core.results import GenerationSettings
    from kvviz.data import contains_answer, f1_match
    from kvviz.runtime.cache import KVState
    from kvviz.runtime.decode import full_logits, generate, prefill
    from kvviz.runtime.models import load_model

    torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    tokenizer = model.tokenizer
    bos = tokenizer.bos_token or ""
    golds = [g.strip() for g in args.gold.split(",") if g.strip()]
    candidates = [c for c in args.candidates.split(",") if c.strip()]
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens)

    def kvviz_answer(ids: list[int], fast: bool) -> str:
        model._head = None  # the head object reads the switch when it is made
        previous = os.environ.get("KVVIZ_FAST_HEAD")
        os.environ["KVVIZ_FAST_HEAD"] = "1" if fast else "0"
        try:
            state = KVState()
            first, _ = prefill(model, state, ids)
            return generate(model, state, first, settings).text
        finally:
            model._head = None
            if previous is None:
                os.environ.pop("KVVIZ_FAST_HEAD")
            else:
                os.environ["KVVIZ_FAST_HEAD"] = previous

    def hf_answer(ids: list[int]) -> str:
        """transformers' own greedy generate (eager attention as loaded), first line as kvviz keeps it."""
        output = model.model.generate(torch.tensor([ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                      eos_token_id=sorted(_stop_ids(tokenizer)), pad_token_id=tokenizer.pad_token_id)
        text = tokenizer.decode(output[0, len(ids):], skip_special_tokens=True)
        return text.lstrip().split("\n", 1)[0].strip()

    def log_likelihood(ids: list[int], answer: str) -> float:
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        logits = full_logits(model, KVState(), ids + answer_ids)
        logprobs = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
        return float(sum(logprobs[i, token] for i, token in enumerate(answer_ids)))

    def top_first(ids: list[int]) -> str:
        logits = full_logits(model, KVState(), ids)[-1]
        probs = torch.softmax(logits, dim=-1)
        values, indices = torch.topk(probs, args.top)
        return ", ".join(f"{tokenizer.decode([int(i)])!r} {float(v):.3f}" for v, i in zip(values, indices))

    print(f"model {args.model}; context {args.context!r}; question {args.query!r}; gold {golds}")
    for name in args.layouts.split(","):
        prefix, context_part, query_part = LAYOUTS[name]
        for who, text in (
            ("skyline", bos + prefix + context_part.format(C=args.context) + query_part.format(Q=args.query)),
            ("receiver alone", bos + prefix + query_part.format(Q=args.query)),
        ):
            ids = encode(tokenizer, text)
            fast, exact, hf = kvviz_answer(ids, True), kvviz_answer(ids, False), hf_answer(ids)
            print(f"\n[{name}] {who}: {len(ids)} prompt tokens")
            print(f"  kvviz fast head : {fast!r}")
            print(f"  kvviz exact head: {exact!r}" + ("" if exact == fast else "   <- differs"))
            print(f"  transformers    : {hf!r}" + ("" if hf == exact else "   <- differs"))
            if golds:
                print(f"  metric: F1>0.5 {f1_match(exact, golds)}, contains gold {contains_answer(exact, golds)}")
            print(f"  first token top-{args.top}: {top_first(ids)}")
            for candidate in candidates:
                print(f"  log p({candidate!r}) = {log_likelihood(ids, candidate):.2f}")
        if name == "plain":
            ids = encode(tokenizer, bos + context_part.format(C=args.context) + query_part.format(Q=args.query))
            pieces = [tokenizer.decode([i]) for i in ids]
            print(f"  tokens: {pieces}")
    return 0


def _stop_ids(tokenizer) -> set[int]:
    from kvviz.core.prompts import stop_token_ids

    return stop_token_ids(tokenizer)


def compare(args) -> int:
    """Two layout runs of the same samples paired per variant (the module's docstring)."""
    from kvviz.data import mcnemar_exact, normalize_answer
    from kvviz.studies.bench.rows import read_rows

    first, second = read_rows(args.first), read_rows(args.second)
    merged = first.merge(second, on=["dataset", "sample_id", "variant"], suffixes=("_a", "_b"))
    examples = {normalize_answer(answer) for _, _, answer in WORKED_EXAMPLES + NEUTRAL_EXAMPLES}
    print(f"A = {args.first}, B = {args.second}; {merged['sample_id'].nunique()} samples in both\n")
    print("| variant | n | A F1>0.5 | B F1>0.5 | only A | only B | McNemar p | A contains | B contains | only A | only B | "
          "McNemar p | empty A / B | words A / B | copies an example A / B | prefill B/A |")
    print("|" + "---|" * 16)
    for variant, rows in merged.groupby("variant", sort=False):
        cells = [variant, str(len(rows))]
        for metric in ("correct_f1", "correct_contains"):
            a, b = rows[f"{metric}_a"].astype(int), rows[f"{metric}_b"].astype(int)
            only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
            cells += [f"{a.mean():.2f}", f"{b.mean():.2f}"] if metric == "correct_f1" else [f"{a.mean():.2f}", f"{b.mean():.2f}"]
            cells += [str(only_a), str(only_b), f"{mcnemar_exact(only_a, only_b):.3g}"]
        answers_a, answers_b = rows["answer_a"].fillna("").astype(str), rows["answer_b"].fillna("").astype(str)
        empty = f"{int((answers_a.str.strip() == '').sum())} / {int((answers_b.str.strip() == '').sum())}"
        words = f"{statistics.median(len(x.split()) for x in answers_a):g} / {statistics.median(len(x.split()) for x in answers_b):g}"

        def copies(answers) -> int:
            return sum(1 for answer, gold in zip(answers, rows["gold_a"].fillna("").astype(str))
                       if normalize_answer(answer) in examples and normalize_answer(answer) not in
                       {normalize_answer(g) for g in gold.split(" | ")})

        stage = "time_sharer_prefill" if variant.startswith("kvcomm") else "time_receiver_prefill"
        ratio = rows[f"{stage}_b"].astype(float).median() / max(1e-9, rows[f"{stage}_a"].astype(float).median())
        cells += [empty, words, f"{copies(answers_a)} / {copies(answers_b)}", f"{ratio:.2f}"]
        print("| " + " | ".join(cells) + " |")
        if args.show:
            changed = rows[answers_a != answers_b].head(args.show)
            for _, row in changed.iterrows():
                print(f"    {row['sample_id']} gold {row['gold_a']!r}: A {row['answer_a']!r} -> B {row['answer_b']!r}")
    return 0


def refused(parser, handoff_args: list[str]) -> None:
    """Stop at a ``--handoffs`` that names a handoff a layout run does not take."""
    if "--handoffs" in handoff_args:
        names = set(handoff_args[handoff_args.index("--handoffs") + 1].split(","))
        if names & REFUSED or "all" in names:
            parser.error(f"layout runs take receiver, skyline, kvcomm, text, sharer only (not {sorted(names & REFUSED)})")


def layout_for_this_process(name: str) -> None:
    """``use_layout`` once every kvviz module that imports ``render`` by name is imported."""
    import kvviz.handoffs  # noqa: F401   that imported render by name)
    import kvviz.handoffs.c2c.align  # noqa: F401  (imported before use_layout, so that it reaches every module

    use_layout(name)


def bench(args) -> int:
    """``python -m kvviz bench`` under a layout (the module's docstring)."""
    from kvviz.cli import main as kvviz_main

    return kvviz_main(["bench", *args.rest])


def run(args) -> int:
    """Another research script's ``__main__`` under a layout (the module's docstring)."""
    sys.argv = [str(args.script), *args.rest]
    runpy.run_path(str(args.script), run_name="__main__")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("probe", help="one context question on the receiver, per layout")
    p.add_argument("--context", required=True)
    p.add_argument("--query", required=True)
    p.add_argument("--gold", default="", help="comma-separated gold answers")
    p.add_argument("--candidates", default="", help="comma-separated answers to score (keep their leading space)")
    p.add_argument("--layouts", default="plain,fewshot3")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--top", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    b = commands.add_parser("bench", help="python -m kvviz bench under a layout")
    b.add_argument("--layout", choices=sorted(PREFIXES), required=True)
    b.add_argument("rest", nargs=argparse.REMAINDER, help="after --: the bench's own arguments")
    c = commands.add_parser("compare", help="two layout runs paired per variant")
    c.add_argument("first", type=Path)
    c.add_argument("second", type=Path)
    c.add_argument("--show", type=int, default=0, help="print this many answers that changed per variant")
    r = commands.add_parser("run", help="another research script under a layout")
    r.add_argument("--layout", choices=sorted(PREFIXES), required=True)
    r.add_argument("script", type=Path)
    r.add_argument("rest", nargs=argparse.REMAINDER, help="after --: the script's own arguments")
    args = parser.parse_args(argv)
    if args.command in ("bench", "run"):
        args.rest = [a for a in args.rest if a != "--"]
        refused(parser, args.rest)
        layout_for_this_process(args.layout)
    return {"probe": probe, "bench": bench, "compare": compare, "run": run}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
