"""Which swapped fact each private preset carries, chosen by measurement (assets/presets.toml, `swap`).

    python research/preset_swaps.py            # every candidate, the default columns and their controls

For each private preset, each candidate swap (the note with its answer-bearing fact changed, and
what it answers instead) runs the page's default columns and the controls on both notes; a good
swap is one that Skyline (which reads the note) follows, so that a column's follow mark says
something: a swap that Skyline itself does not follow tells the learner nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CANDIDATES = {
    "locker": [("4471", "8125"), ("4471", "3902")],
    "fuji": [("Mount Fuji", "the Grand Canyon", "United States"), ("Mount Fuji", "the Eiffel Tower", "France"),
             ("Mount Fuji", "Machu Picchu", "Peru")],
    "colosseum": [("the Colosseum", "the Eiffel Tower", "France"), ("the Colosseum", "the Taj Mahal", "India"),
                  ("the Colosseum", "the Great Wall", "China")],
    "big-ben": [("Big Ben", "the Eiffel Tower", "France"), ("Big Ben", "the Taj Mahal", "India"),
                ("Big Ben", "the Great Wall", "China")],
}
NAMES = ["receiver", "text", "c2c", "c2c_control", "kvcomm", "kvcomm_control", "skyline"]


def main(argv=None) -> int:
    from kvviz.app.presets import preset
    from kvviz.data.swaps import Swap, replace_fact
    from kvviz.engine import stream
    from kvviz.engine.runner import load_pair
    from kvviz.handoffs.registry import build_request

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--presets", default=",".join(CANDIDATES))
    args = parser.parse_args(argv)
    pair = load_pair(args.pair)
    for key in args.presets.split(","):
        chosen = preset(key)
        request = build_request(chosen.query, chosen.context, max_new_tokens=32)
        for old, new, *answer in CANDIDATES[key]:
            swap = Swap(replace_fact(chosen.context, old, new), tuple(answer or [new]), f"{old} -> {new}")
            results = stream.results(pair, request, NAMES, swap=swap, gold=list(chosen.answers))
            marks = ", ".join(f"{r.handoff} {r.swap.get('outcome')} ({r.swap.get('answer')!r})" for r in results)
            print(f"{key}: {swap.changed} -> {'/'.join(swap.answers)}\n  {marks}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
