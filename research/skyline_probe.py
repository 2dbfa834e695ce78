"""Why does a reference answer go wrong? Probe one context question on the receiver model.

For one (context, question) it prints, for the receiver reading the context (Skyline's prompt)
and, for comparison, alone:

* the answer of kvviz's decode loop (fast greedy head), the same with the exact head
  (``KVVIZ_FAST_HEAD=0`` does this for a whole run), and transformers' own ``generate`` on the
  same prompt (greedy, no kvviz code in the loop): if these agree, the answer is the model's;
* the first answer token's top candidates with their probabilities;
* the log-likelihood of each candidate answer given the prompt (summed over its tokens), so a
  learner sees by how much the model prefers one answer over another;
* how the prompt's tokens split up, and the project's metrics (token F1 > 0.5, containment) of
  the answer against the gold answers.

Each ``--layout`` is a prompt layout (see ``LAYOUTS``); ``fewshot3`` puts three worked examples
(written for kvviz, none from a dataset or preset) in front of the plain one, ``fewshot3-neutral``
three with no country in them.

    python research/skyline_probe.py --context "Kofi is standing under Big Ben." \
        --query "Which country is Kofi in?" --gold "United Kingdom,UK,England,Britain" \
        --candidates " The United Kingdom., The United States., United Kingdom, England, London"
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Three worked examples (written for kvviz): a place, a number, a person; none is a preset or a
# dataset record. Used by the few-shot layout here and in research/layout_bench.py.
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


# (prefix, context part, query part); {C} context, {Q} question. The context part is left out for
# the receiver alone.
LAYOUTS = {
    "plain": ("", "Context: {C}\n\n", "Question: {Q}\nAnswer:"),  # today's base layout (kvviz.core.prompts)
    "fewshot3": (worked_examples_text(), "Context: {C}\n\n", "Question: {Q}\nAnswer:"),
    "fewshot3-neutral": (worked_examples_text(NEUTRAL_EXAMPLES), "Context: {C}\n\n", "Question: {Q}\nAnswer:"),
    "instructed": ("", "Context: {C}\n\n", "Question: {Q}\nAnswer briefly.\nAnswer:"),
    "fact-first": ("", "{C}\n\n", "Question: {Q}\nAnswer:"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--gold", default="", help="comma-separated gold answers")
    parser.add_argument("--candidates", default="", help="comma-separated answers to score (keep their leading space)")
    parser.add_argument("--layouts", default="plain,fewshot3")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

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


if __name__ == "__main__":
    raise SystemExit(main())
