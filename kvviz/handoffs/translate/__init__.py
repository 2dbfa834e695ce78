"""KV translation: a trained translator maps the sharer's KV of a private context into the
receiver's KV space (``handoff``: the method and its control; ``locate``: which translator a run
reads; ``ridge``: the map's closed-form first stage; ``prefix``: the receiver's state it builds;
``side``: the gated side branch a side-memory translator is read through; ``translator``: the map
and its checkpoint; ``align``: which sharer token each receiver token reads)."""

from kvviz.handoffs.translate.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
