"""Every handoff, registered from its module. A new handoff is one file (or one folder, for a big
one) and one line here.

A handoff's module holds its ``run(pair, request, io) -> HandoffResult`` (``io``: its
``kvviz.handoffs.common.HandoffIO``) and ends with its descriptors (``HANDOFFS = (Handoff(...),)``,
see ``kvviz.handoffs.registry``): name, title, colour, what it needs, its options, its control, and
what the benchmark needs from it. A folder's ``__init__`` exports its ``handoff`` module's
``HANDOFFS``, so the registry names the folder. What the page shows of a handoff lives in
``kvviz.app.methods``. The page, the plots, the benchmark, the CLI and the presets read the
registry only. How to add one: docs/HANDOFFS.md.
"""

from __future__ import annotations

import importlib

from kvviz.core.results import HandoffRequest, HandoffResult
from kvviz.handoffs.registry import HANDOFFS, Handoff, Option, get, parse_handoffs, register, register_module
from kvviz.runtime.models import LoadedPair

# One line per handoff module, in the order of every table and of the page's settings.
HANDOFF_MODULES = (
    "kvviz.handoffs.baselines",
    "kvviz.handoffs.text",
    "kvviz.handoffs.c2c",
    "kvviz.handoffs.kvcomm",
    "kvviz.handoffs.ac",
    "kvviz.handoffs.cipher",
    "kvviz.handoffs.latent_relay",
    "kvviz.handoffs.kv_steering",
    "kvviz.handoffs.translate",
)

for _module in HANDOFF_MODULES:
    register_module(importlib.import_module(_module))

__all__ = [
    "HANDOFFS",
    "Handoff",
    "HandoffRequest",
    "HandoffResult",
    "LoadedPair",
    "Option",
    "get",
    "parse_handoffs",
    "register",
]
