"""What a workshop exercise shows before and after its reveal, and the pages' handling of a code."""

from __future__ import annotations

import json

import pytest

from kvviz.app.exercises import EXERCISES, answer_of, stored_results
from kvviz.app.page import links
from kvviz.app.workshop import facts, pages
from kvviz.store.values import MAX_NAME

SHIPPED = EXERCISES.exercises


@pytest.mark.parametrize("exercise", SHIPPED, ids=[e.key for e in SHIPPED])
def test_the_card_before_the_reveal_holds_no_answer_and_the_reveal_holds_the_runs(exercise):
    card = json.dumps(facts.card(exercise, 1))
    assert exercise.explain not in card and "expected" not in card
    revealed = facts.reveal(exercise)
    assert revealed["value"] == answer_of(exercise, stored_results(exercise))
    assert revealed["explain"] == exercise.explain and revealed["said"]
    link = links.permalink_state([], dict(part.split("=", 1) for part in revealed["lab_link"][2:].replace("%2C", ",").split("&")))
    assert link["preset"] == exercise.preset and set(facts.columns_of(exercise)) <= set(link["h"])


def test_a_code_in_a_page_address_is_reduced_to_letters_and_digits():
    page = pages.learner("ab<script>alert(1)</script>")
    assert "<script>alert" not in page and 'data-code="ABSCRIPTALER"' in page
    assert 'data-code="XY12"' in pages.host("xy-12") and 'class="projector"' in pages.projector("xy12")
    assert f'maxlength="{MAX_NAME}"' in page  # the name box takes what the server takes


def test_the_pages_run_their_own_files_only():
    for page in (pages.landing(), pages.learner("ABC234"), pages.host("ABC234"), pages.projector("ABC234")):
        assert "<style" not in page and "<script>" not in page and " style=" not in page and "$" not in page
    assert "script-src" not in pages.HEADERS["Content-Security-Policy"]  # default-src 'self' covers scripts and styles
    assert all((pages.STATIC / name).is_file() for name in ("workshop.css", "common.js", "board.js", "host.js",
                                                             "learner.js", "landing.js", "projector.js"))
