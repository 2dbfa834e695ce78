"""The kvviz command line: everything the app does, scriptable from a terminal.

Each subcommand lives in a module that offers ``configure_parser(parser)`` and ``main(args) -> int``
(``MODULE:NAME`` in the table: ``configure_NAME`` and ``main_NAME``). Only the subcommand asked for
is imported, so that ``python -m kvviz --help`` stays fast: the handoffs and the models it would
otherwise import load torch and transformers (several seconds).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS = {
    "models": ("kvviz.commands:models", "list the model registry: pairs and each model's architecture facts"),
    "prepare": ("kvviz.commands:prepare", "convert and cache a pair's models (idempotent) and print where"),
    "run": ("kvviz.commands:run", "run handoffs on one query and print a table or JSON"),
    "bench": ("kvviz.studies.bench", "benchmark handoffs on a dataset (accuracy, latency, bytes, FLOPs)"),
    "train-fuser": ("kvviz.studies.c2c.train", "train a C2C fuser for a pair"),
    "eval-fuser": ("kvviz.studies.c2c.evaluate", "evaluate a C2C fuser against the receiver and its control"),
    "train-translator": ("kvviz.studies.c2c.train_translator", "train a KV translator through the frozen receiver, in resumable legs"),
    "eval-translator": ("kvviz.studies.c2c.translator_eval", "evaluate a KV translator (c2c_translate) on held-out private contexts"),
    "train-sharer": ("kvviz.studies.knower.sharer", "teach a sharer the handbook of invented facts (a LoRA adapter), in resumable legs"),
    "knower-report": ("kvviz.studies.knower.report", "the knowing sharer's table from a bench --pair knower --dataset handbook --swap run"),
    "probe-kv": ("kvviz.studies.knower.probe", "where is the knowledge? a linear probe per layer on a model's KV at a handbook question"),
    "space": ("kvviz.app.space", "export the lab as a Hugging Face Space folder (space export DIR [--push REPO_ID])"),
}


def entry_points(name: str):
    """(configure, main) of a subcommand, importing its module (by name, to keep --help fast)."""
    module_name, _, function = SUBCOMMANDS[name][0].partition(":")
    module = importlib.import_module(module_name)
    if function:
        return getattr(module, f"configure_{function}"), getattr(module, f"main_{function}")
    return module.configure_parser, module.main


def build_parser(configure: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; ``configure``: the subcommands whose own flags are added (default: all)."""
    parser = argparse.ArgumentParser(
        prog="python -m kvviz",
        description="kvviz: watch two language models talk through their KV caches.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if configure is None or name in configure:
            configure_command, main_command = entry_points(name)
            configure_command(sub)
            sub.set_defaults(main=main_command)
    return parser


def asked_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is one), or None."""
    return next((word for word in argv if word in SUBCOMMANDS), None)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = asked_command(argv)
    parser = build_parser([command] if command else [])
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return args.main(args)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        # Clear one-line errors for bad input; tracebacks are for bugs.
        print(f"error: {error}", file=sys.stderr)
        return 2
