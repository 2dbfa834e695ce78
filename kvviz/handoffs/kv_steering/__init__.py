"""KV steering: steering vectors from contrastive pairs are added once to the receiver's own cache; no
sharer runs (``handoff``: the run and its descriptor; ``vectors``: the pairs, the vectors and the
edit)."""

from kvviz.handoffs.kv_steering.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
