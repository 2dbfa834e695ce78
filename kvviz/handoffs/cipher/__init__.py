"""CIPHER: the sharer writes its message as expected embeddings instead of tokens (``handoff``: the
run and its descriptor; ``message``: writing and reading the vectors)."""

from kvviz.handoffs.cipher.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
