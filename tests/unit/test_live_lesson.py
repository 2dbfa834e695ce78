"""A live run of a preset's question is read against the claims of the stored run whose settings it
repeats (``views.lesson_of``, ``kvviz.app.reading.against``): the line says the live run shows the
lesson, names the claims it contradicts, or says what it lacks to check the rest; at other settings
or against another expected answer it says the lesson is not checked. It never repeats the lesson
as if the live run had shown it."""

from dataclasses import replace

import pytest

from kvviz.app import lessons
from kvviz.app.page import views
from kvviz.app.presets import PRESETS, live_mode, preset
from kvviz.app.reading import catalog
from kvviz.app.reading.against import depends_on_swap, sort_claims
from kvviz.app.reading.reading import Swapped
from tests.stored_runs import STORED_BY_MODE

PRECOMPUTED = STORED_BY_MODE[live_mode()]  # the stored runs a page on this machine shows
STORED = views.PresetRuns(PRECOMPUTED, "embedded")


def live(reading, columns=None, swap: bool = False):
    """``reading`` as a live run at its stored settings would give it: not precomputed, only
    ``columns``, with its swap or without one."""
    kept = {name: column if swap else replace(column, swap=Swapped()) for name, column in reading.columns.items()
            if columns is None or name in columns}
    return replace(reading, precomputed=False, columns=kept, swap=reading.swap if swap else None, swap_shown=swap)


def lesson(reading) -> str:
    return views.lesson_of(reading, STORED)


def with_options(reading, handoff: str, **values):
    """``reading`` as run with other options for ``handoff`` (or other decoding, for "generation")."""
    request = dict(reading.request)
    if handoff == "generation":
        request["generation"] = {**request["generation"], **values}
    else:
        request["options"] = {**request["options"], handoff: {**request["options"].get(handoff, {}), **values}}
    return replace(reading, request=request)


def with_column(reading, name, **changed):
    return replace(reading, columns={**reading.columns, name: replace(reading.columns[name], **changed)})


def claimed_right(picked) -> str:
    return next(claim.question.column for claim in picked.claims
                if claim.question.kind == "verdict" and claim.expected == "right" and claim.question.column != "text")


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_the_stored_run_read_as_a_live_one_shows_its_own_lesson(key):
    _, _, reading = STORED(key)
    assert lesson(reading).startswith("**Lesson:**") and views.lesson_of(reading).startswith("**Lesson:**")
    assert lesson(live(reading, swap=True)).startswith("**Lesson** (this run shows it too)")


@pytest.mark.parametrize("picked", PRESETS, ids=lambda p: p.key)
def test_a_live_run_at_the_presets_ticks_without_its_swap_says_what_it_cannot_check(picked):
    _, _, reading = STORED(picked.key)
    run = live(reading, picked.columns)
    line = lesson(run)
    held, contradicted, unanswered = sort_claims(run, picked.claims, picked.swap is not None, False)
    assert not contradicted and "shows otherwise" not in line
    if not unanswered:
        assert line.startswith("**Lesson** (this run shows it too)")
        return
    rest = "the other one needs" if len(unanswered) == 1 else f"the other {len(unanswered)} need"
    assert f"agrees with {len(held)} of the lesson's {len(picked.claims)} checks, and {rest} " in line
    needs_swap = picked.swap is not None and any(depends_on_swap(claim) for claim in picked.claims)
    assert ("the preset's swap" in line) == needs_swap
    if picked.swap is not None:  # what only a swap shows is not claimed for a run without one
        assert all(claim in unanswered for claim in picked.claims if depends_on_swap(claim))


def test_a_live_run_that_contradicts_the_lesson_names_the_column_and_both_answers():
    picked = PRESETS[0]
    _, _, reading = STORED(picked.key)
    right = claimed_right(picked)
    line = lesson(with_column(live(reading, swap=True), right, mark="wrong"))
    assert line.startswith("**The preset's lesson**, from its precomputed run.") and "**This run shows otherwise**" in line
    assert f"{catalog.label_of(right)}: right in the lesson, wrong here" in line


def test_a_failed_column_is_not_a_contradiction_but_a_point_it_cannot_check():
    picked = PRESETS[0]
    _, _, reading = STORED(picked.key)
    right = claimed_right(picked)
    line = lesson(with_column(live(reading, swap=True), right, mark="failed"))
    assert "shows otherwise" not in line and f"a result from {catalog.label_of(right)}" in line


def test_what_the_note_got_through_by_is_not_checked_without_every_column_it_names_and_its_control():
    """A column whose control did not run cannot be said to have got the note through: the lesson's
    "got through by" waits for it, and the line names the control."""
    picked = next(p for p in PRESETS if any(c.question.kind == "crossed" and c.expected for c in p.claims))
    _, _, reading = STORED(picked.key)
    crossed = next(c for c in picked.claims if c.question.kind == "crossed")
    one = next(name for name in crossed.expected if catalog.control_of(name))
    control = catalog.control_of(one)
    partial = live(reading, set(reading.columns) - {control}, swap=True)
    partial = with_column(partial, one, evidence="unchecked")  # as a run without its control reads it
    held, contradicted, unanswered = sort_claims(partial, [crossed], True, True)
    assert unanswered == [crossed] and not held and not contradicted
    assert catalog.label_of(control) in views.needed_for(partial, [crossed], True, True)


def test_a_column_with_no_result_on_the_swap_leaves_its_swap_claims_unchecked():
    picked = next(p for p in PRESETS if p.swap and any(c.question.kind == "follow" for c in p.claims))
    _, _, reading = STORED(picked.key)
    follow = next(c for c in picked.claims if c.question.kind == "follow")
    run = with_column(live(reading, swap=True), follow.question.column, swap=Swapped())
    assert sort_claims(run, [follow], True, True)[2] == [follow]


def test_a_swap_outcome_it_contradicts_is_said_in_words():
    """"followed in the lesson, neither here" reads as nothing: each outcome is said as the card says it."""
    picked = next(p for p in PRESETS if p.swap and any(c.question.kind == "follow" and c.expected == "followed"
                                                        for c in p.claims))
    _, _, reading = STORED(picked.key)
    follow = next(c for c in picked.claims if c.question.kind == "follow" and c.expected == "followed")
    column = reading.columns[follow.question.column]
    run = with_column(live(reading, swap=True), follow.question.column,
                      swap=replace(column.swap, outcome="neither", answer="Paris"))
    line = lesson(run)
    assert "**This run shows otherwise**" in line
    assert f"{catalog.label_of(follow.question.column)} on the swap: followed in the lesson, gave neither answer here" in line


def test_another_swap_than_the_presets_does_not_answer_what_its_swap_showed():
    picked = next(p for p in PRESETS if p.swap and p.swap_words)
    _, _, reading = STORED(picked.key)
    other = live(reading, swap=True)
    other = replace(other, swap={**other.swap, "changed": "something -> else"})
    line = lesson(other)
    assert "the preset's swap" in line and "shows otherwise" not in line


def test_a_preset_without_a_swap_checks_its_evidence_without_one():
    """A shared question has no note to swap: its stored run has none, and a live run answers its
    evidence and crossing claims as the stored run did."""
    picked = next(p for p in PRESETS if p.swap is None and any(depends_on_swap(c) for c in p.claims))
    _, _, reading = STORED(picked.key)
    held, contradicted, unanswered = sort_claims(live(reading), picked.claims, False, False)
    assert len(held) == len(picked.claims) and not contradicted and not unanswered


def test_at_other_settings_or_against_another_expected_answer_the_lesson_is_not_checked():
    picked = PRESETS[0]
    _, _, reading = STORED(picked.key)
    broken = with_column(live(reading, swap=True), claimed_right(picked), mark="wrong")
    other_settings = lesson(with_options(broken, "kvcomm", ratio=0.2))
    assert "other settings" in other_settings and "shows otherwise" not in other_settings
    other_answer = lesson(replace(broken, answers=("9999",)))
    assert "another expected answer" in other_answer and "shows otherwise" not in other_answer
    unmarked = lesson(replace(broken, answers=()))
    assert "unmarked" in unmarked and "shows otherwise" not in unmarked
    assert "not checked" in views.lesson_of(broken)  # no stored runs to read it against


def test_settings_that_cannot_change_the_runs_columns_do_not_count_as_other_settings():
    """The temperature of a greedy run and the options of a handoff it did not run change nothing."""
    picked = PRESETS[0]
    _, _, reading = STORED(picked.key)
    run = live(reading, picked.columns, swap=True)
    unrun = next(name for name in (run.request.get("options") or {}) if name not in run.columns
                 and catalog.control_of(name) not in run.columns)
    for changed in (with_options(run, "generation", temperature=1.3), with_options(run, unrun, unlikely_option=1)):
        assert "other settings" not in lesson(changed)
    assert "other settings" in lesson(with_options(run, "generation", max_new_tokens=5))


def test_a_live_run_at_a_stored_what_if_runs_settings_is_read_against_that_runs_claims():
    """The locker's lesson says KVComm at ratio 0.3 answers 12 with 6 layers: a run there shows the
    lesson, though the main run's claims (right, 9 layers) would not hold."""
    picked = preset("locker")
    run = picked.runs[-1]
    _, _, main = STORED("locker")
    entry = PRECOMPUTED["presets"]["locker"]["runs"][run.label]
    stored = lessons.stored_reading(picked, entry)
    what_if = with_options(replace(stored, precomputed=False, preset="locker", request=main.request, pair=main.pair),
                           "kvcomm", **run.options["kvcomm"])
    assert lesson(what_if).startswith(f"**Lesson** (this run shows it too, at the settings of its stored run *{run.label}")
    at_main = replace(what_if, request=main.request)
    assert "shows otherwise" in lesson(at_main)


def test_which_stored_run_a_live_request_repeats_the_settings_of():
    picked = preset("locker")
    payload, _, _ = STORED("locker")
    request, pair, columns = payload["request"], payload["pair"], list(picked.columns)
    assert views.stored_settings(picked, payload, request, pair, columns) == ""
    for run in picked.runs:
        options = {**request["options"], "kvcomm": {**request["options"]["kvcomm"], **run.options["kvcomm"]}}
        assert views.stored_settings(picked, payload, {**request, "options": options}, pair, columns) == run.label
        assert views.stored_settings(picked, payload, {**request, "options": options}, pair, ["text"]) == ""
    odd = {**request["options"], "kvcomm": {**request["options"]["kvcomm"], "ratio": 0.2}}
    assert views.stored_settings(picked, payload, {**request, "options": odd}, pair, columns) is None
    shorter = {**request, "generation": {**request["generation"], "max_new_tokens": 8}}
    assert views.stored_settings(picked, payload, shorter, pair, columns) is None
    assert views.stored_settings(picked, payload, request, "another-pair", columns) is None


def test_a_saved_run_reopened_from_its_link_is_read_against_the_lesson_too():
    from kvviz.app.page import saved

    picked = preset("locker")
    payload, _, reading = STORED("locker")
    saved_payload = dict(payload, precomputed=False, stamp="saved")
    updates = saved.restored_run("abc123", saved_payload, list(picked.columns), list(picked.answers), STORED)
    assert updates["lesson"].startswith("**Lesson** (this run shows it too)")
    odd = dict(saved_payload, request=with_options(reading, "kvcomm", ratio=0.2).request)
    assert "other settings" in saved.restored_run("abc123", odd, list(picked.columns), list(picked.answers), STORED)["lesson"]
