"""AC (Activation Communication): one hidden-state vector crosses from the sender to the receiver
(``handoff``: the run and its descriptor; ``merge``: reading and editing the hidden states that
enter decoder layers)."""

from kvviz.handoffs.ac.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
