"""``python -m kvviz run``'s table: every applicable column is printed with its method's own notes
(the layers KVComm sent, the message text wrote), a column that does not apply with its reason."""

from __future__ import annotations

from kvviz.commands import format_table
from kvviz.core.results import GenerationSettings, HandoffRequest
from kvviz.engine.runner import run_handoff
from tests.conftest import tiny_pair


def test_the_run_table_prints_each_handoffs_answer_and_its_notes():
    pair = tiny_pair("llama")
    request = HandoffRequest(query="Where is the key?", context="The key is under the mat.",
                             generation=GenerationSettings(max_new_tokens=2))
    results = [run_handoff(name, pair, request) for name in ("receiver", "kvcomm", "text")]
    lines = format_table(results).splitlines()
    assert lines[0].split()[:2] == ["handoff", "answer"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) >= {"receiver", "kvcomm", "text"}
    assert "layers" in rows["kvcomm"].lower()  # KVComm's own note: which layers it sent
