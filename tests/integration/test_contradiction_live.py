"""Insert a contradiction through the page's own handler, on the real embedded pair (issue 43): the
locker preset's fluent default sentence, 8 tokens, three columns; every column is read on the
contradicted note with both answers' first-token probabilities, and the page shows it."""

from __future__ import annotations

import pytest

from kvviz.app import ui
from kvviz.app.page import views
from kvviz.app.page.running import page_stream_roles
from kvviz.app.presets import preset
from kvviz.data.contradictions import OUTCOMES

pytestmark = [pytest.mark.integration, pytest.mark.real_model]
NAMES = ["receiver", "text", "skyline"]


def test_insert_a_contradiction_runs_live_on_the_page_and_reads_each_column(embedded_pair):
    demo = ui.build_demo(sweep=None, default_max_new_tokens=8)
    page, picked = demo.kvviz_page, preset("locker")
    fields = views.swap_fields(picked)
    handler = next(fn for fn in demo.fns.values() if fn.api_name == "contradict_on_page").fn
    settings = [8, False, 0.7, 0] + [o.option.default if not o.option.auto else True for o in page.specs
                                     for _ in range(o.inputs)]
    request = type("Request", (), {"session_hash": "contradict-live"})()
    outputs = list(handler("embedded", picked.query, picked.context, "4471", NAMES, {"tab": "layers"},
                           fields["contra_sentence"], fields["contra_answer"], None, request, *settings,
                           *["" for _ in page_stream_roles()]))
    final = dict(zip(page_stream_roles(), outputs[-1][:-1]))
    reading = outputs[-1][-1]
    assert "contradicted note" in final["status"], final["status"]
    assert reading.contradiction["context"] == ("The code for locker 12 is 4471. The code for locker 12 is 3902. "
                                                "The gym closes at nine.")
    for name in NAMES:
        found = reading.column(name).contradicted
        assert found.ran and found.outcome in OUTCOMES, (name, found)
        assert 0.0 <= found.p_gold <= 1.0 and 0.0 <= found.p_counter <= 1.0 and found.p_gold + found.p_counter <= 1.0 + 1e-6
        assert found.p_gold_clean is not None and found.gold_token and found.counter_token and not found.same_first_token
        assert f'data-contradicted="{found.outcome}"' in final[f"head:{name}"]
        assert len(reading.result(name).answer_ids or []) <= 8
    # the receiver alone never reads the note: neither value, and the same probabilities with the sentence or
    # without; Skyline reads the note in its own prompt
    receiver = reading.column("receiver").contradicted
    assert receiver.outcome == "neither" and (receiver.p_gold, receiver.p_counter) == (receiver.p_gold_clean,
                                                                                        receiver.p_counter_clean)
    skyline = reading.column("skyline").contradicted
    assert skyline.p_counter > skyline.p_counter_clean  # the inserted sentence raises the counter's first token
