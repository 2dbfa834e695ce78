"""CIPHER's receiver reads its vectors where the text handoff's receiver reads the message, in the
same prompt (kvviz/handoffs/cipher.py, ``kvviz.core.prompts.split_at_context``).

Found by the page audit (issue 21): the slot marker CIPHER split its prompt on was made of U+2063,
which ``kvviz.core.prompts.users_words`` removes from user text, so the split ate the ends of the user
marks around it and the receiver read ``kvviz-user`` ... ``kvviz-user-end`` as tokens on both sides
of its vectors (and "What each model saw" showed them). The prompt is now split on the slot as
``render`` marks it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvviz.core.prompts import build_segments, split_at_context, unmark
from kvviz.core.results import HandoffRequest
from kvviz.handoffs.cipher import message as cipher_message
from tests.tiny_models import tiny_tokenizer

QUERY = "What is the code for locker 12?"
MESSAGE = "Locker twelve opens with four four seven one."


@pytest.mark.parametrize("chat", [False, True], ids=["base", "chat"])
def test_the_receiver_reads_its_vectors_where_the_text_handoff_reads_the_message(chat):
    tokenizer = tiny_tokenizer(chat=chat)
    before_ids, after_ids, before, after = cipher_message.receiver_pieces(SimpleNamespace(tokenizer=tokenizer), HandoffRequest(query=QUERY))
    text_prompt = build_segments(tokenizer, QUERY, context=MESSAGE).text  # the text handoff's receiver prompt
    assert "kvviz" not in before + after
    assert before + MESSAGE + after == text_prompt
    assert "kvviz" not in tokenizer.decode(before_ids + after_ids)


def test_a_query_that_spells_the_slot_is_read_as_the_query():
    tokenizer = tiny_tokenizer(chat=False)
    before, after = split_at_context(tokenizer, "kvviz-context-slot")
    assert unmark(before) + "the words" + unmark(after) == build_segments(tokenizer, "kvviz-context-slot", context="the words").text
