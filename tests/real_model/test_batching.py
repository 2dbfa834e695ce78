"""The shared decode on the embedded pair: every handoff gets, in a shared batch, the tokens it gets
alone on every preset (the unit tests, tests/unit/test_batching.py, do the same on tiny models).
"""

from __future__ import annotations

import pytest

from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from tests.unit.test_batching import run_together  # noqa: F401 (fixtures and helpers shared with the unit tests)

QUERY, CONTEXT = "Where does Mira keep her bicycle?", "Mira keeps her red bicycle in the garden shed behind the old library."


@pytest.mark.real_model
def test_every_handoff_gets_the_same_tokens_in_a_shared_batch_on_the_embedded_presets(embedded_pair, one_thread):
    """The embedded pair's presets: every handoff alone, then all of a preset's handoffs at once
    (Gemma-3-270M and SmolLM2-135M each decode in one shared batch): identical answers; and the
    steps were shared. (The bitwise comparison behind it: research/speed_prototype.py step-check --embedded.)"""
    from kvviz.app.presets import PRESETS

    names = [handoff.name for handoff in registry.all_handoffs()]
    largest = 0
    for preset in PRESETS:
        request = registry.build_request(preset.query, preset.context, 16)
        alone = {name: run_handoff(name, embedded_pair, request) for name in names}
        together = run_together(embedded_pair, request, names)
        for name in names:
            assert together[name].answer_ids == alone[name].answer_ids, (preset.key, name)
            largest = max([largest] + [b["max_size"] for b in together[name].details.get("decode_batches", []) if b["batched"]])
    assert largest >= 4
