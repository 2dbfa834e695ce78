"""Measure candidate presets: every handoff's answer, marked by the project's metrics, and the lessons.

For each candidate (today's presets and new ones written for kvviz) this runs every page handoff on
the pair at the page's defaults (greedy, 32 new tokens, what ``scripts/precompute_presets.py``
stores), KVComm also with 1, 2, 3, ... layers sent (nested sets: the top layers by the
page's score (built-in calibration), so that "crosses with M layers, fails with M - 1" is a statement about one
ranking), and scores each answer with both of the project's metrics (``kvviz.data.metrics``):
token F1 > 0.5 (the benchmark's ``correct``, the KVComm paper's) and "contains a gold answer" (the
sweep's). It then says which lessons each candidate shows (``LESSONS``).

    nice -n 10 python research/preset_candidates.py --threads 1 --out runs/preset-candidates.json
    python research/preset_candidates.py --table runs/preset-candidates.json   # the table only

``--handoffs`` measures some of the page's handoffs only, ``--no-layers`` skips KVComm's layer
counts (they hold for the page's own prompt layout): under another base-model prompt layout,

    python research/layout_bench.py run --layout fewshot3 research/preset_candidates.py -- \\
        --handoffs receiver,text,kvcomm,skyline,sharer --no-layers --out runs/preset-candidates-fewshot3.json

A rerun keeps what --out already holds and measures only what it lacks (a new candidate, a new
layer count); delete the file to measure everything again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (key, query, context or None, gold answers). Written for kvviz; none is a dataset record.
NEW_CANDIDATES = [
    ("eiffel", "Which country is Tom in?", "Tom is standing under the Eiffel Tower.", ["France"]),
    ("great-wall", "Which country is Omar in?", "Omar is walking along the Great Wall.", ["China"]),
    ("fuji", "Which country is Mei in?", "Mei is hiking near Mount Fuji.", ["Japan"]),
    ("big-ben-tom", "Which country is Tom in?", "Tom is standing under Big Ben.", ["United Kingdom", "UK", "England", "Britain"]),
    ("london", "Which country is Kofi in?", "Kofi is standing in London.", ["United Kingdom", "UK", "England", "Britain"]),
    ("gate", "Which gate does Nadia's flight leave from?", "Nadia's flight to Oslo leaves from gate B22.", ["B22"]),
    ("platform", "Which platform does the train to Leeds leave from?", "The train to Leeds leaves from platform 9.", ["9"]),
    ("room", "Which room is the meeting in?", "The meeting has moved to room 314.", ["314"]),
    ("wifi", "What is the guest wifi password?", "The guest wifi password is maple77.", ["maple77"]),
    ("cat", "What is the name of Sam's cat?", "Sam has a grey cat called Biscuit.", ["Biscuit"]),
    ("keys", "Which key opens the garage?", "The red key opens the shed and the blue key opens the garage.", ["blue", "the blue key"]),
    ("van", "Where did Ada park her van?", "Ada parked her blue van next to the bakery on Elm Street.", ["bakery", "Elm Street"]),
    ("canberra", "What is the capital of Australia?", None, ["Canberra"]),
    ("spider", "How many legs does a spider have?", None, ["8", "eight"]),
    ("gold", "What is the chemical symbol for gold?", None, ["Au"]),
    ("red-planet", "Which planet is known as the Red Planet?", None, ["Mars"]),
    ("pacific", "What is the largest ocean on Earth?", None, ["Pacific", "Pacific Ocean"]),
    ("romeo", "Who wrote Romeo and Juliet?", None, ["Shakespeare", "William Shakespeare"]),
    ("freezing-f", "At what temperature in degrees Fahrenheit does water freeze?", None, ["32"]),
]
LAYER_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 18)


def candidates() -> list[dict]:
    from kvviz.app.presets import PRESETS

    today = [{"key": p.key, "query": p.query, "context": p.context, "answers": list(p.answers), "today": True} for p in PRESETS]
    new = [{"key": k, "query": q, "context": c, "answers": a, "today": False} for k, q, c, a in NEW_CANDIDATES]
    return today + new


def marks(answer: str, applicable: bool, answers: list[str]) -> dict:
    from kvviz.data import contains_answer, f1_match

    if not applicable:
        return {"f1": None, "contains": None}
    if not answer.strip():
        return {"f1": "none", "contains": "none"}
    return {"f1": bool(f1_match(answer, answers)), "contains": bool(contains_answer(answer, answers))}


def measure(pair, candidate: dict, max_new_tokens: int, names: list[str] | None = None) -> dict:
    from kvviz.app.methods.registry import column_names
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs.registry import build_request

    request = build_request(candidate["query"], candidate["context"], max_new_tokens=max_new_tokens)
    columns = {}
    for name in column_names():
        if names is not None and name not in names:
            continue
        started = time.perf_counter()
        result = run_handoff(name, pair, request).to_dict()
        columns[name] = {
            "answer": result.get("answer", ""), "applicable": result.get("applicable", True),
            "reason": result.get("reason", ""), "seconds": round(time.perf_counter() - started, 2),
            "message": (result.get("seen") or {}).get("message"),
            **marks(result.get("answer", ""), result.get("applicable", True), candidate["answers"]),
        }
    return {**candidate, "columns": columns, "kvcomm_layers": {}}


def measure_layers(pair, measured: dict, max_new_tokens: int) -> bool:
    """KVComm with each of ``LAYER_COUNTS`` layers sent that ``measured`` lacks; True if any was added."""
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs.registry import build_request

    if not measured["context"]:
        return False
    layer_count = pair.receiver.facts.num_layers
    added = False
    for count in LAYER_COUNTS:
        if str(count) in measured["kvcomm_layers"]:
            continue
        # a ratio whose budget is exactly ``count`` layers (kvcomm.layer_budget rounds up): the
        # top ``count`` by the page's score, layer 0 among them, so the sets are nested
        ratio = (count - 0.5) / layer_count
        layered = build_request(measured["query"], measured["context"], max_new_tokens=max_new_tokens,
                                options={"kvcomm": {"ratio": ratio}})
        result = run_handoff("kvcomm", pair, layered).to_dict()
        sent = [record["layer"] for record in result.get("layers", []) if record.get("selected")]
        measured["kvcomm_layers"][str(count)] = {"layers": sent, "answer": result.get("answer", ""),
                                                 **marks(result.get("answer", ""), True, measured["answers"])}
        added = True
    return added


# --- lessons: each a predicate over one measured candidate, on one metric --------------------------


def right(cell: dict | None, metric: str) -> bool:
    return bool(cell) and cell.get(metric) is True


def lesson_only_text(c: dict, metric: str) -> bool:
    """A private context where only the text message gets the answer across (the reference too)."""
    cols = c["columns"]
    crossers = [n for n in ("text", "c2c", "kvcomm", "ac") if right(cols.get(n), metric)]
    return bool(c["context"]) and crossers == ["text"] and right(cols.get("skyline"), metric) and not right(cols.get("receiver"), metric)


def kvcomm_threshold(c: dict, metric: str) -> int | None:
    """The fewest layers from which KVComm answers right at every larger count measured (None: never)."""
    counts = sorted(c["kvcomm_layers"], key=int)
    threshold = None
    for count in reversed(counts):
        if right(c["kvcomm_layers"][count], metric):
            threshold = int(count)
        else:
            break
    return threshold


def lesson_kvcomm_few_layers(c: dict, metric: str) -> bool:
    """KVComm crosses with few layers (at most half of them) and fails with fewer; the receiver alone fails."""
    threshold = kvcomm_threshold(c, metric) if c["context"] else None
    return threshold is not None and 1 < threshold <= 9 and right(c["columns"].get("skyline"), metric) and not right(
        c["columns"].get("receiver"), metric)


def lesson_shared_reference(c: dict, metric: str) -> bool:
    """A shared question where the reference (the sharer alone, who holds the knowledge) is right and the
    receiver alone is wrong: there is something to cross."""
    cols = c["columns"]
    return not c["context"] and right(cols.get("sharer"), metric) and not right(cols.get("receiver"), metric)


def lesson_c2c_vs_control(c: dict, metric: str) -> bool:
    """C2C answers right where its control fuser does not (one example, against the held-out gain of 0)."""
    cols = c["columns"]
    return right(cols.get("c2c"), metric) and not right(cols.get("c2c_control"), metric)


def reference_wrong(c: dict, metric: str) -> bool:
    reference = "skyline" if c["context"] else "sharer"
    return (c["columns"].get(reference) or {}).get(metric) is not True


LESSONS = {
    "only text crosses": lesson_only_text,
    "KVComm crosses with few layers, fails with fewer": lesson_kvcomm_few_layers,
    "shared question, reference right, receiver wrong": lesson_shared_reference,
    "C2C right, its control wrong": lesson_c2c_vs_control,
}


def short(text: str, width: int = 28) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def cell(col: dict | None) -> str:
    if col is None:
        return "not run"
    if not col["applicable"]:
        return "n/a"
    mark = {True: "✓", False: "✗", "none": "∅"}
    return f"{mark[col['f1']]}{mark[col['contains']]} {short(col['answer'])}"


def table(measured: list[dict]) -> str:
    names = ["receiver", "text", "c2c", "c2c_control", "kvcomm", "ac", "skyline", "sharer"]
    lines = ["| preset | gold | " + " | ".join(names) + " | KVComm threshold (F1 / contains) | lessons (F1 / contains) |",
             "|" + "---|" * (len(names) + 4)]
    for c in measured:
        lessons = []
        for title, test in LESSONS.items():
            f1, contains = test(c, "f1"), test(c, "contains")
            if f1 or contains:
                lessons.append(f"{title} ({'F1' if f1 else ''}{'+' if f1 and contains else ''}{'contains' if contains else ''})")
        if reference_wrong(c, "f1") or reference_wrong(c, "contains"):
            lessons.append(f"REFERENCE WRONG (F1 {not reference_wrong(c, 'f1')}, contains {not reference_wrong(c, 'contains')})")
        threshold = "–" if not c["context"] else f"{kvcomm_threshold(c, 'f1')} / {kvcomm_threshold(c, 'contains')}"
        key = c["key"] + (" (today)" if c["today"] else "")
        lines.append(f"| {key} | {short(c['answers'][0], 14)} | " + " | ".join(cell(c["columns"].get(n)) for n in names)
                     + f" | {threshold} | {'; '.join(lessons)} |")
    lines.append("")
    lines.append("Each cell: token F1 > 0.5 mark, then contains-gold mark (✓ right, ✗ wrong, ∅ no answer), then the "
                 "answer. KVComm at the page default (r = 0.5, 9 of 18 layers, built-in calibration). Threshold: the "
                 f"fewest of {', '.join(map(str, LAYER_COUNTS))} top-ranked layers from which KVComm answers right at "
                 "every larger count.")
    return "\n".join(lines)


def layer_table(measured: list[dict]) -> str:
    lines = ["| preset | " + " | ".join(f"{n} layers" for n in LAYER_COUNTS) + " |", "|" + "---|" * (len(LAYER_COUNTS) + 1)]
    for c in measured:
        if not c["context"] or not c["kvcomm_layers"]:
            continue
        row = []
        for n in LAYER_COUNTS:
            col = c["kvcomm_layers"].get(str(n))
            mark = {True: "✓", False: "✗", "none": "∅"}
            row.append("not measured" if col is None else f"{mark[col['f1']]}{mark[col['contains']]} {short(col['answer'], 18)}")
        lines.append(f"| {c['key']} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated candidate keys")
    parser.add_argument("--out", default="runs/preset-candidates.json")
    parser.add_argument("--table", default=None, help="print the tables of an earlier --out and stop")
    parser.add_argument("--handoffs", default="", help="comma-separated page handoffs to measure (default: all of them)")
    parser.add_argument("--no-layers", action="store_true", help="skip KVComm's layer counts")
    args = parser.parse_args(argv)
    if args.table:
        measured = json.loads(Path(args.table).read_text())
        print(table(measured) + "\n\n" + layer_table(measured))
        return 0

    import torch

    from kvviz.engine.runner import load_pair

    torch.set_num_threads(args.threads)
    names = [name for name in args.handoffs.split(",") if name] or None
    out = Path(args.out)
    measured = json.loads(out.read_text()) if out.exists() else []
    wanted = set(filter(None, args.only.split(",")))
    pair = load_pair(args.pair, progress=lambda message: print(message, file=sys.stderr))
    by_key = {c["key"]: c for c in measured}
    for candidate in candidates():
        if wanted and candidate["key"] not in wanted:
            continue
        started = time.perf_counter()
        entry = by_key.get(candidate["key"])
        changed = entry is None
        if entry is None:
            entry = measure(pair, candidate, args.max_new_tokens, names)
            measured.append(entry)
        if not args.no_layers:  # the layer counts hold for the page's own prompt layout only
            changed = measure_layers(pair, entry, args.max_new_tokens) or changed
        if changed:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(measured, indent=1, ensure_ascii=False))
            print(f"{candidate['key']}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(table(measured) + "\n\n" + layer_table(measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
