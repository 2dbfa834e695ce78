"""Two costs of a live run that are not the models' (issue 20), measured in this process.

    PYTHONPATH=. OMP_NUM_THREADS=1 python research/page_costs.py gc [--pairs 10]
    PYTHONPATH=. python research/page_costs.py figures [--repeats 5]

``gc``: the page's default handoffs on the locker preset, warm, recording what crossed (as the page
runs them, ``kvviz.engine.stream.run``), with the objects alive after loading frozen out of the
garbage collector's walks (``gc.freeze``, what ``kvviz.runtime.models.load_model`` does) and not
(``gc.unfreeze``), alternating within the process: each side's median and the median paired ratio.

``figures``: ``kvviz.app.plots.all_figures`` on the locker preset's precomputed results (every handoff of
the preset, every column's figure): what a run's last update draws. Median seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time

import torch


def gc_pairs(pairs: int) -> None:
    from kvviz.engine.runner import load_pair
    from kvviz.engine.stream import run
    from kvviz.engine.stream import default_workers
    from kvviz.handoffs.registry import default_handoffs
    from kvviz.studies.run_speed import full_run_request

    torch.set_num_threads(1)
    pair = load_pair("embedded")  # freezes what is alive now
    request = dataclasses.replace(full_run_request(), inspect={"gold": None})
    names = default_handoffs()

    def one() -> float:
        started = time.perf_counter()
        for _ in run(pair.name, request, names, default_workers(), loaded=pair):
            pass
        return time.perf_counter() - started

    one(), one()  # warm
    seconds = {"frozen": [], "not frozen": []}
    for index in range(pairs):
        for way in (("frozen", "not frozen") if index % 2 == 0 else ("not frozen", "frozen")):
            gc.freeze() if way == "frozen" else gc.unfreeze()
            seconds[way].append(one())
    for way, values in seconds.items():
        print(f"{way}: median {statistics.median(values):.3f} s ({', '.join(f'{v:.2f}' for v in values)})")
    ratio = statistics.median(a / b for a, b in zip(seconds["frozen"], seconds["not frozen"]))
    print(f"median paired ratio frozen / not frozen: x{ratio:.3f}")


def figure_seconds(repeats: int) -> None:
    from kvviz.app import plots
    from kvviz.app.page import spec
    from kvviz.app.presets import load_precomputed

    results = load_precomputed()["presets"]["locker"]["results"]
    plots.all_figures(results, spec.column_names())  # the figures without a result are built once per process
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        plots.all_figures(results, spec.column_names())
        times.append(time.perf_counter() - started)
    print(f"all_figures on the locker preset ({len(results)} results): median {statistics.median(times):.3f} s "
          f"({', '.join(f'{t:.3f}' for t in times)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("gc", "figures"))
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    gc_pairs(args.pairs) if args.what == "gc" else figure_seconds(args.repeats)


if __name__ == "__main__":
    main()
