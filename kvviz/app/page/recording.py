"""What a tab shows of what crossed, recorded when it opens.

A live run records only what the tab in view shows (``spec.tab_parts``: What crossed the attention
rows and the scores against the controls, Depth the logit lens, Compare two all three; ``/run`` records
nothing without ``attention``), so a tab opened later on a live run without its parts records them then:
the same request runs again (the results' ``request``), through the server's shared runs and the models'
queue like any live run, asking for the missing parts only. A greedy run is deterministic and the same
in any batch (tests/real_model/test_numerics.py), so its answers are the ones shown: each column whose
answer is the same gets the parts recorded, a column whose answer differs keeps none and the tab says
which. The results with them are a new payload and reading (their own stamp, so that every figure and
view of them is drawn again), the tab says that they were recorded when it opened, and Compare two's
history holds them in place of the run's entry (``kvviz.app.compare.remember``). A preset's stored run
holds every part; with ``KVVIZ_RECORD_CROSSED=0`` nothing is recorded.

Two events follow every event that may bring a tab into view (``Lab.tab_events``): ``record_for_tab``
(in the runs' queue: says the tab is recording, runs, and keeps what it recorded in the ``recorded``
State) and ``show_recorded``, which reads the page again and shows the results only while it still
shows the run they were recorded for (the learner may have run or loaded another meanwhile).
"""

from __future__ import annotations

import dataclasses
import html

import gradio as gr

from kvviz.app.page import spec, views
from kvviz.app.page.lab import LOG, PRIVATE, Lab, drawn_outputs, resolved
from kvviz.app.page.run import LiveRun, stream_run
from kvviz.app.page.tabs import SHARED_STAMP, live_stamp
from kvviz.app.reading import catalog
from kvviz.app.reading.reading import Reading
from kvviz.core import policy
from kvviz.core.results import HandoffRequest

# the result field each part fills (``kvviz.runtime.crossed``), and the part in words
PART_FIELDS = {"attention": "token_attention", "lens": "logit_lens", "scores": "token_change"}
PART_WORDS = {"attention": "the attention rows", "lens": "the logit lens", "scores": "the scores against the controls"}
# what the answers of the run recorded again are checked on (the same answer, token for token)
SAME_ANSWER = ("applicable", "answer", "answer_ids")


def missing_parts(reading: Reading | None, tab: str | None) -> tuple[str, ...]:
    """The parts ``tab`` shows that the run on the page did not record: none for a preset's stored
    run, for results without a request or a finished column, and with ``KVVIZ_RECORD_CROSSED=0``."""
    if reading is None or not spec.record_crossed() or reading.precomputed or not reading.request \
            or not reading.finished():
        return ()
    recorded = spec.recorded_parts(reading.request)
    return tuple(part for part in spec.tab_parts(tab) if part not in recorded)


def recording_request(reading: Reading, parts) -> tuple[HandoffRequest, list[str]]:
    """The run's own request asking for ``parts`` (the lens following the gold it followed, else the
    expected answer now), and the columns it ran."""
    asked = HandoffRequest.from_dict(reading.request)
    gold = (asked.inspect or {}).get("gold") or (reading.answers[0] if reading.answers else None)
    request = dataclasses.replace(asked, inspect={"gold": gold, "parts": [part for part in spec.PARTS if part in parts]})
    return request, [column.name for column in reading.finished()]


def recorded_stamp(shown: str, recorded: str) -> str:
    """The merged results' stamp: two computations' whole results name one thing for every learner
    who shares them both (their figures are drawn once); else the results' own."""
    if shown.startswith(SHARED_STAMP) and recorded.startswith(SHARED_STAMP):
        return f"{shown}+{recorded[len(SHARED_STAMP):]}"
    return live_stamp()


def base_of(reading: Reading) -> str:
    """The stamp of the run a reading shows, before any tab recorded into it."""
    return str(reading.payload.get("recorded_base") or reading.stamp)


def merged_payload(reading: Reading, recorded: dict[str, dict], parts, stamp: str) -> tuple[dict, list[str]]:
    """The run's payload with ``parts`` from the results ``recorded`` again, for every column whose
    answer is the same; and the columns whose answer differed (or that did not finish again)."""
    fields = [PART_FIELDS[part] for part in parts]
    results, differed = [], []
    for raw in reading.payload.get("results") or []:
        again = recorded.get(raw["handoff"])
        if again is not None and all(again.get(key) == raw.get(key) for key in SAME_ANSWER):
            raw = {**raw, **{field: again[field] for field in fields if field in again}}
        else:
            differed.append(raw["handoff"])
        results.append(raw)
    lines = dict(reading.payload.get("recorded_on_open") or {})
    lines.update(dict.fromkeys(parts, recorded_line(parts, differed)))
    payload = {**reading.payload, "results": results, "stamp": stamp, "recorded_from": reading.stamp,
               "recorded_base": base_of(reading), "recorded_on_open": lines,
               "request": spec.request_recording(reading.request, spec.recorded_parts(reading.request) | set(parts))}
    return payload, differed


def with_recorded(reading: Reading | None, recorded: dict | None) -> Reading | None:
    """The run on the page with what a tab recorded for it (``record_parts``) merged in, read; None
    when the page shows another run now, or holds those parts already."""
    if recorded is None or reading is None or base_of(reading) != recorded["base"]:
        return None
    held = spec.recorded_parts(reading.request)
    parts = [part for part in recorded["parts"] if part not in held]
    if not parts:
        return None
    payload, _ = merged_payload(reading, recorded["results"], parts, recorded_stamp(reading.stamp, recorded["stamp"]))
    return views.reading_of(payload, reading.answers, previous=reading)


def parts_in_words(parts) -> str:
    words = [PART_WORDS[part] for part in parts]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def recorded_line(parts, differed: list[str]) -> str:
    """What the tab says of parts recorded when it opened (and of the columns that answered otherwise)."""
    line = (f"*Recorded when this tab opened:* {parts_in_words(parts)}, from the same request run again (the run "
            "shown recorded only what its tab showed).")
    if differed:
        names = ", ".join(catalog.label_of(name) for name in differed)
        line += (f" **{names}** answered differently in that run, so {'its' if len(differed) == 1 else 'their'} "
                 "recording is not shown.")
    return line


def recording_now(parts) -> str:
    return (f"⏳ *Recording {parts_in_words(parts)} for this run:* the same request runs again, asking for them "
            "(about a run's time; it waits its turn with the other runs).")


def record_parts(lab: Lab, reading: Reading, parts, session: str) -> tuple[dict | None, str]:
    """Run the shown run's request again recording ``parts``: (what it recorded, for ``with_recorded``;
    None when the run could not finish, and then the tab's line saying why)."""
    request, names = recording_request(reading, parts)
    run = LiveRun(reading.pair, request, names, list(reading.answers), reading.subject, reading.preset,
                  session=session, own=lab.own)
    stop = lab.flags.current(session)
    for _ in stream_run(run, lab.workers, stop, batches=lab.runs.batches):
        pass
    why = run.failed or run.out_of_time or ("Stop was pressed" if stop.is_set() else "")
    if why:
        return None, f"Could not record {parts_in_words(parts)} for this run ({why}): open the tab again to retry."
    return {"base": base_of(reading), "parts": list(parts), "results": dict(run.results), "stamp": run.stamp}, ""


def wire_recording(lab: Lab) -> None:
    """After every event in ``lab.tab_events``: the tab in view records what it shows of what crossed
    where the run on the page lacks it, then the page shows the results with it."""
    page = lab.page

    def record_for_tab(reading, view, request: gr.Request):
        tab = (view or {}).get("tab")
        parts = missing_parts(reading, tab) if (view or {}).get("ready") else ()
        if not parts:
            yield {page["status"]: gr.skip()}
            return
        waiting = {f"recorded_{tab}": recording_now(parts)}
        if tab == "tokens":
            waiting["tokens"] = f'<div class="kv-tv-empty">Recording {parts_in_words(parts)} for this run …</div>'
        yield page.resolve(waiting)
        try:
            recorded, line = record_parts(lab, reading, parts, request.session_hash if request else "")
        except Exception as error:  # noqa: BLE001 (said in the tab; the page keeps what it showed)
            LOG.exception("recording what crossed for the tab failed")
            recorded, line = None, f"Could not record what this tab shows ({type(error).__name__}: {error})."
        failed = {f"recorded_{tab}": line}
        if tab == "tokens":
            failed["tokens"] = f'<div class="kv-tv-empty">{html.escape(line)}</div>'
        yield page.resolve({"recorded": recorded} if recorded is not None else failed)

    def show_recorded(recorded, reading, names, view):
        """The run on the page with what the tab recorded, while the page still shows that run."""
        merged = with_recorded(reading, recorded)
        if merged is None:
            return {"recorded": None} if recorded is not None else {}
        updates = lab.tab_view(view.get("tab", spec.DEFAULT_TAB), merged, names or [], view)
        updates.pop("tab")
        return {**updates, "results": merged.payload, "reading": merged, "recorded": None}

    outputs = [page["recorded"], page["status"], page["tokens"], *(page[f"recorded_{tab}"] for tab in spec.TAB_PARTS)]
    for number, event in enumerate(lab.tab_events):
        suffix = "" if number == 0 else f"_{number}"
        recorded = event.then(record_for_tab, inputs=[page["reading"], page["view"]], outputs=outputs,
                              api_name=f"record_for_tab{suffix}", concurrency_id=spec.RUN_QUEUE,
                              concurrency_limit=policy.PAGE_RUNS_AT_ONCE, **PRIVATE)
        shown = recorded.then(resolved(page, show_recorded),
                              inputs=[page["recorded"], page["reading"], page["chosen"], page["view"]],
                              outputs=drawn_outputs(page, ("recorded",)), api_name=f"show_recorded{suffix}", **PRIVATE)
        lab.result_events.append(shown)
