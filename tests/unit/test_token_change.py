"""Each method beside its control, token by token (issue 22): ``token_change``, on the tiny models.

The control's side is teacher forcing on a copy of its prompt state (``decode.answer_logprobs``): it
must equal the log-softmax of a full forward over prompt + answer and leave the state it scores on as
it was; the method's side is scored on the states its decode chose the tokens from, so a handoff
beside a control that reads the same prompt changes by 0 (up to float rounding)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvviz.app import tokenview
from kvviz.core.prompts import build_segments
from kvviz.engine import stream
from kvviz.engine.events import Done, Scored
from kvviz.engine.runner import run_handoff
from kvviz.handoffs import registry
from kvviz.runtime import crossed
from kvviz.runtime.cache import KVState
from kvviz.runtime.decode import answer_logprobs, prefill
from tests.unit.test_crossed import CONTEXT, QUERY, pair, request  # noqa: F401 (pair: the tiny pairs' fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def full_forward_logprobs(loaded, prompt: list[int], answer: list[int]) -> list[float]:
    """Each answer token's log-probability from one plain forward over prompt + answer."""
    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor([prompt + answer])).logits[0].float()
    rows = torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(answer)], dim=-1)
    return rows.gather(1, torch.tensor(answer)[:, None])[:, 0].tolist()


def test_teacher_forced_scores_equal_a_full_forward_and_leave_the_state_alone(pair):
    loaded = pair.receiver
    prompt = build_segments(loaded.tokenizer, QUERY, CONTEXT).input_ids
    state = KVState()
    first, _ = prefill(loaded, state, prompt)
    answer = [5, 17, 3, 11]
    before = (state.next_position, state.cache.layers[0].keys.clone())
    scored = answer_logprobs(loaded, state, first.hidden, answer)
    assert scored == pytest.approx(full_forward_logprobs(loaded, prompt, answer), abs=1e-4)
    assert state.next_position == before[0] and torch.equal(state.cache.layers[0].keys, before[1])
    assert all(value <= 0 for value in scored)


def test_a_method_is_scored_against_its_control_in_the_same_run(pair):
    text, receiver = stream.results(pair, request({}), ["text", "receiver"])
    change = text.token_change
    assert change["control"] == "receiver" == registry.control_of("text")
    count = min(len(text.answer_ids), crossed.MAX_CHANGE_TOKENS)
    assert change["ids"] == text.answer_ids[:count] and len(change["change"]) == count
    assert change["change"] == pytest.approx([a - b for a, b in zip(change["logprob"], change["control_logprob"])], abs=2e-4)
    # the control's scores are the text answer's tokens read by the receiver alone
    alone = build_segments(pair.receiver.tokenizer, QUERY, None).input_ids
    assert change["control_logprob"] == pytest.approx(
        full_forward_logprobs(pair.receiver, alone, change["ids"]), abs=1e-3)
    assert receiver.token_change == {}  # a control is not scored against anything
    assert "teacher-forced" in change["measured_on"] and "this run" in change["measured_on"]


def test_a_handoff_beside_a_control_that_reads_the_same_prompt_changes_by_zero(pair, monkeypatch):
    skyline = registry.get("skyline")

    def run_twin(pair, request, io):
        return dataclasses.replace(skyline.run(pair, request, io), handoff="skyline_twin")

    twin = dataclasses.replace(skyline, name="skyline_twin", control="skyline", run=run_twin)
    monkeypatch.setitem(registry.HANDOFFS, "skyline_twin", twin)
    ran, twin_result = stream.results(pair, request({}), ["skyline", "skyline_twin"])
    change = twin_result.token_change
    assert change["control"] == "skyline" and change["ids"] == ran.answer_ids[: len(change["ids"])]
    # the twin scores as its decode chose, skyline teacher-forced: equal up to float rounding
    assert change["change"] and all(abs(value) < 2e-3 for value in change["change"])
    assert ran.token_change == {}  # its own control (the receiver) did not run


def test_no_change_without_the_control_or_without_recording(pair):
    assert stream.results(pair, request({}), ["kvcomm"])[0].token_change == {}
    plain = stream.results(pair, request(None), ["text", "receiver"])
    assert all(result.token_change == {} for result in plain)


def test_the_kvcomm_control_reads_another_context_and_kvcomm_is_compared_with_it(pair):
    kvcomm, control = stream.results(pair, request({}), ["kvcomm", "kvcomm_control"])
    assert control.handoff == "kvcomm_control" and control.applicable
    assert control.details["control_context"] not in (None, CONTEXT)
    assert control.token_attention["sent_tokens"] != kvcomm.token_attention["sent_tokens"]
    assert kvcomm.token_change["control"] == "kvcomm_control"
    assert control.layers and [r["selected"] for r in control.layers] == [r["selected"] for r in kvcomm.layers]
    refused = run_handoff("kvcomm_control", pair, dataclasses.replace(request({}), context=None))
    assert not refused.applicable and refused.handoff == "kvcomm_control"


def test_a_streamed_run_sends_the_change_after_the_handoffs(pair):
    events = [event for batch in stream.run(pair.name, request({}), ["text", "receiver"], loaded=pair) for event in batch]
    kinds = [type(event) for event in events]
    assert kinds.count(Scored) == 1 and kinds.index(Scored) > max(i for i, k in enumerate(kinds) if k is Done)
    name, data = next((event.handoff, event.token_change) for event in events if isinstance(event, Scored))
    assert name == "text" and data["control"] == "receiver"


def test_every_declared_control_is_a_registered_handoff_without_a_control_of_its_own():
    for handoff in registry.all_handoffs():
        if handoff.control:
            assert handoff.control in registry.HANDOFFS, handoff.name
            assert registry.control_of(handoff.control) == "", handoff.control
            assert handoff.name in registry.controlled_by(handoff.control)


# --- the page's row ------------------------------------------------------------------------------


def result_with_change(values: list[float]) -> dict:
    tokens = [f"t{i}" for i in range(len(values))]
    return {"handoff": "c2c", "applicable": True, "answer": " ".join(tokens),
            "token_attention": {"nothing_sent": "nothing was sent as tokens", "answer_tokens": tokens, "attention": []},
            "token_change": {"control": "c2c_control", "control_title": "C2C control", "tokens": tokens,
                             "ids": list(range(len(values))), "logprob": [0.0] * len(values),
                             "control_logprob": [-v for v in values], "change": values, "measured_on": "teacher-forced"}}


def test_the_row_shades_each_token_by_its_change_and_names_the_largest():
    html = tokenview.token_view_html(result_with_change([0.2, 3.0, -2.0]))
    assert html.count('class="kv-tv-chg"') == 3
    assert tokenview.change_shade(3.0).startswith("rgba(0, 158, 115") and tokenview.change_shade(-2.0).startswith("rgba(213, 94, 0")
    assert tokenview.change_shade(8.0) == tokenview.change_shade(4.0)  # full shade at CHANGE_FULL
    assert "2 of 3 tokens changed" in html and "&#x27;t1&#x27; +3.00 nats" in html and "vs C2C control" in html


def test_the_row_says_which_column_to_tick_when_the_control_did_not_run():
    result = result_with_change([1.0])
    result.pop("token_change")
    html = tokenview.token_view_html(result)
    assert "Tick <b>C2C control</b>" in html and "kv-tv-chg" not in html
    control = {**result_with_change([1.0]), "handoff": "c2c_control"}
    control.pop("token_change")
    assert "is the control of C2C" in tokenview.token_view_html(control)
