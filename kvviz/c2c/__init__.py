"""C2C (Cache-to-Cache): everything the C2C handoff, its trainer and its evaluator share.

The library, below the handoffs (``kvviz.handoffs.c2c`` runs it):

* ``align``: which sharer layer and token each receiver layer and message token reads;
* ``rope``: RoPE undone and redone with a model's own rotary module;
* ``fuser``: the fuser module (projectors, head weights, gates) and its checkpoint format;
* ``reference``: the C2C paper's published layout, converted once;
* ``fusion``: the one pipeline (sharer prefill, receiver prefill, fusion) and the sharer's KV at
  the aligned tokens (``sharer_kv``);
* ``locate``: which fuser a run reads (given, shipped, or the paper's);
* ``examples``: records aligned for fusion, with their responses, and the train / held-out split;
* ``scoring``: response NLL through the frozen receiver, from any prepared receiver state;
* ``communication``: the communication measure (another example's context as the control, a
  bootstrap interval).

Above the engine (the training layer): ``train`` (``python -m kvviz train-fuser``) and
``evaluate`` (``python -m kvviz eval-fuser``).
"""
