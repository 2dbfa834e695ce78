"""Handoff options as command-line flags, read from the registry (``run`` and ``bench`` use them).

Each descriptor option is a flag (``Option.cli_flag``: its own ``flag`` or ``--HANDOFF-OPTION``);
in the benchmark an option with a ``sweep_flag`` takes a comma-separated list there instead, one
variant per value. The parsed values come back as ``{handoff: {option: value}}``, ready for
``kvviz.handoffs.registry.build_request``.
"""

from __future__ import annotations

import argparse

from kvviz.handoffs import registry


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
