"""The kvviz command line: everything the app does, scriptable from a terminal.

Subcommands live in their own modules; each module offers ``configure_parser(parser)`` and
``main(args) -> int``. They are imported only when used, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# name -> (module, one-line help)
SUBCOMMANDS = {
    "models": ("kvviz.cli", "list the model registry: pairs and each model's architecture facts"),
    "prepare": ("kvviz.cli", "convert and cache a pair's models (idempotent) and print where"),
    "run": ("kvviz.cli", "run handoffs on one query and print a table or JSON"),
    "bench": ("kvviz.bench", "benchmark handoffs on a dataset (accuracy, latency, bytes, FLOPs)"),
    "train-fuser": ("kvviz.c2c.train", "train a C2C fuser for a pair"),
    "eval-fuser": ("kvviz.c2c.evaluate", "evaluate a C2C fuser against the receiver and its control"),
    "space": ("kvviz.space", "export the lab as a Hugging Face Space folder (space export DIR [--push REPO_ID])"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvviz",
        description="kvviz: watch two language models talk through their KV caches.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(module=module_name)
        if module_name == __name__:
            globals()[f"_configure_{name}"](sub)
        else:
            try:
                importlib.import_module(module_name).configure_parser(sub)
            except ModuleNotFoundError as error:
                if error.name != module_name:
                    raise
                sub.set_defaults(unavailable=f"'{name}' is not available in this version of kvviz.")
    return parser


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N, or auto (accelerate device_map)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")


# --- models -----------------------------------------------------------------------------------


def _configure_models(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")


def _main_models(args) -> int:
    from kvviz.models import EMBEDDED_MODELS, PAIRS, describe_model

    names = list(dict.fromkeys(list(EMBEDDED_MODELS) + [n for p in PAIRS.values() for n in p.model_names()]))
    rows = [describe_model(name) for name in names]
    pairs = [
        {"pair": p.name, "sharer": p.sharer, "receiver": p.receiver, "kvcomm_sender": p.kvcomm_sender_name,
         "needs_network": p.needs_network, "description": p.description}
        for p in PAIRS.values()
    ]
    if args.json:
        print(json.dumps({"pairs": pairs, "models": rows}, indent=2))
        return 0
    print("Pairs (sharer -> receiver):")
    for p in pairs:
        net = "  [needs network]" if p["needs_network"] else ""
        print(f"  {p['pair']:<17} {p['sharer']} -> {p['receiver']}  (KVComm sender: {p['kvcomm_sender']}){net}")
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


def _configure_prepare(parser):
    parser.add_argument("--pair", default="embedded", help="pair name (default: embedded)")


def _main_prepare(args) -> int:
    from kvviz.models import EMBEDDED_MODELS, converted_dir, is_prepared, prepare_embedded, resolve_pair

    pair = resolve_pair(args.pair)
    for name in pair.model_names():
        if name in EMBEDDED_MODELS:
            was_ready = is_prepared(name)
            folder = prepare_embedded(name, progress=lambda message: print(message, file=sys.stderr))
            print(f"{name}: {'already prepared' if was_ready else 'prepared'} in {folder}")
        else:
            print(f"{name}: not embedded; it loads from the hub or its folder when used ({converted_dir(name).parent} is not used)")
    return 0


# --- run --------------------------------------------------------------------------------------


def _configure_run(parser):
    from kvviz.flags import add_option_arguments
    from kvviz.handoffs import registry

    parser.add_argument("--pair", default="embedded")
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
    parser.add_argument("--message-tokens", type=int, default=64, help="message length bound for handoffs that write one")
    add_option_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    add_device_arguments(parser)


def request_from_args(args):
    from kvviz.flags import option_arguments
    from kvviz.handoffs.registry import build_request

    return build_request(
        args.query, args.context, args.max_new_tokens, args.sample, args.temperature, args.seed, args.message_tokens,
        option_arguments(args),
    )


def format_table(results) -> str:
    from kvviz.present import notes_of

    lines = [f"{'handoff':<12} {'answer':<40} {'total s':>8} {'TTFT s':>7} {'bytes':>10}  notes"]
    for r in results:
        if not r.applicable:
            lines.append(f"{r.handoff:<12} {'(not applicable)':<40} {'':>8} {'':>7} {'':>10}  {r.reason}")
            continue
        answer = r.answer.replace("\n", " ")
        answer = answer if len(answer) <= 40 else answer[:37] + "..."
        ttft = f"{r.first_token_seconds:.3f}" if r.first_token_seconds is not None else ""
        notes = "; ".join(notes_of(r.to_dict()))
        lines.append(f"{r.handoff:<12} {answer:<40} {r.total_seconds:>8.3f} {ttft:>7} {r.bytes_communicated:>10}  {notes}")
    return "\n".join(lines)


def _main_run(args) -> int:
    from kvviz.engine import load_pair, run_handoffs
    from kvviz.handoffs import parse_handoffs

    names = parse_handoffs(args.handoffs)
    request = request_from_args(args)
    pair = load_pair(args.pair, args.device, args.dtype, progress=lambda message: print(message, file=sys.stderr))
    results = run_handoffs(names, pair, request)
    if args.json:
        print(json.dumps({"pair": pair.name, "request": request.to_dict(), "results": [r.to_dict() for r in results]}, indent=2))
    else:
        print(f"pair {pair.name}: sharer {pair.sharer.name} -> receiver {pair.receiver.name}")
        print(format_table(results))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    if getattr(args, "unavailable", None):
        print(args.unavailable, file=sys.stderr)
        return 2
    try:
        if args.module == __name__:
            return globals()[f"_main_{args.command.replace('-', '_')}"](args)
        return importlib.import_module(args.module).main(args)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        # Clear one-line errors for bad input; tracebacks are for bugs.
        print(f"error: {error}", file=sys.stderr)
        return 2
