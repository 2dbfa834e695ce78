"""KV translation: a trained translator maps the sharer's KV of a private context into the
receiver's KV space (``handoff``: the method and its control; ``locate``: which translator a run
reads; ``translator``: the map, its alignment, the prefix it builds and its checkpoint)."""

from kvviz.handoffs.translate.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
