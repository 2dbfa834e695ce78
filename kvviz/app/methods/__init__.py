"""What the page shows of each method, one module per handoff file (its figure, the facts under its
answer, its page copy), registered one line each. A new handoff's page is one file and one line here.
"""

from __future__ import annotations

import importlib

from kvviz.app.methods.registry import register_module

# One line per handoff file's page, in the order of kvviz.handoffs.HANDOFF_MODULES.
PAGE_MODULES = (
    "kvviz.app.methods.baselines",
    "kvviz.app.methods.text",
    "kvviz.app.methods.c2c",
    "kvviz.app.methods.kvcomm",
    "kvviz.app.methods.ac",
    "kvviz.app.methods.cipher",
    "kvviz.app.methods.latent_relay",
    "kvviz.app.methods.kv_steering",
    "kvviz.app.methods.translate",
)

for _module in PAGE_MODULES:
    register_module(importlib.import_module(_module))
