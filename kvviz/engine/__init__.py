"""Runs handoffs: load a pair and run one handoff or several as one run (``runner``), stream a run
to a page (``stream``), the one evaluation loop over records (``evaluation``), and the shared
command-line flags (``flags``). Reads handoffs from the registry only.
"""
