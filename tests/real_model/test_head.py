"""The output head on the embedded models: the fast greedy path picks exactly the token the full head
picks, and the fast log-probabilities are within a hundredth of a nat.
"""

from __future__ import annotations

import pytest
import torch


@pytest.mark.real_model
def test_fast_greedy_decoding_equals_the_full_head_on_the_embedded_models(embedded_pair):
    """Real decode states of both embedded models: every greedy step picks the full head's token."""
    from kvviz.core.prompts import build_segments
    from kvviz.runtime import cache as kv
    from kvviz.runtime.decode import prefill

    questions = ["What is the capital of France?", "Write one sentence about the sea.", "What is 12 + 30?"]
    for loaded in (embedded_pair.receiver, embedded_pair.sharer):
        assert loaded.head.scan_index() is not None
        for question in questions:
            state = kv.KVState()
            step, _ = prefill(loaded, state, build_segments(loaded.tokenizer, question).input_ids)
            for _ in range(12):
                token = loaded.head.greedy_token(step.hidden)
                assert token == int(torch.argmax(step.logits)), (loaded.name, question)
                step, _ = prefill(loaded, state, [token])


@pytest.mark.real_model
def test_log_probabilities_on_the_embedded_models_are_within_a_hundredth_of_a_nat(embedded_pair):
    """The run's log-probabilities (token_change, the logit lens) on real prompt states: the fast
    normaliser against the exact log-softmax, for the likeliest token and for a random one."""
    from kvviz.core.prompts import build_segments

    torch.manual_seed(4)
    for loaded in (embedded_pair.receiver, embedded_pair.sharer):
        ids = build_segments(loaded.tokenizer, "What is the code for locker 12?", "The code for locker 12 is 4471.").input_ids
        with torch.no_grad():
            hidden = loaded.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        exact = torch.log_softmax(loaded.head.logits(hidden), dim=-1)
        tokens = torch.stack([exact.argmax(-1), torch.randint(0, exact.shape[1], (hidden.shape[0],))], dim=1)
        fast = loaded.head.log_probability_table(hidden, tokens)
        assert torch.allclose(fast, exact.gather(1, tokens), atol=0.01), loaded.name
