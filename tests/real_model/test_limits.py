"""Input limits with the real tokenizers: typed special tokens are read as plain text."""

from __future__ import annotations

import pytest

from kvviz.core.prompts import build_segments
from tests.conftest import embedded_models_missing
from tests.unit.test_limits import SPECIAL_STRINGS  # noqa: F401 (fixtures and helpers shared with the unit tests)


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_the_real_tokenizers_read_typed_special_tokens_as_text(model):
    from transformers import AutoTokenizer

    from kvviz.runtime.models import converted_dir, is_prepared

    if not is_prepared(model):
        embedded_models_missing(f"{model} is not prepared (python -m kvviz prepare)")
    tokenizer = AutoTokenizer.from_pretrained(converted_dir(model))
    special_ids = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(s) for s in SPECIAL_STRINGS}
    special_ids.discard(tokenizer.unk_token_id)
    plain = [t for t in build_segments(tokenizer, "hello").input_ids if t in special_ids]
    typed = build_segments(tokenizer, " ".join(SPECIAL_STRINGS), " ".join(SPECIAL_STRINGS))
    assert [t for t in typed.input_ids if t in special_ids] == plain
