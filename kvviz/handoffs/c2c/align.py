"""Alignment between a sharer and a receiver for C2C: which layer, and which token, to read.

Layers ("terminal" alignment, REFERENCE §1): receiver layer ``t`` of ``T`` reads sharer layer
``clamp(S - T + t, 0, S - 1)`` of ``S``: the last layers line up, and when the receiver is deeper
its first layers all read the sharer's layer 0.

Tokens: both models see the same user message, each inside its own prompt layout (SmolLM2's chat
template, Gemma's plain "Question: ... Answer:" layout). Only the **message tokens** are fused.
Each receiver message token is decoded to text and re-encoded with the sharer's tokenizer; when
that gives several sharer tokens the longest one (by text length) is kept, so every receiver
message token has exactly one sharer token and the sharer reads a sequence as long as the
receiver's message. The sharer's template prefix is its own (template tokens are aligned apart,
never fused); the sharer's positions are shifted so that message token ``i`` sits at the same
position in both models whenever the sharer's prefix is not longer than the receiver's. When the
two tokenizers are identical the message tokens are used as they are (fast path).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kvviz.core.facts import tokenizer_fingerprint
from kvviz.core.prompts import (
    PromptSegments,
    answer_instruction,
    build_segments,
    encode_with_offsets,
    render,
    user_message,
)


def terminal_layer_map(sharer_layers: int, receiver_layers: int) -> list[int]:
    """For each receiver layer t, the sharer layer clamp(S - T + t, 0, S - 1)."""
    if sharer_layers < 1 or receiver_layers < 1:
        raise ValueError("both models need at least one layer")
    offset = sharer_layers - receiver_layers
    return [min(max(offset + t, 0), sharer_layers - 1) for t in range(receiver_layers)]


@dataclass(frozen=True)
class MessageSpan:
    """Prompt token ids of one model and the [start, end) token range of the user's message.

    ``offsets[k]``: the (begin, end) characters of token ``start + k`` inside the message text.
    """

    segments: PromptSegments
    start: int
    end: int
    offsets: tuple = ()

    @property
    def input_ids(self) -> list[int]:
        return self.segments.input_ids

    @property
    def message_ids(self) -> list[int]:
        return self.input_ids[self.start : self.end]


def message_span(tokenizer, query: str, context: str | None = None, instruction: str | None = None) -> MessageSpan:
    """The prompt exactly as ``build_segments`` makes it, plus where the message tokens are.

    Both segments are tokenised apart by ``build_segments``; a token belongs to the message when
    its characters lie inside the message text (template tokens, and any token straddling the
    boundary, do not).
    """
    instruction = answer_instruction(tokenizer) if instruction is None else instruction
    segments = build_segments(tokenizer, query, context, instruction)
    context_part, query_part = user_message(query, context, instruction)
    message = context_part + query_part
    text = segments.context_text + segments.query_text
    char_start = segments.context_text.rfind(context_part) if context_part else len(segments.context_text)
    if context_part and char_start < 0:
        raise ValueError("the prompt layout does not contain the context text")
    if not context_part:
        # the query part begins the tail
        char_start = len(segments.context_text) + segments.query_text.find(query_part)
    char_end = char_start + len(message)
    if text[char_start:char_end] != message:
        raise ValueError("could not locate the user message inside the prompt")
    inside: list[bool] = []
    spans: list[tuple[int, int]] = []
    # the offsets of the tokens as the prompt holds them (the user's words read as plain text)
    marked_head, marked_tail = render(tokenizer, query, context, instruction)
    for marked, base in ((marked_head, 0), (marked_tail, len(segments.context_text))):
        for begin, finish in encode_with_offsets(tokenizer, marked)[1]:
            inside.append(char_start <= base + begin and base + finish <= char_end and finish > begin)
            spans.append((base + begin - char_start, base + finish - char_start))
    if len(inside) != len(segments.input_ids):
        raise ValueError("tokenizer offsets do not match the prompt tokens")
    positions = [i for i, flag in enumerate(inside) if flag]
    if not positions:
        return MessageSpan(segments, len(segments.context_ids), len(segments.context_ids))
    start, end = positions[0], positions[-1] + 1
    return MessageSpan(segments, start, end, tuple(spans[start:end]))


def _token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token's own text, with its leading space (decoded one token at a time)."""
    return [tokenizer.decode([token_id], skip_special_tokens=False) for token_id in ids]


@lru_cache(maxsize=1 << 16)
def _longest_piece(sharer_tokenizer_id: int, text: str) -> int | None:
    tokenizer = _TOKENIZERS[sharer_tokenizer_id]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    if not ids:
        return None
    lengths = [len(tokenizer.decode([i], skip_special_tokens=False)) for i in ids]
    return ids[max(range(len(ids)), key=lambda k: (lengths[k], -k))]


_TOKENIZERS: dict[int, object] = {}


def map_tokens(receiver_tokenizer, sharer_tokenizer, receiver_ids: list[int]) -> list[int]:
    """One sharer token per receiver token: re-encode its text, keep the longest piece.

    A token whose text the sharer cannot encode at all (an empty decode) maps to the sharer's
    encoding of a space, so the 1:1 mapping always holds.
    """
    if same_tokenizer(receiver_tokenizer, sharer_tokenizer):
        return list(receiver_ids)
    _TOKENIZERS[id(sharer_tokenizer)] = sharer_tokenizer
    fallback = _longest_piece(id(sharer_tokenizer), " ")
    if fallback is None:
        fallback = sharer_tokenizer.unk_token_id or sharer_tokenizer.eos_token_id or 0
    mapped = []
    for text in _token_texts(receiver_tokenizer, receiver_ids):
        piece = _longest_piece(id(sharer_tokenizer), text)
        mapped.append(fallback if piece is None else piece)
    return mapped


def same_tokenizer(a, b) -> bool:
    if a is b:
        return True
    if len(a) != len(b):
        return False
    return _fingerprint(a, tokenizer_fingerprint) == _fingerprint(b, tokenizer_fingerprint)


_fingerprints: dict[int, str] = {}


def _fingerprint(tokenizer, fn) -> str:
    key = id(tokenizer)
    if key not in _fingerprints:
        _fingerprints[key] = fn(tokenizer)
    return _fingerprints[key]


@dataclass(frozen=True)
class TokenAlignment:
    """What the sharer reads, and which positions of the two sequences are fused together.

    ``receiver_ids``: the receiver's whole prompt. ``sharer_ids``: the sharer's template prefix
    followed by one sharer token per receiver message token. ``receiver_positions[i]`` and
    ``sharer_positions[i]`` are the indices (into the two sequences) of the i-th fused token: the
    message tokens, minus the receiver's last prompt token if the message reaches it.
    ``sharer_start_position`` is the position the sharer's first token gets.
    """

    receiver_ids: list[int]
    sharer_ids: list[int]
    receiver_positions: list[int]
    sharer_positions: list[int]
    sharer_start_position: int
    identical_tokenizers: bool
    receiver_segments: PromptSegments

    @property
    def num_fused(self) -> int:
        return len(self.receiver_positions)


TOKEN_ALIGNMENTS = ("longest", "natural")


def align_prompt(
    receiver_tokenizer, sharer_tokenizer, query: str, context: str | None = None, receiver_sees_context: bool = True,
    token_alignment: str = "longest", fuse_template: bool = False,
) -> TokenAlignment:
    """Align the two prompts for fusion.

    ``receiver_sees_context=True`` is the paper's setting: both models read the same message
    (context and query). With ``False`` the context is private to the sharer (the project's
    convention for a request's context, as in KVComm and the text relay): the receiver reads the
    query alone, the sharer reads context and query, and the fused tokens are the query's, whose
    sharer KV has attended to the context.

    ``token_alignment``: ``"longest"`` (the paper) gives the sharer one re-encoded token per
    receiver message token, so the sharer reads the receiver's segmentation (a name the two
    tokenizers cut differently reaches it garbled: " Raban" -> " Rab"). ``"natural"`` (beyond the
    paper) lets the sharer read the message in its own tokenization and pairs each receiver token
    with the sharer token that holds the receiver token's last character.

    ``fuse_template``: also fuse the receiver's template tokens between its message and its last
    prompt token ("\nAnswer" before ":"), right-aligned with the sharer's generation-prompt tokens
    ("<|im_end|>\n<|im_start|>assistant\n"), the sharer's last prompt token included: the position
    where the sharer is about to answer. The reference code fuses every prompt token but the last,
    template tokens included; kvviz's default fuses the message only.
    """
    alignment = _align(receiver_tokenizer, sharer_tokenizer, query, context, receiver_sees_context, token_alignment)
    if fuse_template:
        alignment = _with_template_tail(alignment, receiver_tokenizer, sharer_tokenizer, query, context, receiver_sees_context)
    return alignment


def _align(receiver_tokenizer, sharer_tokenizer, query, context, receiver_sees_context, token_alignment) -> TokenAlignment:
    if token_alignment not in TOKEN_ALIGNMENTS:
        raise ValueError(f"token_alignment must be one of {', '.join(TOKEN_ALIGNMENTS)}, not {token_alignment!r}")
    private = bool(context and context.strip()) and not receiver_sees_context
    receiver = message_span(receiver_tokenizer, query, None if private else context)
    identical = same_tokenizer(receiver_tokenizer, sharer_tokenizer)
    # fuse every message token except the last prompt token, which runs on the fused cache
    end = min(receiver.end, len(receiver.input_ids) - 1)
    if token_alignment == "natural":
        return _natural_alignment(receiver, sharer_tokenizer, query, context, private, end, identical)
    message = receiver.input_ids[receiver.start : end]
    if private:
        # everything before the query part: the sharer's template prefix and the context
        sharer_prefix = build_segments(sharer_tokenizer, query, context).context_ids
    else:
        sharer = message_span(sharer_tokenizer, query, context)
        sharer_prefix = sharer.input_ids[: sharer.start]
    sharer_ids = sharer_prefix + map_tokens(receiver_tokenizer, sharer_tokenizer, message)
    return TokenAlignment(
        receiver_ids=receiver.input_ids,
        sharer_ids=sharer_ids,
        receiver_positions=list(range(receiver.start, end)),
        sharer_positions=list(range(len(sharer_prefix), len(sharer_ids))),
        sharer_start_position=max(0, receiver.start - len(sharer_prefix)),
        identical_tokenizers=identical,
        receiver_segments=receiver.segments,
    )


def _natural_alignment(receiver: MessageSpan, sharer_tokenizer, query, context, private, end, identical) -> TokenAlignment:
    """The sharer reads its own tokenization of the message; receiver token -> the sharer token
    holding its last character."""
    sharer = message_span(sharer_tokenizer, query, context)
    # the receiver's message is the sharer's (shared input) or its query part (private context)
    shift = len(user_message(query, context)[0]) if private else 0
    sharer_positions = []
    for k in range(end - receiver.start):
        last = shift + receiver.offsets[k][1] - 1
        chosen = sharer.start
        for j, (begin, finish) in enumerate(sharer.offsets):
            if begin <= last:
                chosen = sharer.start + j
            if begin <= last < finish:
                break
        sharer_positions.append(chosen)
    return TokenAlignment(
        receiver_ids=receiver.input_ids,
        sharer_ids=sharer.input_ids[: sharer.end],
        receiver_positions=list(range(receiver.start, end)),
        sharer_positions=sharer_positions,
        sharer_start_position=max(0, receiver.start - sharer.start),
        identical_tokenizers=identical,
        receiver_segments=receiver.segments,
    )


def describe(alignment: TokenAlignment, receiver_tokenizer, sharer_tokenizer, token_alignment: str = "longest",
             shown: int = 8) -> str:
    """In words, for "What each model saw": how the sharer's fused tokens line up with the
    receiver's, and (``"longest"``) which receiver tokens reach the sharer cut to their longest
    piece (" locker" read as " lock"). Empty when the tokenizers are identical."""
    if alignment.identical_tokenizers:
        return ""
    if token_alignment != "longest":
        return ("The sharer reads the message in its own tokens; each receiver token is fused with the sharer token "
                "that holds its last character.")
    pairs = [(receiver_tokenizer.decode([alignment.receiver_ids[r]]), sharer_tokenizer.decode([alignment.sharer_ids[s]]))
             for r, s in zip(alignment.receiver_positions, alignment.sharer_positions)]
    cut = [(mine, theirs) for mine, theirs in pairs if mine != theirs]
    text = ("The sharer reads the receiver's tokens one by one, each re-encoded with the sharer's tokenizer and cut to "
            "its longest piece, as the C2C paper aligns two tokenizers, so that every fused position has one token "
            "in each model.")
    if not cut:
        return text + " Here every receiver token is also one sharer token: nothing was cut."
    listed = ", ".join(f"{mine!r} read as {theirs!r}" for mine, theirs in cut[:shown])
    more = f" and {len(cut) - shown} more" if len(cut) > shown else ""
    return text + f" Here {len(cut)} of {len(pairs)} tokens arrive cut: {listed}{more}."


def _with_template_tail(alignment: TokenAlignment, receiver_tokenizer, sharer_tokenizer, query, context, receiver_sees_context):
    """Add the receiver's template tail (before its last token) paired right-aligned with the
    sharer's generation-prompt tail (its last token included)."""
    private = bool(context and context.strip()) and not receiver_sees_context
    receiver = message_span(receiver_tokenizer, query, None if private else context)
    receiver_tail = list(range(max(receiver.end, alignment.receiver_positions[-1] + 1 if alignment.receiver_positions else 0),
                               len(receiver.input_ids) - 1))
    sharer = message_span(sharer_tokenizer, query, context)
    tail_ids = sharer.input_ids[sharer.end :]
    if not receiver_tail or not tail_ids:
        return alignment
    base = len(alignment.sharer_ids)
    sharer_tail = list(range(base, base + len(tail_ids)))
    count = min(len(receiver_tail), len(sharer_tail))
    return TokenAlignment(
        receiver_ids=alignment.receiver_ids,
        sharer_ids=alignment.sharer_ids + tail_ids,
        receiver_positions=alignment.receiver_positions + receiver_tail[len(receiver_tail) - count :],
        sharer_positions=alignment.sharer_positions + sharer_tail[len(sharer_tail) - count :],
        sharer_start_position=alignment.sharer_start_position,
        identical_tokenizers=alignment.identical_tokenizers,
        receiver_segments=alignment.receiver_segments,
    )
