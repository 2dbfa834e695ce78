"""A fact about CIPHER's receiver prompt (kvviz/handoffs/cipher.py), found by the page audit
(issue 21): the receiver should read its vectors where the text handoff's receiver reads the
message, in the same prompt; today the prompt around the slot also holds the text of the user
marks (``kvviz-user``), which the receiver reads as tokens and "What each model saw" shows.

Cause: ``receiver_pieces`` renders the prompt with a slot marker made of U+2063 as the context;
``kvviz.prompts.users_words`` removes U+2063 from user text, so the marker loses its ends, and
splitting on it eats the U+2063 that close and open the user marks around it: ``unmark`` can no
longer find them. The mark below is strict: the fix makes the test pass, and then the mark goes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvviz.handoffs import cipher
from kvviz.prompts import build_segments
from kvviz.results import HandoffRequest
from tests.tiny_models import tiny_tokenizer

QUERY = "What is the code for locker 12?"
MESSAGE = "Locker twelve opens with four four seven one."


@pytest.mark.parametrize("chat", [False, True], ids=["base", "chat"])
@pytest.mark.xfail(strict=True, reason="the slot split leaves the user marks' text in the prompt (see the module docstring)")
def test_the_receiver_reads_its_vectors_where_the_text_handoff_reads_the_message(chat):
    tokenizer = tiny_tokenizer(chat=chat)
    before_ids, after_ids, before, after = cipher.receiver_pieces(SimpleNamespace(tokenizer=tokenizer), HandoffRequest(query=QUERY))
    text_prompt = build_segments(tokenizer, QUERY, context=MESSAGE).text  # the text handoff's receiver prompt
    assert "kvviz" not in before + after
    assert before + MESSAGE + after == text_prompt
    assert "kvviz" not in tokenizer.decode(before_ids + after_ids)
