"""A cross-model KV translator: the sharer's cache of a private context, in the receiver's KV space.

C2C fuses the sharer's KV into the receiver's *question* tokens; when only the sharer read the
context, those tokens hold almost none of it (docs/C2C.md). A translator writes where the facts
are: the sharer reads the context, and a trained per-layer map turns the sharer's KV at each
context token into the receiver's keys and values at that token. The receiver never reads the
context: the translated KV is placed in front of its question as a prefix with explicit positions,
the way KVComm places a sender's cache (``kvviz.runtime.cache.KVState``).

Layout (what the receiver's cache holds before its question, per receiver layer):

    <bos> Context :   | translated tokens of " <context>\\n\\n"  | Question: ... Answer:
    receiver's own KV | the translator's keys and values         | the receiver reads these
    (context-free)    | at positions 3 .. N-1                    | at positions N, N+1, ...

This is Skyline's prompt, token for token (``kvviz.core.prompts.build_segments``): put the receiver's
own KV of the context in the translated slots (the *oracle*) and the handoff is Skyline exactly.

Token alignment: both models tokenise the same string ``Context: <context>\\n\\n``; each receiver
token reads the sharer token that holds its last character (both tokenizers' offsets), plus
optionally the sharer token before that one (``neighbours``) and three numbers saying how the
receiver token sits inside the sharer token (the tokenizers split words differently).

Keys: the sharer's keys are un-rotated at their own positions (its rotary module), the map
predicts position-free receiver keys (Gemma 3's after k-norm), and those are rotated at the
receiver's positions with the receiver's own rotary module (per layer type: Gemma 3's sliding and
full layers use different theta).

Gates and weights (as C2C has): a gate per receiver layer decides whether that layer takes the
translated context at all; a closed layer holds only the receiver's attention sink, placed just
before the question, so that it reads the question exactly as the receiver alone does (all gates
closed = the receiver alone). In an open layer, a per-token weight ``w`` in (0, 1] scales the
attention each translated token may receive (``log w`` is added to its attention scores,
``kvviz.runtime.attention.AttentionPlan.prefix_bias``). While training, the gate is soft: ``log
sigmoid(logit)`` is added to every translated token's score.

The map: inputs are z-scored, ``y = ((x - mean) / scale) @ down @ up`` (rank ``rank``; or one
full matrix), de-standardised per output. With ``sources`` (format 2) each receiver layer has its
own full map from its own few sharer layers, chosen by held-out R^2
(``research/translator_layers.py``), instead of one map from every sharer layer. Stage 1 fits it
in closed form (ridge on aligned tokens of texts both models read: ``RidgeStats``, ``fit_ridge``,
``fit_ridge_routed``); stage 2 trains it through the frozen receiver (``research/translator_stage2.py``:
attention outputs; ``python -m kvviz train-translator``: the receiver's next tokens against Skyline).

Files: a folder with ``translator.safetensors`` and ``config.json`` (the pair's fingerprints, the
architecture, how it was trained). Loading never unpickles; a translator for another pair, or a
corrupt file, is refused with a clear error (``TranslatorError``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from kvviz.core.prompts import encode_with_offsets, render, unmark
from kvviz.runtime import cache as kv
from kvviz.runtime import checkpoints
from kvviz.runtime.checkpoints import CheckpointError, model_fingerprint, read_weights
from kvviz.runtime.decode import forward_kwargs, prefill
from kvviz.runtime.rope import apply_rotation, rotary_tables, undo_rotation

FORMAT = "kvviz-kv-translator"
FORMAT_VERSION = 2  # 2: per receiver layer sharer layers (``sources``); version 1 files (one shared map) still load
READABLE_VERSIONS = (1, 2)
WEIGHTS_FILE = "translator.safetensors"
CONFIG_FILE = "config.json"
OWN_PREFIX = "Context:"  # the receiver's own, context-free tokens in front of the translated ones
DEFAULT_SHARER_LAYERS = (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29)
ALIGNMENT_FEATURES = 3  # is the last receiver piece of its sharer token, 1 / pieces, (rank + 1) / pieces
CLOSED = -30.0  # a bias this low hides a key (exp(-30) ~ 1e-13)


class TranslatorError(CheckpointError):
    """A translator checkpoint is missing, corrupt, inconsistent or made for another pair."""


def sharer_start_token(tokenizer) -> str:
    """The token the sharer reads plain text after: SmolLM2's ``<|endoftext|>`` (its declared BOS,
    ``<|im_start|>``, opens a chat role; REFERENCE §6), else the tokenizer's BOS, else nothing."""
    vocab = tokenizer.get_vocab()
    if "<|endoftext|>" in vocab:
        return "<|endoftext|>"
    return tokenizer.bos_token or ""


# --- alignment ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TranslationAlignment:
    """Which sharer token each translated receiver token reads.

    ``receiver_ids``: the receiver's context segment (Skyline's: ``<bos>Context: C\\n\\n``), of
    which the first ``own_count`` tokens are the receiver's own (context-free) and the rest are
    translated. ``sharer_ids``: what the sharer reads (its start token, then the same text).
    ``sharer_index[i]``: the sharer token holding the last character of translated token i;
    ``pieces[i]``: (its rank among the receiver tokens reading that sharer token, how many do).
    """

    receiver_ids: list[int]
    own_count: int
    sharer_ids: list[int]
    sharer_index: list[int]
    pieces: list[tuple[int, int]]

    @property
    def translated_count(self) -> int:
        return len(self.receiver_ids) - self.own_count


def align_context(receiver_tokenizer, sharer_tokenizer, context: str, sharer_start: str | None = None) -> TranslationAlignment:
    """Align the receiver's context segment with the sharer's reading of the same text."""
    if not context or not context.strip():
        raise ValueError("a translation needs a context")
    head, _ = render(receiver_tokenizer, "?", context)  # the head does not depend on the question
    receiver_ids, receiver_offsets = encode_with_offsets(receiver_tokenizer, head)
    head_text = unmark(head)
    start = head_text.find(OWN_PREFIX)
    if start < 0:
        raise ValueError(f"the receiver's prompt layout has no {OWN_PREFIX!r} segment to translate after")
    sharer_start = sharer_start_token(sharer_tokenizer) if sharer_start is None else sharer_start
    marked_body = head[head.find(OWN_PREFIX):]  # the marks keep the user's words plain text
    sharer_ids, sharer_offsets = encode_with_offsets(sharer_tokenizer, sharer_start + marked_body)
    own_end = start + len(OWN_PREFIX)
    own_count = sum(1 for _, end in receiver_offsets if end <= own_end)
    shift = start - len(sharer_start)  # receiver head character -> sharer text character
    sharer_index = []
    for begin, end in receiver_offsets[own_count:]:
        last = max(end, begin + 1) - 1 - shift
        chosen = 0
        for j, (s_begin, s_end) in enumerate(sharer_offsets):
            if s_end <= s_begin:
                continue
            if s_begin <= last:
                chosen = j
            if s_begin <= last < s_end:
                break
        sharer_index.append(chosen)
    pieces = []
    for i, index in enumerate(sharer_index):
        group = [k for k, other in enumerate(sharer_index) if other == index]
        pieces.append((group.index(i), len(group)))
    return TranslationAlignment(receiver_ids, own_count, sharer_ids, sharer_index, pieces)


# --- the models' KV, position-free ------------------------------------------------------------


def layer_type(loaded, layer: int) -> str:
    types = getattr(loaded.facts, "layer_types", None) or ()
    return types[layer] if layer < len(types) else "full_attention"


def unrotated(loaded, keys: torch.Tensor, layer: int, positions: list[int]) -> torch.Tensor:
    """Keys [B, H, T, D] as cached (after RoPE at ``positions``) -> position-free keys."""
    cos, sin = rotary_tables(loaded, positions, layer_type(loaded, layer))
    return undo_rotation(keys.float(), cos.to(keys.device), sin.to(keys.device))


def rotated(loaded, keys: torch.Tensor, layer: int, positions: list[int]) -> torch.Tensor:
    """Position-free keys [B, H, T, D] rotated at ``positions`` with the model's own rotary module."""
    cos, sin = rotary_tables(loaded, positions, layer_type(loaded, layer))
    return apply_rotation(keys, cos.to(keys.device, keys.dtype), sin.to(keys.device, keys.dtype))


@torch.no_grad()
def read_kv(loaded, batch_ids: list[list[int]], pad_id: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One decoder pass over right-padded sequences from position 0 (causal: padding at the end
    changes nothing before it). Returns per layer (position-free keys, values), [B, H, T, D] float32."""
    length = max(len(ids) for ids in batch_ids)
    input_ids = torch.full((len(batch_ids), length), pad_id, dtype=torch.long)
    for row, ids in enumerate(batch_ids):
        input_ids[row, : len(ids)] = torch.tensor(ids)
    state = kv.KVState()
    loaded.model.model(input_ids=input_ids.to(loaded.device), cache=state.cache, use_cache=True,
                       position_ids=state.positions(length, loaded.device).expand(len(batch_ids), -1))
    positions = list(range(length))
    return [
        (unrotated(loaded, keys, layer, positions), values.float())
        for layer, (keys, values) in enumerate(kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache)))
    ]


def feature_width(sharer_facts, sharer_layers, neighbours: int) -> int:
    per_token = len(sharer_layers) * 2 * sharer_facts["num_kv_heads"] * sharer_facts["head_dim"]
    return per_token * (1 + neighbours) + ALIGNMENT_FEATURES


def features(sharer_kv: list[tuple[torch.Tensor, torch.Tensor]], alignment: TranslationAlignment, sharer_layers,
             neighbours: int = 0, row: int = 0) -> torch.Tensor:
    """[translated tokens, F]: for each translated receiver token, the sharer's position-free keys
    and values at the aligned token (and at the ``neighbours`` tokens before it) in
    ``sharer_layers``, then the three alignment numbers. ``row``: the batch row of ``sharer_kv``."""
    index = torch.tensor(alignment.sharer_index, dtype=torch.long)
    parts = []
    for offset in range(neighbours + 1):
        at = (index - offset).clamp(min=0)
        for layer in sharer_layers:
            keys, values = sharer_kv[layer]
            for tensor in (keys, values):
                picked = tensor[row].index_select(1, at.to(tensor.device))  # [H, T, D]
                parts.append(picked.transpose(0, 1).reshape(len(alignment.sharer_index), -1).float().cpu())
    pieces = torch.tensor([[float(r == n - 1), 1.0 / n, (r + 1) / n] for r, n in alignment.pieces], dtype=torch.float32)
    parts.append(pieces.reshape(len(alignment.sharer_index), ALIGNMENT_FEATURES))
    return torch.cat(parts, dim=1)


def targets(receiver_kv: list[tuple[torch.Tensor, torch.Tensor]], alignment: TranslationAlignment, row: int = 0) -> torch.Tensor:
    """[translated tokens, O]: the receiver's own position-free keys and values at the translated
    tokens, every layer, (K, V) per layer with heads flattened (what the map predicts)."""
    positions = torch.arange(alignment.own_count, len(alignment.receiver_ids))
    parts = []
    for keys, values in receiver_kv:
        for tensor in (keys, values):
            picked = tensor[row].index_select(1, positions.to(tensor.device))
            parts.append(picked.transpose(0, 1).reshape(positions.numel(), -1).float().cpu())
    return torch.cat(parts, dim=1)


# --- the translator -----------------------------------------------------------------------------


@dataclass
class TranslatorConfig:
    sharer: dict  # kvviz.runtime.checkpoints.model_fingerprint of the sharer
    receiver: dict
    pair: str = ""
    sharer_layers: list[int] = field(default_factory=lambda: list(DEFAULT_SHARER_LAYERS))
    neighbours: int = 0  # sharer tokens before the aligned one also read (0 or 1)
    rank: int | None = None  # None: one full matrix
    sharer_start: str = "<|endoftext|>"
    training: dict = field(default_factory=dict)
    # per receiver layer, the sharer layers its keys and values are read from (a full map per
    # receiver layer; ``sharer_layers`` is then their union). None: one map from every sharer layer.
    sources: list[list[int]] | None = None
    format: str = FORMAT
    version: int = FORMAT_VERSION

    def __post_init__(self):
        if self.format != FORMAT:
            raise TranslatorError(f"not a kvviz KV translator (format {self.format!r})")
        if any(not 0 <= s < self.sharer["num_layers"] for s in self.sharer_layers) or not self.sharer_layers:
            raise TranslatorError(f"sharer_layers must name layers 0..{self.sharer['num_layers'] - 1}")
        if self.neighbours not in (0, 1, 2):
            raise TranslatorError("neighbours must be 0, 1 or 2")
        if self.rank is not None and self.rank < 1:
            raise TranslatorError("rank must be at least 1 (or None for a full matrix)")
        if self.sources is not None:
            self._check_sources()

    def _check_sources(self) -> None:
        sources = self.sources
        if len(sources) != self.receiver["num_layers"] or not all(sources) or len({len(s) for s in sources}) != 1:
            raise TranslatorError(f"sources must name the same number (at least one) of sharer layers for each of the "
                                  f"{self.receiver['num_layers']} receiver layers")
        if any(len(set(s)) != len(s) for s in sources) or sorted({x for s in sources for x in s}) != sorted(self.sharer_layers):
            raise TranslatorError("sources must name distinct sharer layers per receiver layer, whose union is sharer_layers")
        if self.neighbours or self.rank is not None:
            raise TranslatorError("a translator with sources reads the aligned token only, through full maps (neighbours 0, rank None)")

    @property
    def in_width(self) -> int:
        return feature_width(self.sharer, self.sharer_layers, self.neighbours)

    @property
    def routed_width(self) -> int:
        """Inputs of one receiver layer's map (with ``sources``): its sharer layers and the alignment numbers."""
        return feature_width(self.sharer, self.sources[0], 0)

    def source_columns(self) -> list[list[int]]:
        """Per receiver layer, the columns of ``features`` (over ``sharer_layers``) its map reads."""
        per = 2 * self.sharer["num_kv_heads"] * self.sharer["head_dim"]
        at = {layer: i * per for i, layer in enumerate(self.sharer_layers)}
        tail = list(range(len(self.sharer_layers) * per, len(self.sharer_layers) * per + ALIGNMENT_FEATURES))
        return [[c for layer in chosen for c in range(at[layer], at[layer] + per)] + tail for chosen in self.sources]

    @property
    def kv_width(self) -> int:
        return self.receiver["num_kv_heads"] * self.receiver["head_dim"]

    @property
    def out_width(self) -> int:
        return self.receiver["num_layers"] * 2 * self.kv_width

    def to_dict(self) -> dict:
        return asdict(self)


class KVTranslator(nn.Module):
    """Sharer features [T, F] -> per receiver layer position-free keys and values, and weights."""

    def __init__(self, config: TranslatorConfig):
        super().__init__()
        self.config = config
        f, o, layers = config.in_width, config.out_width, config.receiver["num_layers"]
        self.register_buffer("x_mean", torch.zeros(f))
        self.register_buffer("x_scale", torch.ones(f))
        self.register_buffer("y_mean", torch.zeros(o))
        self.register_buffer("y_scale", torch.ones(o))
        # gates open and weights ~1 at the start: the ridge map as fitted
        self.gate_logits = nn.Parameter(torch.full((layers,), 4.0))
        self.weight_bias = nn.Parameter(torch.full((layers,), 6.0))
        if config.sources is not None:  # one full map per receiver layer, from its own sharer layers
            columns = torch.tensor(config.source_columns(), dtype=torch.long)
            self.register_buffer("columns", columns, persistent=False)  # [L, F_l], from the config
            self.down = None
            self.up = nn.Parameter(torch.zeros(layers, columns.shape[1], 2 * config.kv_width))
            self.weight_proj = nn.Parameter(torch.zeros(layers, columns.shape[1]))
            return
        code = f if config.rank is None else config.rank
        self.down = nn.Parameter(torch.zeros(f, code)) if config.rank is not None else None
        self.up = nn.Parameter(torch.zeros(code, o))
        self.weight_proj = nn.Parameter(torch.zeros(code, layers))

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def routed(self) -> bool:
        return self.config.sources is not None

    def code(self, x: torch.Tensor) -> torch.Tensor:
        """The z-scored inputs [T, F] (through ``down`` for a reduced-rank map; for a routed map
        [T, L, F_l]: each receiver layer's own columns)."""
        z = (x - self.x_mean) / self.x_scale
        if self.routed:
            return z[:, self.columns]
        return z if self.down is None else z @ self.down

    def standardised(self, x: torch.Tensor) -> torch.Tensor:
        """The map's z-scored outputs [T, O] (before de-standardising)."""
        return self.project(self.code(x.to(self.up.dtype)))

    def project(self, code: torch.Tensor) -> torch.Tensor:
        """``code``'s z-scored outputs [T, O]."""
        if self.routed:
            return torch.einsum("tlf,lfo->tlo", code, self.up).reshape(code.shape[0], -1)
        return code @ self.up

    def forward(self, x: torch.Tensor):
        """x [T, F] -> (keys [L, H, T, D] position-free, values [L, H, T, D], weights [L, T])."""
        code = self.code(x.to(self.up.dtype))
        if self.routed:
            logits = torch.einsum("tlf,lf->lt", code, self.weight_proj)
        else:
            logits = (code @ self.weight_proj).transpose(0, 1)
        y = self.project(code) * self.y_scale + self.y_mean
        layers, heads, dim = self.config.receiver["num_layers"], self.config.receiver["num_kv_heads"], self.config.receiver["head_dim"]
        y = y.reshape(x.shape[0], layers, 2, heads, dim).permute(1, 2, 3, 0, 4)  # [L, 2, H, T, D]
        weights = torch.sigmoid(logits + self.weight_bias[:, None])  # [L, T]
        return y[:, 0], y[:, 1], weights

    def open_gates(self) -> torch.Tensor:
        return self.gate_logits.detach() > 0

    # --- files --------------------------------------------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """Weights in ``dtype`` (standardisation buffers and gates stay float32)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        exact = {"x_mean", "x_scale", "y_mean", "y_scale", "gate_logits", "weight_bias"}
        tensors = {
            name: t.detach().to("cpu", torch.float32 if name in exact else dtype).contiguous()
            for name, t in self.state_dict().items()
        }
        tmp = folder / (WEIGHTS_FILE + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "version": str(FORMAT_VERSION)})
        tmp.replace(folder / WEIGHTS_FILE)
        tmp = folder / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(self.config.to_dict(), indent=2))
        tmp.replace(folder / CONFIG_FILE)
        return folder


def new_translator(sharer_facts, receiver_facts, pair: str = "", sharer_tokenizer=None, **options) -> KVTranslator:
    config = TranslatorConfig(sharer=model_fingerprint(sharer_facts), receiver=model_fingerprint(receiver_facts), pair=pair, **options)
    if sharer_tokenizer is not None and "sharer_start" not in options:
        config.sharer_start = sharer_start_token(sharer_tokenizer)
    return KVTranslator(config)


def read_config(folder: str | Path) -> TranslatorConfig:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise TranslatorError(f"No translator at {folder}: {CONFIG_FILE} is missing (a translator folder holds {CONFIG_FILE} and {WEIGHTS_FILE}).")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TranslatorError(f"The translator config {path} is not valid JSON: {error}") from error
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TranslatorError(f"{path} is not a kvviz KV translator config (format {FORMAT!r} expected).")
    if data.get("version") not in READABLE_VERSIONS:
        raise TranslatorError(f"The translator at {folder} has format version {data.get('version')}; this kvviz reads "
                              f"{', '.join(map(str, READABLE_VERSIONS))}.")
    try:
        config = TranslatorConfig(**data)
        _ = (config.in_width, config.out_width)
    except (TypeError, KeyError) as error:
        raise TranslatorError(f"The translator config {path} is incomplete or has unknown fields: {error}") from error
    return config


def check_pair(config: TranslatorConfig, folder, sharer_facts, receiver_facts, pair_name: str = "") -> None:
    """Raise TranslatorError naming both pairs when a translator was made for another pair."""
    checkpoints.check_pair("translator", config, folder, sharer_facts, receiver_facts, pair_name, TranslatorError,
                           "A translator maps one sharer's KV into one receiver's: fit one for this pair (docs/C2C.md).")


def load_translator(folder: str | Path, sharer_facts=None, receiver_facts=None, pair_name: str = "", device="cpu") -> KVTranslator:
    """Load a translator (float32); with facts given, refuse one made for another pair."""
    folder = Path(folder)
    config = read_config(folder)
    if sharer_facts is not None and receiver_facts is not None:
        check_pair(config, folder, sharer_facts, receiver_facts, pair_name)
    tensors = read_weights(folder, WEIGHTS_FILE, "translator", TranslatorError)
    with torch.device("meta"):
        translator = KVTranslator(config)
    expected = translator.state_dict()
    wrong = sorted(set(expected) ^ set(tensors)) + [
        f"{name} {tuple(tensors[name].shape)} != {tuple(t.shape)}"
        for name, t in expected.items() if name in tensors and tensors[name].shape != t.shape
    ]
    if wrong:
        raise TranslatorError(f"The translator config at {folder} does not match its weights: {', '.join(wrong[:3])}.")
    translator.load_state_dict({name: t.float() for name, t in tensors.items()}, assign=True)
    if translator.routed:  # not in the file: made from the config
        translator.columns = torch.tensor(config.source_columns(), dtype=torch.long)
    return translator.eval().to(device)


# --- the receiver's prefix ------------------------------------------------------------------------


@dataclass
class Prefix:
    """The receiver's state before its question, and what each layer took."""

    state: kv.KVState
    gates: list[float]  # per receiver layer: 1 open, 0 closed (soft while training)
    weights: list[list[float]]  # per layer, per translated token (empty for a closed layer)
    translated_tokens: int
    positions: int  # the question's first position


_own_kv: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = {}


@torch.no_grad()
def own_kv(receiver, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The receiver's own KV of its context-free tokens (``<bos>Context:``), as cached (rotated at
    positions 0..), computed once per receiver and token ids."""
    key = (id(receiver.model), tuple(ids))
    if key not in _own_kv:

        state = kv.KVState()
        prefill(receiver, state, ids, need_logits=False)
        _own_kv[key] = [tuple(t.clone() for t in kv.layer_kv(state.cache, i)) for i in range(kv.num_layers(state.cache))]
    return _own_kv[key]


def build_prefix(receiver, alignment: TranslationAlignment, keys, values, weights, gates, rotate: bool = True) -> Prefix:
    """The receiver's state from translated position-free ``keys`` / ``values`` ([L, H, T, D], or
    as-cached keys when ``rotate`` is False: the oracle), ``weights`` [L, T] (None: all 1) and
    ``gates`` [L] (hard 0/1, or soft values in (0, 1) while training: the log enters the scores).
    """
    own = own_kv(receiver, alignment.receiver_ids[: alignment.own_count])
    total = len(alignment.receiver_ids)
    translated_positions = list(range(alignment.own_count, total))
    layers, prefix_positions, biases = [], {}, {}
    gate_values, weight_values = [], []
    for layer, (own_keys, own_values) in enumerate(own):
        gate = gates[layer]
        hard_closed = not torch.is_tensor(gate) and float(gate) <= 0.0
        if hard_closed:
            # the sink alone, moved to just before the question: the layer reads it as when alone
            sink = unrotated(receiver, own_keys[..., :1, :], layer, [0])
            layers.append((rotated(receiver, sink, layer, [total - 1]).to(own_keys.dtype), own_values[..., :1, :]))
            prefix_positions[layer] = torch.tensor([total - 1])
            gate_values.append(0.0)
            weight_values.append([])
            continue
        layer_keys = keys[layer][None]
        if rotate:
            layer_keys = rotated(receiver, layer_keys, layer, translated_positions)
        layers.append((
            torch.cat([own_keys, layer_keys.to(own_keys.dtype)], dim=2),
            torch.cat([own_values, values[layer][None].to(own_values.dtype)], dim=2),
        ))
        prefix_positions[layer] = torch.arange(total)
        bias = torch.zeros(len(translated_positions))
        if weights is not None:
            bias = torch.log(weights[layer].clamp_min(1e-6))
        if torch.is_tensor(gate):
            bias = bias + torch.log(gate.clamp_min(1e-6))
        if weights is not None or torch.is_tensor(gate):
            biases[layer] = torch.cat([torch.zeros(alignment.own_count, dtype=bias.dtype, device=bias.device), bias])
        gate_values.append(float(gate.detach()) if torch.is_tensor(gate) else float(gate))
        weight_values.append([] if weights is None else [float(w) for w in weights[layer].detach()])
    state = kv.KVState(cache=kv.from_tensors(layers), next_position=total, prefix_positions=prefix_positions, prefix_bias=biases)
    return Prefix(state, gate_values, weight_values, alignment.translated_count, total)


def translate(pair, translator: KVTranslator, alignment: TranslationAlignment, hard: bool = True, gates=None):
    """The sharer reads the context; the translator maps its KV; the receiver's prefix is built.

    Returns (Prefix, bytes of the sharer's KV read (``read_bytes``), translated KV bytes). Differentiable in the
    translator when called outside ``torch.no_grad`` (training, ``hard=False``: soft gates).
    ``gates``: override the gates (a list of 0/1 per receiver layer; tests and ablations).
    """
    sharer_kv = read_kv(pair.sharer, [alignment.sharer_ids])
    x = features(sharer_kv, alignment, translator.config.sharer_layers, translator.config.neighbours)
    keys, values, weights = translator(x.to(translator.up.device))
    if gates is None:
        gates = translator.open_gates().float().tolist() if hard else torch.sigmoid(translator.gate_logits)
    prefix = build_prefix(pair.receiver, alignment, keys, values, weights, gates)
    sent = read_bytes(translator.config, len(alignment.sharer_ids), pair.sharer.dtype)
    made = sum(len(w) for w in prefix.weights) * 2 * translator.config.kv_width * pair.receiver.model.dtype.itemsize
    return prefix, sent, made


def read_bytes(config: "TranslatorConfig", tokens: int, dtype) -> int:
    """Bytes of the sharer's KV the translator reads (what crosses): its layers, K and V, over the
    context's ``tokens`` sharer tokens."""
    return len(config.sharer_layers) * 2 * config.sharer["num_kv_heads"] * config.sharer["head_dim"] * tokens * dtype.itemsize


def kv_bytes(facts, tokens: int, dtype) -> int:
    """Bytes of a model's whole KV cache (every layer, K and V) over ``tokens`` tokens."""
    return facts.num_layers * 2 * facts.num_kv_heads * facts.head_dim * tokens * dtype.itemsize


@torch.no_grad()
def oracle_prefix(pair, alignment: TranslationAlignment, gates=None) -> Prefix:
    """The receiver's own KV of the context in the translated slots (it reads the context: a check
    of the splice, equal to Skyline when every gate is open)."""

    state = kv.KVState()
    prefill(pair.receiver, state, alignment.receiver_ids, need_logits=False)
    layers = [kv.layer_kv(state.cache, i) for i in range(kv.num_layers(state.cache))]
    keys = [k[0, :, alignment.own_count:] for k, _ in layers]
    values = [v[0, :, alignment.own_count:] for _, v in layers]
    gates = [1.0] * len(layers) if gates is None else gates
    return build_prefix(pair.receiver, alignment, keys, values, None, gates, rotate=False)


# --- stage 1: ridge -----------------------------------------------------------------------------


class RidgeStats:
    """Sufficient statistics of (features, targets) over aligned tokens, for closed-form ridge.

    Sums are kept in float64 around a fixed shift (the first chunk's mean), which keeps the
    centred second moments accurate over a million tokens.
    """

    def __init__(self, in_width: int, out_width: int):
        self.n = 0
        self.shift_x = None
        self.shift_y = None
        self.sum_x = torch.zeros(in_width, dtype=torch.float64)
        self.sum_y = torch.zeros(out_width, dtype=torch.float64)
        self.sum_yy = torch.zeros(out_width, dtype=torch.float64)
        self.xtx = torch.zeros(in_width, in_width, dtype=torch.float64)
        self.xty = torch.zeros(in_width, out_width, dtype=torch.float64)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.shift_x is None:
            self.shift_x, self.shift_y = x.double().mean(0), y.double().mean(0)
        shift_x, shift_y = self.shift_x.float(), self.shift_y.float()
        for start in range(0, x.shape[0], 2048):  # float32 products of at most 2048 rows, summed in float64
            xs, ys = x[start : start + 2048].float() - shift_x, y[start : start + 2048].float() - shift_y
            self.n += xs.shape[0]
            self.sum_x.add_(xs.sum(0))
            self.sum_y.add_(ys.sum(0))
            self.sum_yy.add_((ys * ys).sum(0))
            self.xtx.add_(xs.T @ xs)  # in place: no float64 copy of the product
            self.xty.add_(xs.T @ ys)

    def state(self) -> dict:
        return {"n": torch.tensor([self.n], dtype=torch.float64), "shift_x": self.shift_x, "shift_y": self.shift_y,
                "sum_x": self.sum_x, "sum_y": self.sum_y, "sum_yy": self.sum_yy, "xtx": self.xtx, "xty": self.xty}

    def save(self, path: Path, meta: dict | None = None) -> None:
        from safetensors.torch import save_file

        tmp = Path(str(path) + ".tmp")
        save_file({k: v.contiguous() for k, v in self.state().items()}, str(tmp), metadata={"meta": json.dumps(meta or {})})
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "RidgeStats":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        stats = cls(tensors["xtx"].shape[0], tensors["xty"].shape[1])
        stats.n = int(tensors["n"][0])
        for name in ("shift_x", "shift_y", "sum_x", "sum_y", "sum_yy", "xtx", "xty"):
            setattr(stats, name, tensors[name])
        return stats

    def merge(self, other: "RidgeStats") -> None:
        """Add another set of sums (taken around its own shift) to these."""
        if other.n == 0:
            return
        if self.n == 0:
            for name in ("n", "shift_x", "shift_y", "sum_x", "sum_y", "sum_yy", "xtx", "xty"):
                setattr(self, name, getattr(other, name).clone() if torch.is_tensor(getattr(other, name)) else getattr(other, name))
            return
        dx, dy = other.shift_x - self.shift_x, other.shift_y - self.shift_y  # x - s = (x - s') + d
        n = other.n
        self.xtx += other.xtx + torch.outer(other.sum_x, dx) + torch.outer(dx, other.sum_x) + n * torch.outer(dx, dx)
        self.xty += other.xty + torch.outer(other.sum_x, dy) + torch.outer(dx, other.sum_y) + n * torch.outer(dx, dy)
        self.sum_yy += other.sum_yy + 2 * dy * other.sum_y + n * dy * dy
        self.sum_x += other.sum_x + n * dx
        self.sum_y += other.sum_y + n * dy
        self.n += n

    def subset(self, columns: list[int]) -> "RidgeStats":
        """The sums of a subset of the feature columns (a smaller layout from a superset's sums)."""
        index = torch.tensor(columns)
        out = RidgeStats(len(columns), self.xty.shape[1])
        out.n, out.shift_x, out.shift_y = self.n, self.shift_x[index], self.shift_y
        out.sum_x, out.sum_y, out.sum_yy = self.sum_x[index], self.sum_y, self.sum_yy
        out.xtx, out.xty = self.xtx[index][:, index], self.xty[index]
        return out

    def moments(self):
        """(mean x, std x, mean y, std y, correlation of x, cross-correlation x-y), float64."""
        n = self.n
        mx, my = self.sum_x / n, self.sum_y / n
        cov_x = self.xtx / n - torch.outer(mx, mx)
        cov_xy = self.xty / n - torch.outer(mx, my)
        var_y = self.sum_yy / n - my * my
        sx = cov_x.diagonal().clamp_min(1e-12).sqrt()
        sy = var_y.clamp_min(1e-12).sqrt()
        return mx + self.shift_x, sx, my + self.shift_y, sy, cov_x / torch.outer(sx, sx), cov_xy / torch.outer(sx, sy)


def fit_ridge(stats: RidgeStats, lam: float, rank: int | None = None, columns: list[int] | None = None, ranks=None):
    """Closed-form ridge on z-scored features and targets: {weight or (down, up), x_mean, x_scale,
    y_mean, y_scale}. ``lam`` is relative to the (unit) feature variance. With ``rank``, the
    reduced-rank solution: W projected on the top ``rank`` directions of its fitted values.
    ``columns``: use only these feature columns (a smaller layout from the same sums).
    ``ranks``: several ranks at once (a dict rank -> result; the decompositions are shared).
    """
    mx, sx, my, sy, corr_x, corr_xy = stats.moments()
    if columns is not None:
        index = torch.tensor(columns)
        mx, sx, corr_x, corr_xy = mx[index], sx[index], corr_x[index][:, index], corr_xy[index]
    eye = torch.eye(corr_x.shape[0], dtype=torch.float64)
    weight = torch.linalg.solve(corr_x + lam * eye, corr_xy)  # [F, O] standardised
    base = {"x_mean": mx.float(), "x_scale": sx.float(), "y_mean": my.float(), "y_scale": sy.float()}
    wanted = list(ranks) if ranks is not None else ([rank] if rank is not None else [])
    if not wanted:
        return {**base, "weight": weight.float()}
    # fitted values' covariance W^T C W = (C^1/2 W)^T (C^1/2 W); its top eigenvectors via the small
    # side, in float32 (the directions need no float64; the products are the costly part)
    evals, evecs = torch.linalg.eigh(corr_x.float())
    fitted = ((evecs * evals.clamp_min(0).sqrt()) @ evecs.T) @ weight.float()  # C^1/2 W, [F, O]
    s_evals, s_evecs = torch.linalg.eigh(fitted @ fitted.T)
    out = {}
    for r in wanted:
        directions = fitted.T @ s_evecs[:, -r:] / s_evals[-r:].clamp_min(1e-12).sqrt()  # [O, r], orthonormal columns
        out[r] = {**base, "down": weight.float() @ directions, "up": directions.T.contiguous()}
    return out if ranks is not None else out[rank]


def fit_ridge_routed(stats: RidgeStats, config: TranslatorConfig, lam: float) -> dict:
    """Closed-form ridge for a translator with ``sources``: each receiver layer's keys and values from
    its own sharer layers' columns (``stats`` over ``config.sharer_layers``' features). Returns
    ``install_fit``'s input, with ``routed`` [L, F_l, 2 * kv_width] in z-scored units."""
    mx, sx, my, sy, corr_x, corr_xy = stats.moments()
    out = 2 * config.kv_width
    weights = []
    for layer, columns in enumerate(config.source_columns()):
        index = torch.tensor(columns)
        block = corr_x[index][:, index]
        targets_of_layer = corr_xy[index, layer * out:(layer + 1) * out]
        weights.append(torch.linalg.solve(block + lam * torch.eye(len(columns), dtype=block.dtype), targets_of_layer).float())
    return {"x_mean": mx.float(), "x_scale": sx.float(), "y_mean": my.float(), "y_scale": sy.float(),
            "routed": torch.stack(weights)}


def install_fit(translator: KVTranslator, fit: dict) -> None:
    """Put a ``fit_ridge`` result into a translator of the matching rank."""
    with torch.no_grad():
        for name in ("x_mean", "x_scale", "y_mean", "y_scale"):
            getattr(translator, name).copy_(fit[name])
        if translator.routed:
            translator.up.copy_(fit["routed"])
        elif translator.down is None:
            translator.up.copy_(fit["weight"])
        else:
            translator.down.copy_(fit["down"])
            translator.up.copy_(fit["up"])


def r_squared(translator: KVTranslator, x: torch.Tensor, y: torch.Tensor, layers: int) -> dict:
    """Held-out R^2 of the map on z-scored targets, pooled over K dims and over V dims, and per layer."""
    with torch.no_grad():
        predicted = translator.standardised(x)
        truth = (y - translator.y_mean) / translator.y_scale
    err = ((predicted - truth) ** 2).reshape(x.shape[0], layers, 2, -1).sum(dim=(0, 3)).double()
    centred = truth - truth.mean(0)
    var = (centred ** 2).reshape(x.shape[0], layers, 2, -1).sum(dim=(0, 3)).double()
    per_layer = 1 - err / var
    return {
        "k": float(1 - err[:, 0].sum() / var[:, 0].sum()),
        "v": float(1 - err[:, 1].sum() / var[:, 1].sum()),
        "k_layers": [round(float(v), 4) for v in per_layer[:, 0]],
        "v_layers": [round(float(v), 4) for v in per_layer[:, 1]],
    }


def nll_after(receiver, state: kv.KVState, query_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
    """Summed NLL of ``answer_ids`` after the receiver reads ``query_ids`` on ``state``
    (differentiable in whatever built the state)."""

    tokens = query_ids + answer_ids[:-1]
    kwargs = forward_kwargs(receiver, state, len(tokens))
    hidden = receiver.model.model(input_ids=torch.tensor([tokens], device=receiver.device), **kwargs).last_hidden_state[0]
    state.next_position += len(tokens)
    logits = receiver.head.logits(hidden[len(query_ids) - 1:])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(answer_ids, device=logits.device), reduction="sum")
