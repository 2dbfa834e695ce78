"""The text handoff's critical path (issue 42): where its time goes alone and in the page's shared run,
in this process's numeric mode.

    PYTHONPATH=. OMP_NUM_THREADS=1 KVVIZ_NUMERICS=fp32 python research/text_path.py [--repeats 5]
    PYTHONPATH=. OMP_NUM_THREADS=1 KVVIZ_NUMERICS=bf16 python research/text_path.py [--repeats 5]

The locker preset, 32 new tokens, one torch thread per handoff. Per repeat (after one warm-up), the text
handoff alone, then the six default handoffs at once through the page's engine (recording nothing). For
the text handoff: its stages (the sharer's prompt pass, its message's decode, the receiver's prompt
pass of the message, its answer), the wall time from its start to its first answer token, and the gap
between the message's last token and the receiver's first answer token that is neither the receiver's
prompt pass nor choosing its first token (what "the receiver's read starts the step the message
ends" leaves: nothing, when the gap is about 0). The message's steps and the answer's: how many
sequences shared them (``details["decode_batches"]``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from kvviz.engine.events import Done, Message, Token
    from kvviz.engine.runner import load_pair, run_handoff
    from kvviz.engine.stream import ALL_AT_ONCE, run
    from kvviz.handoffs.registry import default_handoffs
    from kvviz.studies.run_speed import full_run_request

    pair = load_pair("embedded", "cpu", progress=lambda *a: None)
    request = full_run_request()
    names = default_handoffs()
    rows = {"alone": [], "shared": []}
    for repeat in range(args.repeats + 1):
        alone = run_handoff("text", pair, request)
        started = time.perf_counter()
        marks: dict[str, float] = {}
        result = None
        for batch in run(pair.name, request, names, ALL_AT_ONCE, loaded=pair):
            for event in batch:
                now = time.perf_counter() - started
                if isinstance(event, Message) and event.handoff == "text":
                    marks["last message"] = now
                elif isinstance(event, Token) and event.handoff == "text":
                    marks.setdefault("first answer token", now)
                elif isinstance(event, Done) and event.handoff == "text":
                    result = event.result
        if not repeat:
            continue
        for label, timings, batches, first in (("alone", alone.timings, alone.details["decode_batches"], None),
                                               ("shared", result["timings"], result["details"]["decode_batches"], marks)):
            row = {stage: timings.get(stage, 0.0) for stage in ("sharer_prefill", "sharer_decode", "receiver_prefill", "receiver_decode", "total")}
            row["batches"] = [(b.get("steps"), round(b.get("mean_size", 0), 1)) for b in batches]
            if first:
                row["wall to first answer token"] = first["first answer token"]
                row["message end to first answer token"] = first["first answer token"] - first["last message"]
            rows[label].append(row)
    print(f"numeric mode {pair.receiver.numerics}; text handoff, median of {args.repeats} (s)")
    for label, values in rows.items():
        keys = [k for k in values[0] if k != "batches"]
        print(f"{label}: " + ", ".join(f"{k} {statistics.median(v[k] for v in values):.3f}" for k in keys)
              + f"; decode batches (steps, mean size) {values[-1]['batches']}")


if __name__ == "__main__":
    main()
