"""The command line's own subcommands: ``models``, ``prepare`` and ``run`` (``kvviz.cli`` dispatches)."""

from __future__ import annotations

import json
import sys

from kvviz.app.present import notes_of
from kvviz.data.contradictions import Contradiction, typed_contradiction
from kvviz.data.swaps import OPPOSITE, Swap, replace_fact
from kvviz.engine import contradiction, flags, runner, stream
from kvviz.handoffs import registry
from kvviz.runtime.adapters import split_name
from kvviz.runtime.model_files import prepare_embedded
from kvviz.runtime.models import (
    EMBEDDED_MODELS,
    PAIRS,
    converted_dir,
    describe_model,
    is_prepared,
    resolve_pair,
)

# --- models -----------------------------------------------------------------------------------


def configure_models(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")


def main_models(args) -> int:
    names = list(dict.fromkeys(list(EMBEDDED_MODELS) + [n for p in PAIRS.values() for n in p.model_names()]))
    rows = [describe_model(name) for name in names]
    pairs = [
        {"pair": p.name, "sharer": p.sharer, "receiver": p.receiver, "same_shape_sender": p.same_shape_sender_name,
         "needs_network": p.needs_network, "description": p.description}
        for p in PAIRS.values()
    ]
    if args.json:
        print(json.dumps({"pairs": pairs, "models": rows}, indent=2))
        return 0
    print("Pairs (sharer -> receiver):")
    for p in pairs:
        net = "  [needs network]" if p["needs_network"] else ""
        print(f"  {p['pair']:<17} {p['sharer']} -> {p['receiver']}  (same-shape sender: {p['same_shape_sender']}){net}")
        print(f"  {'':<17} {p['description']}")
    print("\nModels:")
    header = f"  {'model':<34} {'arch':<18} {'layers':>6} {'heads':>5} {'kv':>3} {'hdim':>4} {'vocab':>7} {'chat':>4}  status"
    print(header)
    for row in rows:
        if "num_layers" in row:
            print(
                f"  {row['model']:<34} {row['architecture']:<18} {row['num_layers']:>6} {row['num_heads']:>5} "
                f"{row['num_kv_heads']:>3} {row['head_dim']:>4} {row['vocab_size']:>7} "
                f"{'yes' if row['has_chat_template'] else 'no':>4}  {row['status']}"
            )
        else:
            print(f"  {row['model']:<34} {'?':<18} {'':>6} {'':>5} {'':>3} {'':>4} {'':>7} {'':>4}  {row['status']}")
    return 0


# --- prepare ----------------------------------------------------------------------------------


def configure_prepare(parser):
    parser.add_argument("--pair", default="embedded", help="pair name (default: embedded)")


def main_prepare(args) -> int:
    pair = resolve_pair(args.pair)
    for name in pair.model_names():
        name = split_name(name)[0]  # a model with an adapter is its base, prepared (kvviz.runtime.adapters)
        if name in EMBEDDED_MODELS:
            was_ready = is_prepared(name)
            folder = prepare_embedded(name, progress=lambda message: print(message, file=sys.stderr))
            print(f"{name}: {'already prepared' if was_ready else 'prepared'} in {folder}")
        else:
            print(f"{name}: not embedded; it loads from the hub or its folder when used ({converted_dir(name).parent} is not used)")
    return 0


# --- run --------------------------------------------------------------------------------------


def configure_run(parser):
    flags.add_model_arguments(parser)
    parser.add_argument("--query", required=True, help="the question the receiver answers")
    parser.add_argument("--context", default=None, help="private context only the sharer sees")
    parser.add_argument(
        "--handoffs",
        default=",".join(registry.default_handoffs()),
        help="comma-separated, or all (default: the page's columns shown at first): "
        + "; ".join(f"{h.name} = {h.summary}" for h in registry.all_handoffs()),
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    flags.add_option_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--gold", default=None, help="the gold answer: the logit lens also follows its first token, "
                        "and with a swap, 'kept' means the answer on the swapped note still gives it")
    parser.add_argument("--swap-context", default=None,
                        help="the note with its answer-bearing fact changed: every handoff also runs on it, and each "
                             "result's swap says whether its answer followed the swap (needs --swap-answer)")
    parser.add_argument("--swap-word", default=None, metavar="OLD=NEW",
                        help="make the swapped note from --context by replacing the word(s) OLD with NEW (instead of "
                             "--swap-context; --swap-answer defaults to NEW)")
    parser.add_argument("--swap-pair", default=None, metavar="PAIR",
                        help="swap the sharer instead of the note: every handoff also runs on PAIR (the same pair with a "
                             "sharer that learned other facts, e.g. knower-opposite; 'opposite': the pair's own), the note "
                             "unchanged (needs --swap-answer)")
    parser.add_argument("--swap-answer", action="append", default=None,
                        help="what the swapped note answers (repeat for several accepted answers)")
    parser.add_argument("--contradict", default=None, metavar="SENTENCE",
                        help="a second counterfactual: every handoff also runs on the note with this sentence (another "
                             "value for the asked fact) inserted after the sentence that states the --gold answer; each "
                             "result's contradiction gives the gold and counter answers' first-token probabilities and "
                             "which it answered (needs --gold, and --contradict-answer unless a swap names the value)")
    parser.add_argument("--contradict-answer", action="append", default=None,
                        help="what the contradicting sentence answers (repeat for several; default: --swap-answer, or "
                             "the NEW of --swap-word)")
    parser.add_argument("--no-inspect", action="store_true",
                        help="do not record what crossed (token_attention, logit_lens and, for a handoff run beside "
                             "its control, token_change in the JSON)")


def request_from_args(args):
    inspect = None if getattr(args, "no_inspect", False) else {"gold": getattr(args, "gold", None)}
    return registry.build_request(
        args.query, args.context, args.max_new_tokens, args.sample, args.temperature, args.seed, flags.option_arguments(args),
        inspect=inspect,
    )


def format_table(results) -> str:
    lines = [f"{'handoff':<12} {'answer':<40} {'total s':>8} {'TTFT s':>7} {'bytes':>10}  notes"]
    for r in results:
        if not r.applicable:
            lines.append(f"{r.handoff:<12} {'(not applicable)':<40} {'':>8} {'':>7} {'':>10}  {r.reason}")
            continue
        answer = r.answer.replace("\n", " ")
        answer = answer if len(answer) <= 40 else answer[:37] + "..."
        ttft = f"{r.first_token_seconds:.3f}" if r.first_token_seconds is not None else ""
        notes = "; ".join(notes_of(r))
        if r.contradiction:
            c = r.contradiction
            odds = "" if c["p_gold"] is None else f", P(gold) {c['p_gold']:.3f} P(counter) {c['p_counter'] or 0:.3f}"
            notes = f"contradiction: {c['outcome'] or 'not judged'} ({c['answer']!r}{odds})" + (f"; {notes}" if notes else "")
        if r.swap:
            notes = f"swap: {r.swap['outcome'] or 'not judged'} ({r.swap['answer']!r})" + (f"; {notes}" if notes else "")
        lines.append(f"{r.handoff:<12} {answer:<40} {r.total_seconds:>8.3f} {ttft:>7} {r.bytes_communicated:>10}  {notes}")
    return "\n".join(lines)


def swap_from_args(args) -> Swap | None:
    """The swap the flags ask for (``--swap-context`` or ``--swap-word``, with ``--swap-answer``), or
    None; a ValueError says what is missing."""
    swap_pair = getattr(args, "swap_pair", None)
    if swap_pair:
        if args.swap_context is not None or args.swap_word is not None:
            raise ValueError("--swap-pair swaps the sharer, not the note: give it without --swap-context or --swap-word.")
        if not args.swap_answer:
            raise ValueError(f"Say what the sharer of {swap_pair} answers with --swap-answer.")
        if swap_pair != OPPOSITE:
            resolve_pair(swap_pair)  # an unknown pair is refused here, before any model loads
        return Swap(context=args.context, answers=tuple(args.swap_answer), changed=f"the sharer of pair {swap_pair}",
                    pair=swap_pair)
    if args.swap_context is None and args.swap_word is None:
        if args.swap_answer:
            raise ValueError("--swap-answer needs --swap-context, --swap-word or --swap-pair.")
        return None
    if not args.context:
        raise ValueError("A swap changes the note: give the note with --context.")
    if args.swap_context is not None and args.swap_word is not None:
        raise ValueError("Give --swap-context or --swap-word, not both.")
    answers = args.swap_answer
    if args.swap_word is not None:
        old, sep, new = args.swap_word.partition("=")
        if not sep:
            raise ValueError(f"--swap-word takes OLD=NEW, got {args.swap_word!r}.")
        context, answers = replace_fact(args.context, old, new), answers or [new.strip()]
        changed = f"{old.strip()} -> {new.strip()}"
    else:
        context, changed = args.swap_context, "the note as given by --swap-context"
    if not answers:
        raise ValueError("Say what the swapped note answers with --swap-answer.")
    return Swap(context=context, answers=tuple(answers), changed=changed)


def contradiction_from_args(args, swap: Swap | None) -> Contradiction | None:
    """The contradiction ``--contradict`` asks for, or None; a ValueError says what is missing."""
    if args.contradict is None:
        if args.contradict_answer:
            raise ValueError("--contradict-answer needs --contradict.")
        return None
    if not args.context:
        raise ValueError("A contradiction is inserted into the note: give the note with --context.")
    if not args.gold:
        raise ValueError("--contradict needs --gold: the answer the note states, whose sentence the contradiction follows.")
    answers = args.contradict_answer or (list(swap.answers) if swap is not None else None)
    if not answers:
        raise ValueError("Say what the contradicting sentence answers with --contradict-answer.")
    return typed_contradiction(args.context, args.contradict, [args.gold], answers)


def main_run(args) -> int:
    flags.apply_threads(args)
    names = registry.parse_handoffs(args.handoffs)
    request = request_from_args(args)
    swap = swap_from_args(args)
    contradicted = contradiction_from_args(args, swap)
    pair = runner.load_pair(args.pair, args.device, args.dtype, progress=lambda message: print(message, file=sys.stderr))
    gold = [args.gold] if args.gold else None
    if contradicted is None:
        results = stream.results(pair, request, names, swap=swap, gold=gold)
    else:
        results = contradiction.results(pair, request, names, contradicted, gold, swap=swap)
    if args.json:
        print(json.dumps({"pair": pair.name, "request": request.to_dict(), "results": [r.to_dict() for r in results]}, indent=2))
    else:
        print(f"pair {pair.name}: sharer {pair.sharer.name} -> receiver {pair.receiver.name}")
        print(format_table(results))
    return 0
