"""A live run of a preset's question is read against the preset's lesson (``views.lesson_of``): the
line says the live run shows it, names the claims it contradicts, or says what it would need to
answer the rest; it never repeats the lesson as if the live run had shown it."""

from dataclasses import replace

import pytest

from kvviz.app.page import views
from kvviz.app.presets import PRESETS, load_precomputed
from kvviz.app.reading import catalog
from kvviz.app.reading.against import depends_on_swap, judged, sort_claims
from kvviz.app.reading.reading import Swapped

STORED = views.PresetRuns(load_precomputed(), "embedded")


def live(reading, columns=None):
    """``reading`` as a live run would give it: not precomputed, no swapped note, only ``columns``."""
    kept = {name: replace(column, swap=Swapped()) for name, column in reading.columns.items()
            if columns is None or name in columns}
    return replace(reading, precomputed=False, swap=None, swap_shown=False, columns=kept)


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_the_stored_run_read_as_live_shows_its_own_lesson(key):
    _, _, reading = STORED(key)
    assert views.lesson_of(reading).startswith("**Lesson:**")
    assert views.lesson_of(replace(reading, precomputed=False)).startswith("**Lesson** (this live run shows it too)")


@pytest.mark.parametrize("picked", PRESETS, ids=lambda p: p.key)
def test_a_live_run_at_the_presets_ticks_says_what_it_cannot_answer(picked):
    _, _, reading = STORED(picked.key)
    has_swap = bool(picked.swap or picked.swap_words)
    line = views.lesson_of(live(reading, picked.columns))
    held, contradicted, unanswered = sort_claims(live(reading, picked.columns), picked.claims, swap_expected=has_swap)
    assert not contradicted
    if not unanswered:
        assert line.startswith("**Lesson** (this live run shows it too)")
        return
    assert "shows otherwise" not in line and f"agrees with {len(held)} of its {len(held) + len(unanswered)} claims" in line
    assert ("Swap the fact" in line) == (has_swap and any(depends_on_swap(claim) for claim in picked.claims))
    if has_swap:  # what only a swap shows is not claimed for a run without one
        assert all(claim in unanswered for claim in picked.claims if depends_on_swap(claim))
    unticked_claimed = {name for claim in unanswered if claim.question.kind != "crossed"  # judged on what ran
                        for name in claim.question.columns()} - set(picked.columns)
    for name in unticked_claimed:
        assert catalog.label_of(name) in line or "columns it did not run" in line


def test_a_live_run_that_contradicts_the_lesson_names_the_column_and_both_answers():
    picked = PRESETS[0]
    _, _, reading = STORED(picked.key)
    right = next(claim.question.column for claim in picked.claims
                 if claim.question.kind == "verdict" and claim.expected == "right")
    columns = dict(reading.columns)
    columns[right] = replace(columns[right], mark="wrong")
    line = views.lesson_of(replace(reading, precomputed=False, columns=columns))
    assert line.startswith("**The preset's lesson**, from its precomputed run") and "**This live run shows otherwise**" in line
    assert f"{catalog.label_of(right)}: right in the lesson, wrong here" in line


def test_a_crossed_claim_counts_only_the_columns_a_live_run_can_judge():
    """A column whose control did not run cannot be said to have crossed: the lesson's list is
    compared on the columns that ran with their controls."""
    picked = next(p for p in PRESETS if any(c.question.kind == "crossed" and c.expected for c in p.claims))
    _, _, reading = STORED(picked.key)
    crossed = next(c for c in picked.claims if c.question.kind == "crossed")
    one = crossed.expected[0]
    control = catalog.control_of(one)
    assert control, f"{one} has a control"
    columns = {name: column for name, column in reading.columns.items() if name != control}
    columns[one] = replace(columns[one], evidence="unchecked")  # as a run without its control reads it
    partial = replace(reading, precomputed=False, columns=columns)  # with its swapped note
    assert one not in judged(partial) and one not in partial.crossed()
    held, contradicted, _ = sort_claims(partial, [crossed], swap_expected=True)
    assert held == [crossed] and not contradicted


def test_a_preset_without_a_swap_judges_its_evidence_without_one():
    """A shared question has no note to swap: its stored run has none, and a live run answers its
    evidence and crossing claims as the stored run did."""
    picked = next(p for p in PRESETS if not (p.swap or p.swap_words) and any(depends_on_swap(c) for c in p.claims))
    _, _, reading = STORED(picked.key)
    held, contradicted, unanswered = sort_claims(live(reading), picked.claims, swap_expected=False)
    assert len(held) == len(picked.claims) and not contradicted and not unanswered
