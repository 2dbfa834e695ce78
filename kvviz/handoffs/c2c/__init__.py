"""C2C (Cache-to-Cache): a trained fuser projects the sharer's KV cache into the receiver's.

* ``handoff``: the method (C2C and its control fuser) and its descriptors;
* ``align``: which sharer layer and token each receiver layer and message token reads;
* ``fuser``: the fuser module (projectors, head weights, gates) and its checkpoint format;
* ``reference``: the C2C paper's published layout, converted once;
* ``fusion``: the one pipeline (sharer prefill, receiver prefill, fusion) and the sharer's KV at
  the aligned tokens (``sharer_kv``);
* ``locate``: which fuser a run reads (given, shipped, or the paper's).

Training and evaluation sit above the engine, in ``kvviz.studies.c2c``.
"""

from kvviz.handoffs.c2c.handoff import HANDOFFS

__all__ = ["HANDOFFS"]
