"""Runs handoffs: load a pair and run one handoff (``runner``), run several as one run and stream
what happens (``stream``: ``run``, and ``results`` for a run's results), what a run tells its
consumer (``events``), the one evaluation loop over records (``evaluation``), and the shared
command-line flags (``flags``). Reads handoffs from the registry only.
"""
