"""KVComm: the receiver attends to a same-model sender's KV of the context in selected layers
(``handoff``: the method and its descriptors; ``layers``: which layers, and why)."""

from kvviz.handoffs.kvcomm.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
