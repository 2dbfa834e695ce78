"""A sharer that knows what the receiver does not: the handbook (``kvviz.data.handbook``) taught
to a sharer through a LoRA adapter (``sharer``: ``train-sharer``), and where in its cache that
knowledge sits (``probe``: ``probe-kv``). C2C's premise, built so that it holds (issue 44).
"""
