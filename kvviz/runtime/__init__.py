"""The models at run time (torch): loading them (``models``), the attention they run with
(``attention``), the output head's fast greedy path (``head``), the one module that touches
transformers' cache tensors (``cache``), RoPE undone and redone (``rope``), timers and FLOPs
(``measure``), the batched decode step (``step``, ``batching``), the one decode loop (``decode``),
what crossed (``crossed``) and what the engine records around one handoff's run (``recording``),
and the checkpoints trained for a pair (``checkpoints``).
"""
