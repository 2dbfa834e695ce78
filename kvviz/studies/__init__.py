"""Measuring and training, above the engine: the benchmark (``bench``), the performance study
(``perf``) and the speed report (``speed``), and C2C's and the KV translator's trainers and
evaluators (``c2c``).
"""
