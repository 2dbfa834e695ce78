"""The latent relay (LatentMAS style): a same-shape sender reads the context, "thinks" N latent steps,
and the receiver reads its question on the sender's cache (``handoff``: the run and its
descriptor; ``thinking``: the alignment map and the latent steps)."""

from kvviz.handoffs.latent_relay.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
