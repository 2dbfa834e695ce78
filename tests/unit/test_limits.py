"""Input limits (kvviz.core.limits) and public mode (kvviz.core.policy): every refusal says what is allowed.

These are the request-level checks every surface shares; tests/integration/test_reliability.py sends the same
bad inputs through the real server and checks that the next request still succeeds.
"""

from __future__ import annotations

import os

import pytest

from kvviz.core import limits, policy
from kvviz.core.prompts import build_segments
from kvviz.core.results import GenerationSettings
from kvviz.engine import runner
from kvviz.handoffs import registry
from kvviz.handoffs.c2c import locate as c2c_locate
from kvviz.runtime.models import PAIRS, resolve_pair
from tests.tiny_models import tiny_tokenizer

SPECIAL_STRINGS = ("<|im_start|>", "<|im_end|>", "<bos>", "<eos>", "<end_of_turn>", "<start_of_turn>")


@pytest.fixture
def local(monkeypatch):
    monkeypatch.delenv("KVVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)


@pytest.fixture
def public(monkeypatch):
    monkeypatch.setenv("KVVIZ_PUBLIC", "1")


def build(query="What is the capital of France?", context=None, **settings):
    """A request from the shared settings; ``message_tokens`` is the text handoff's option."""
    options = dict(settings.pop("options", None) or {})
    if "message_tokens" in settings:
        options["text"] = {"message_tokens": settings.pop("message_tokens")}
    return registry.build_request(query, context, options=options, **settings)


@pytest.mark.parametrize("text", ["مرحبا، ما هي عاصمة فرنسا؟", "שלום עולם", "Emoji 🚀👩🏽‍💻🇫🇷 ok?", "naïve café Ωμέγα 中文"])
def test_right_to_left_text_and_emoji_are_kept_as_typed(local, text):
    request = build(text, context=f"{text} (context)")
    assert request.query == text and request.context == f"{text} (context)"


def test_control_characters_are_removed_and_line_breaks_kept(local):
    request = build("Hi\x00 there\x1b[31m?\r\nSecond\tline\x0c", context="a\x7fb\u0085c")
    assert request.query == "Hi there[31m?\nSecond\tline"
    assert request.context == "abc"


@pytest.mark.parametrize("query", ["", "   ", "\n\t  \r\n", "\x00\x07\x1b", "\u200b\u200f\u2063"])
def test_an_empty_or_invisible_query_is_refused(local, query):
    with pytest.raises(ValueError, match="The query is empty: type a question"):
        build(query)


def test_a_lone_surrogate_is_refused_with_its_position(local):
    with pytest.raises(ValueError, match=r"position 4 \(a lone UTF-16 surrogate, U\+D800\)"):
        build("abc\ud800def")
    with pytest.raises(ValueError, match="The context holds an invalid character"):
        build("Q?", context="\udfff")


def test_bidirectional_controls_are_removed_and_right_to_left_letters_kept(local):
    request = build("Is \u202etxt.exe\u202c safe? \u2067שלום\u2069 \u200fok\u200e \u061c")
    assert request.query == "Is txt.exe safe? שלום ok"


def test_a_one_line_field_follows_the_same_rule_with_its_whitespace_as_single_spaces():
    assert limits.clean_line("  Ada\x00 \u202eLove\r\nlace\t ", "The name", 24) == "Ada Love lace"
    with pytest.raises(ValueError, match="The name is 30 characters; the limit is 24."):
        limits.clean_line("x" * 30, "The name", 24)
    with pytest.raises(ValueError, match=r"The title holds an invalid character at position 2 \(a lone UTF-16 surrogate"):
        limits.clean_line("a\udc00", "The title", 200)
    assert limits.has_surrogate("x\ud83d") and not limits.has_surrogate("x🚀")


def test_text_longer_than_its_limit_is_refused_with_the_limit(local):
    with pytest.raises(ValueError, match=f"The query is 4001 characters; the limit is {limits.MAX_QUERY_CHARS}"):
        build("x" * 4001)
    with pytest.raises(ValueError, match=f"The context is 16001 characters; the limit is {limits.MAX_CONTEXT_CHARS}"):
        build("Q?", context="y" * 16001)


def test_a_query_of_special_token_strings_is_text(local):
    request = build(" ".join(SPECIAL_STRINGS))
    assert request.query == " ".join(SPECIAL_STRINGS)


@pytest.mark.parametrize("chat", [True, False])
def test_a_users_special_token_string_never_becomes_the_special_token(chat):
    """The template's own special tokens stay special; the user's "<|im_start|>" is characters."""
    tokenizer = tiny_tokenizer(chat=chat)
    special = {tokenizer.convert_tokens_to_ids(s) for s in ("<|im_start|>", "<|im_end|>", "<bos>", "<eos>")}
    plain = build_segments(tokenizer, "hello", "world")
    template_specials = [t for t in plain.input_ids if t in special]
    for typed in SPECIAL_STRINGS[:4]:
        segments = build_segments(tokenizer, f"{typed}hello{typed}", f"{typed} world")
        assert [t for t in segments.input_ids if t in special] == template_specials, typed
        assert segments.text.count(typed) == plain.text.count(typed) + 3  # the text keeps what was typed
        assert typed in tokenizer.decode(segments.query_ids)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_new_tokens": 0}, "Max new tokens must be between 1 and 1024, got 0"),
        ({"max_new_tokens": 5000}, "Max new tokens must be between 1 and 1024, got 5000"),
        ({"max_new_tokens": "many"}, "Max new tokens: 'many' is not an integer"),
        ({"max_new_tokens": 2.5}, "Max new tokens: 2.5 is not an integer"),
        ({"temperature": 0.0, "sample": True}, "Temperature must be between 0.05 and 2, got 0"),
        ({"temperature": float("nan")}, "Temperature must be between 0.05 and 2, got nan"),
        ({"temperature": 9}, "Temperature must be between 0.05 and 2, got 9"),
        ({"seed": -1}, "Seed must be between 0 and 4294967295, got -1"),
        ({"seed": 2**40}, "Seed must be between 0 and 4294967295"),
        ({"message_tokens": 0}, "Message length bound .tokens. must be between 1 and 512, got 0"),
        ({"options": {"kvcomm": {"ratio": 1.5}}}, "KVComm ratio r .share of layers sent. must be between 0 and 1, got 1.5"),
        ({"options": {"kvcomm": {"ratio": "inf"}}}, "must be between 0 and 1, got inf"),
        ({"options": {"kvcomm": {"alpha": -0.1}}}, "alpha .weight of attention vs prior. must be between 0 and 1"),
        ({"options": {"kvcomm": {"sigma": 0}}}, "sigma .width of the Gaussian prior, layers. must be between 0.5 and 30"),
        ({"options": {"kvcomm": {"strategy": "best"}}}, "'best' is not one of kvcomm, attention, prior, contiguous, random"),
        ({"options": {"kvcomm": {"layers": "a,b"}}}, "Explicit layers"),
        ({"options": {"ac": {"k": 1.5}}}, "AC sender layer k .* 1.5 is not an integer"),
        ({"options": {"ac": {"f": "max"}}}, "AC merge f: 'max' is not one of replace, sum, mean"),
        ({"options": {"cipher": {"temperature": 3}}}, "CIPHER temperature .* must be between 0 and 2, got 3"),
    ],
)
def test_every_setting_out_of_range_says_what_is_allowed(local, settings, message):
    with pytest.raises(ValueError, match=message):
        build(**settings)


def test_generation_settings_check_themselves():
    with pytest.raises(ValueError, match="Max new tokens must be between 1 and 1024"):
        GenerationSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match="top-p must be between 0.01 and 1"):
        GenerationSettings(top_p=0)


def test_a_context_longer_than_the_pairs_budget_is_refused_with_the_limit(local, monkeypatch):
    from tests.conftest import tiny_pair

    pair = tiny_pair("llama")
    long_context = "The secret code word is pineapple. " * 60
    request = build("What is the secret code word?", context=long_context, max_new_tokens=8, message_tokens=8)
    with pytest.raises(ValueError, match=r"The prompt \(context and question\) is \d+ tokens for tiny-llama; this pair takes at most 496 \(tiny-llama reads 512 positions, less 16 for the answer and message\)\. Shorten it by about \d+ tokens"):
        runner.check_fits(pair, request)
    monkeypatch.setattr(policy, "LOCAL", policy.Caps(64, 64, 100, None, 8))
    short = build("What is the secret code word?", context="The secret code word is pineapple. " * 20)
    with pytest.raises(ValueError, match="this pair takes at most 100 .the server's limit is 100 prompt tokens."):
        runner.check_fits(pair, short)
    runner.check_fits(pair, build("What is the secret code word?", context="It is pineapple."))


def test_public_mode_is_on_with_kvviz_public_or_on_a_space(monkeypatch):
    monkeypatch.delenv("KVVIZ_PUBLIC", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not policy.public_mode() and policy.caps() == policy.LOCAL
    monkeypatch.setenv("SPACE_ID", "someone/kvviz")
    assert policy.public_mode() and policy.caps() == policy.PUBLIC
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("KVVIZ_PUBLIC", "0")  # recorded, so that the test leaves it unset
    assert not policy.public_mode()
    policy.set_public_mode()
    assert os.environ["KVVIZ_PUBLIC"] == "1" and policy.public_mode()


@pytest.mark.parametrize("typed", ["smollm2-135m+gemma3-270m", "/tmp", "./models/llama", "Qwen/Qwen3-0.6B+Qwen/Qwen3-0.6B",
                                   "meta-llama/Llama-3.1-70B"])
def test_public_mode_offers_registered_pairs_only(public, typed):
    with pytest.raises(ValueError, match="This is a public server: choose one of the registered pairs"):
        resolve_pair(typed)
    assert resolve_pair("embedded").name == "embedded"


def test_public_mode_refuses_a_custom_fuser_folder(public):
    with pytest.raises(ValueError, match="custom fuser folders are turned off"):
        build(options={"c2c": {"fuser": "/tmp/my-fuser"}})
    assert c2c_locate.fuser_option(build()) is None


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"max_new_tokens": 65}, "Max new tokens must be between 1 and 64, got 65"),
        ({"message_tokens": 100}, "Message length bound .tokens. must be between 1 and 64, got 100"),
    ],
)
def test_public_mode_caps_tokens(public, settings, message):
    with pytest.raises(ValueError, match=message):
        build(**settings)


def test_public_mode_caps_the_prompt_in_tokens(public):
    from tests.conftest import tiny_pair

    request = build("What is the secret code word?", context="pineapple " * 600, max_new_tokens=8)
    with pytest.raises(ValueError, match=r"for tiny-llama; this pair takes at most 440 .* less 72 for the answer"):
        runner.check_fits(tiny_pair("llama"), request)
    assert policy.PUBLIC.max_prompt_tokens < policy.LOCAL.max_prompt_tokens


def test_every_registered_pair_is_allowed_in_public_mode(public):
    for name in PAIRS:
        assert resolve_pair(name).name == name


def test_model_concurrency_reads_the_environment(monkeypatch):
    monkeypatch.setenv("KVVIZ_CONCURRENCY", "3")
    assert policy.model_concurrency() == 3
    monkeypatch.setenv("KVVIZ_CONCURRENCY", "lots")
    with pytest.raises(ValueError, match="KVVIZ_CONCURRENCY must be a whole number"):
        policy.model_concurrency()
    monkeypatch.delenv("KVVIZ_CONCURRENCY")
    assert policy.model_concurrency() == policy.DEFAULT_CONCURRENCY > 1  # runs at once share decode steps
    monkeypatch.setenv("KVVIZ_BATCHED_DECODE", "0")  # without shared steps runs at once only compete
    assert policy.model_concurrency() == policy.DEFAULT_CONCURRENCY_UNSHARED == 1


def test_the_run_cache_size_reads_the_environment_and_zero_keeps_no_run(monkeypatch):
    from kvviz.engine.shared_runs import SharedRuns

    monkeypatch.setenv("KVVIZ_RUN_CACHE_MB", "1.5")
    assert policy.run_cache_bytes() == 1536 * 1024
    monkeypatch.setenv("KVVIZ_RUN_CACHE_MB", "0")
    assert SharedRuns(fingerprint_of=lambda pair: "f").cache.max_bytes == 0
    for bad, said in (("big", "must be a number of megabytes"), ("-1", "must be 0 or more")):
        monkeypatch.setenv("KVVIZ_RUN_CACHE_MB", bad)
        with pytest.raises(ValueError, match=said):
            policy.run_cache_bytes()
    monkeypatch.delenv("KVVIZ_RUN_CACHE_MB")
    assert policy.run_cache_bytes() == policy.DEFAULT_RUN_CACHE_MB * 1024 * 1024


def test_the_cli_refuses_the_same_inputs_with_the_same_messages(local, capsys, monkeypatch):
    from kvviz import cli

    for argv, message in [
        (["run", "--query", "  \x00 "], "The query is empty: type a question."),
        (["run", "--query", "Q?", "--ratio", "1.5"], "KVComm ratio r (share of layers sent) must be between 0 and 1, got 1.5."),
        (["run", "--query", "Q?", "--max-new-tokens", "0"], "Max new tokens must be between 1 and 1024, got 0."),
        (["run", "--query", "Q?", "--seed", "-3"], "Seed must be between 0 and 4294967295, got -3."),
    ]:
        assert cli.main(argv) == 2
        assert f"error: {message}" in capsys.readouterr().err
    monkeypatch.setenv("KVVIZ_PUBLIC", "1")
    assert cli.main(["run", "--query", "Q?", "--pair", "./my-models/a+./my-models/b"]) == 2
    assert "This is a public server: choose one of the registered pairs" in capsys.readouterr().err
