"""C2C where its premise holds (issue 44): a sharer taught the handbook (``kvviz.data.handbook``)
through a LoRA adapter (``sharer``: ``train-sharer``), and where in its cache that knowledge sits
(``probe``: ``probe-kv``).
"""
