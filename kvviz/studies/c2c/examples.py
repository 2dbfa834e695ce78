"""Training and held-out examples for C2C: a record's prompt aligned for fusion plus its response.

``split_records`` makes the train / held-out split from the arguments alone (so ``eval-fuser``
rebuilds a fuser's held-out split from its checkpoint config: ``heldout_examples``);
``build_examples`` aligns each record (``kvviz.handoffs.c2c.align``) and tokenises its response the way
the receiver would write it, skipping prompts that are too long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvviz.core.prompts import has_chat_template
from kvviz.data import handbook, load_dataset, recall
from kvviz.handoffs.c2c.align import TokenAlignment, align_prompt

# How train-fuser splits and cuts its data by default (kvviz.studies.c2c.train.DEFAULTS starts from these).
SPLIT_DEFAULTS = {
    "data": "dolly",
    "heldout": 64,
    "max_prompt_tokens": 128,
    "max_response_tokens": 48,
    "seed": 0,
}


@dataclass
class Example:
    id: str
    alignment: TokenAlignment
    response_ids: list[int]
    question: str = ""
    context: str | None = None
    receiver_sees_context: bool = True
    token_alignment: str = "longest"
    fuse_template: bool = False


def response_ids(tokenizer, response: str, limit: int) -> list[int]:
    """The response as the receiver would write it after its prompt (plus end-of-turn for chat models)."""
    text = response.strip()
    if has_chat_template(tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][: limit - 1]
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids.append(end if isinstance(end, int) and end != tokenizer.unk_token_id else tokenizer.eos_token_id)
        return ids
    # base models: the prompt ends with "Answer:"
    return tokenizer(" " + text, add_special_tokens=False)["input_ids"][:limit]


def make_example(
    pair, record, max_prompt_tokens: int, max_response_tokens: int, receiver_sees_context: bool = True,
    max_sharer_tokens: int | None = None, token_alignment: str = "longest", fuse_template: bool = False,
) -> Example | None:
    """None when a prompt is too long or the response empty (skipped)."""
    if not record.response or not record.response.strip():
        return None
    alignment = align_prompt(
        pair.receiver.tokenizer, pair.sharer.tokenizer, record.question, record.context, receiver_sees_context,
        token_alignment, fuse_template,
    )
    max_sharer_tokens = max_sharer_tokens or max_prompt_tokens + 64
    if len(alignment.receiver_ids) > max_prompt_tokens or len(alignment.sharer_ids) > max_sharer_tokens:
        return None
    if alignment.num_fused == 0:
        return None
    return Example(
        record.id, alignment, response_ids(pair.receiver.tokenizer, record.response, max_response_tokens),
        record.question, record.context, receiver_sees_context, token_alignment, fuse_template,
    )


def split_records(data: str, seed: int, heldout: int, context_only: bool = False, train_count: int | None = None, dolly_share: float = 0.25):
    """(train records, held-out records), reproducible from the arguments.

    ``recall``: ``kvviz.data.recall`` records, split by entity (held-out records use names and values
    never seen in training); ``train_count`` of them for training. ``recall+dolly``: the same
    held-out recall records; training interleaves recall with Dolly records that have an input
    (``dolly_share`` of them). ``handbook``: questions about the handbook's fuser-train entities in
    its train phrasings (every entity in every phrasing, in a seeded order) for training; held out,
    ``heldout`` questions about held-out entities in unseen phrasings (``kvviz.data.handbook``: the
    sharer knows both, the fuser never sees a held-out entity). Other data: a seeded shuffle, the
    first ``heldout`` held out.
    """
    if data == "handbook":
        train = handbook.questions("train", "train", per_entity=0)
        random.Random(seed).shuffle(train)
        return train, handbook.questions("heldout", "unseen", per_entity=1)[:heldout]
    if data in ("recall", "recall+dolly"):
        count = train_count or 2000
        held = recall.generate("heldout", heldout, seed)
        if data == "recall":
            return recall.generate("train", count, seed), held
        dolly_train, _ = split_records("dolly", seed, heldout, context_only=True)
        dolly = dolly_train[: int(round(count * dolly_share))]
        train = recall.generate("train", count - len(dolly), seed)
        # evenly interleaved: recall i at i / |recall|, Dolly j at (j + 0.5) / |dolly|
        keyed = [(i / len(train), 0, r) for i, r in enumerate(train)] + [((j + 0.5) / len(dolly), 1, r) for j, r in enumerate(dolly)]
        return [r for _, _, r in sorted(keyed, key=lambda item: (item[0], item[1]))], held
    records = [r for r in load_dataset(data) if r.response and (r.context or not context_only)]
    random.Random(seed).shuffle(records)
    return records[heldout:], records[:heldout]


def build_examples(
    pair, records, max_prompt_tokens, max_response_tokens, wanted: int | None = None, receiver_sees_context: bool = True,
    max_sharer_tokens: int | None = None, token_alignment: str = "longest", fuse_template: bool = False,
) -> list[Example]:
    examples = []
    for record in records:
        example = make_example(
            pair, record, max_prompt_tokens, max_response_tokens, receiver_sees_context, max_sharer_tokens, token_alignment,
            fuse_template,
        )
        if example is not None:
            examples.append(example)
            if wanted is not None and len(examples) >= wanted:
                break
    return examples


def heldout_examples(pair, fuser, limit: int | None):
    """The fuser's held-out examples, rebuilt from its checkpoint config."""
    trained = fuser.config.training or {}
    data, seed = trained.get("data", SPLIT_DEFAULTS["data"]), trained.get("seed", SPLIT_DEFAULTS["seed"])
    heldout = trained.get("heldout", SPLIT_DEFAULTS["heldout"])
    _, records = split_records(data, seed, heldout, trained.get("context_only", False), train_count=1)
    examples = build_examples(
        pair, records, trained.get("max_prompt_tokens", SPLIT_DEFAULTS["max_prompt_tokens"]),
        trained.get("max_response_tokens", SPLIT_DEFAULTS["max_response_tokens"]), None,
        trained.get("receiver_sees_context", True), trained.get("max_sharer_tokens"), fuser.config.token_alignment,
        fuser.config.fuse_template,
    )
    return (examples[:limit] if limit is not None else examples), trained
