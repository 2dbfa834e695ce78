"""The command line's shared flags, defined once: the pair and where it runs, and every handoff
option read from the registry.

``add_model_arguments`` gives every command that loads a pair the same ``--pair``, ``--device``,
``--dtype`` and ``--threads`` (``run``, ``bench``, ``train-fuser``, ``eval-fuser``);
``apply_threads`` sets torch's thread count from them.

Each descriptor option is a flag (``Option.cli_flag``: its own ``flag`` or ``--HANDOFF-OPTION``);
in the benchmark an option with a ``sweep_flag`` takes a comma-separated list there instead, one
variant per value. The parsed values come back as ``{handoff: {option: value}}``, ready for
``kvviz.handoffs.registry.build_request``.
"""

from __future__ import annotations

import argparse

import torch

from kvviz.handoffs import registry


def add_model_arguments(parser: argparse.ArgumentParser, pair_help: str = "pair name or SHARER+RECEIVER",
                        threads_help: str = "CPU threads for torch (default: torch's choice; 1 is much faster on a busy "
                                            "shared machine)") -> None:
    """``--pair``, ``--device``, ``--dtype`` and ``--threads``."""
    parser.add_argument("--pair", default="embedded", help=pair_help)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N, or auto (accelerate device_map)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--threads", type=int, default=None, help=threads_help)


def add_optimizer_arguments(parser: argparse.ArgumentParser, defaults: dict) -> None:
    """``--lr``, ``--weight-decay``, ``--warmup`` and ``--clip`` (AdamW with a linear warm-up and a
    gradient norm clip, as the trainers run it), their defaults from the trainer's ``defaults``."""
    parser.add_argument("--lr", type=float, default=defaults["lr"])
    parser.add_argument("--weight-decay", type=float, default=defaults["weight_decay"])
    parser.add_argument("--warmup", type=float, default=defaults["warmup"], help="share of steps for linear warm-up")
    parser.add_argument("--clip", type=float, default=defaults["clip"], help="gradient norm clip")


def apply_threads(args) -> None:
    """``torch.set_num_threads(args.threads)`` when ``--threads`` was given."""
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def add_option_arguments(parser: argparse.ArgumentParser, swept: bool = False) -> None:
    """One flag per handoff option, from the registry (help grouped by handoff). With ``swept``
    (the bench), an option that declares a sweep flag takes a comma-separated list there instead."""
    for handoff in registry.all_handoffs():
        if not handoff.options:
            continue
        group = parser.add_argument_group(f"{handoff.name} options ({handoff.title})")
        for option in handoff.options:
            choices = f" ({', '.join(map(str, option.choices))})" if option.choices else ""
            if swept and option.sweep_flag:
                group.add_argument(option.sweep_flag, default=option.sweep_default, dest=_dest(handoff.name, option.name),
                                   metavar="LIST",
                                   help=f"{option.label}{choices}: comma-separated, one variant each (default {option.sweep_default})")
                continue
            default = f"default: {option.auto}" if option.auto else f"default {option.default!r}"
            group.add_argument(option.cli_flag(handoff.name), default=None, dest=_dest(handoff.name, option.name),
                               metavar=option.name.upper(),
                               help=f"{option.label}{choices}; {default}")


def _dest(handoff: str, option: str) -> str:
    return f"option__{handoff}__{option}"


def option_arguments(args) -> dict[str, dict]:
    """The option flags given on the command line: {handoff: {option: value}}."""
    given: dict[str, dict] = {}
    for key, value in vars(args).items():
        if key.startswith("option__") and value is not None:
            _, handoff, option = key.split("__")
            given.setdefault(handoff, {})[option] = value
    return given
