"""A cross-model KV translator: the sharer's cache of a private context, in the receiver's KV space.

C2C fuses the sharer's KV into the receiver's *question* tokens; when only the sharer read the
context, those tokens hold almost none of it (docs/C2C.md). A translator writes where the facts
are: the sharer reads the context, and a trained per-layer map turns the sharer's KV at each
context token into the receiver's keys and values at that token (``align``: which sharer token each
receiver token reads). The receiver never reads the context; how it reads the translated KV is
``prefix`` (spliced in front of its question, or beside it through a gated side branch, ``side``).

Gates and weights (as C2C has): a gate per receiver layer decides whether that layer takes the
translated context at all; in an open layer, a per-token weight ``w`` in (0, 1] scales the
attention each translated token may receive (``log w`` is added to its attention scores). A
side-memory translator (``attach = "side"``) has instead one gate per receiver layer and query
head, ``tanh`` of a logit, that scales what the branch adds (0: the receiver alone, exactly).

The map: inputs are z-scored, ``y = ((x - mean) / scale) @ down @ up`` (rank ``rank``; or one
full matrix), de-standardised per output. With ``sources`` (format 2) each receiver layer has its
own full map from its own few sharer layers, chosen by held-out R^2
(``research/translator_layers.py``), instead of one map from every sharer layer. Stage 1 fits it
in closed form (``ridge``); stage 2 trains it through the frozen receiver
(``research/translator_stage2.py``: attention outputs; ``python -m kvviz train-translator``: the
receiver's next tokens against Skyline, each note's own answer against its swap twin's).

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

from kvviz.handoffs.translate.align import ALIGNMENT_FEATURES, feature_width, sharer_start_token
from kvviz.runtime import checkpoints
from kvviz.runtime.checkpoints import CheckpointError, model_fingerprint, read_weights

FORMAT = "kvviz-kv-translator"
FORMAT_VERSION = 2  # 2: per receiver layer sharer layers (``sources``); version 1 files (one shared map) still load
READABLE_VERSIONS = (1, 2)
WEIGHTS_FILE = "translator.safetensors"
CONFIG_FILE = "config.json"
DEFAULT_SHARER_LAYERS = (0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29)
ATTACHES = ("splice", "side")


class TranslatorError(CheckpointError):
    """A translator checkpoint is missing, corrupt, inconsistent or made for another pair."""



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
    # how the receiver reads the translated KV: "splice" (in front of its question, in its own cache)
    # or "side" (a gated branch beside each layer's attention, kvviz.handoffs.translate.side)
    attach: str = "splice"
    format: str = FORMAT
    version: int = FORMAT_VERSION

    def __post_init__(self):
        if self.format != FORMAT:
            raise TranslatorError(f"not a kvviz KV translator (format {self.format!r})")
        if any(not 0 <= s < self.sharer["num_layers"] for s in self.sharer_layers) or not self.sharer_layers:
            raise TranslatorError(f"sharer_layers must name layers 0..{self.sharer['num_layers'] - 1}")
        if self.attach not in ATTACHES:
            raise TranslatorError(f"attach must be one of {', '.join(ATTACHES)}, not {self.attach!r}")
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
        if config.attach == "side":  # tanh(0) = 0: a new side branch starts as the receiver alone
            self.side_gate_logits = nn.Parameter(torch.zeros(layers, config.receiver["num_kv_heads"]))
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

    @property
    def side(self) -> bool:
        return self.config.attach == "side"

    def side_gates(self) -> torch.Tensor:
        """[L, H_kv]: what each side branch's KV head adds, in [-1, 1] (a side-memory translator)."""
        return torch.tanh(self.side_gate_logits)

    def open_gates(self) -> torch.Tensor:
        if self.side:
            return self.side_gate_logits.detach().abs().amax(-1) > 0
        return self.gate_logits.detach() > 0

    # --- files --------------------------------------------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float16) -> Path:
        """Weights in ``dtype`` (standardisation buffers and gates stay float32)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        exact = {"x_mean", "x_scale", "y_mean", "y_scale", "gate_logits", "weight_bias", "side_gate_logits"}
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


def reattached(translator: KVTranslator, attach: str) -> KVTranslator:
    """The same map read another way (``attach``): a side-memory translator made from a spliced one
    starts with every side gate at 0 (the receiver alone); the splice's gates are kept as they are."""
    config = TranslatorConfig(**{**translator.config.to_dict(), "attach": attach})
    made = KVTranslator(config).to(translator.up.device)
    state = {k: v for k, v in translator.state_dict().items() if k in made.state_dict()}
    missing = made.load_state_dict(state, strict=False).missing_keys
    if set(missing) - {"side_gate_logits", "columns"}:
        raise TranslatorError(f"cannot read this translator as {attach!r}: {missing}")
    return made


def read_config(folder: str | Path) -> TranslatorConfig:
    def accepts(data: dict) -> str:
        return "" if data.get("format") == FORMAT else f"not a kvviz KV translator config (format {FORMAT!r} expected)."

    data = checkpoints.read_config_json(
        folder, CONFIG_FILE, "translator", TranslatorError, READABLE_VERSIONS, accepts=accepts,
        absent=f"No translator at {folder}: {CONFIG_FILE} is missing (a translator folder holds {CONFIG_FILE} and {WEIGHTS_FILE}).",
        train="python -m kvviz train-translator")
    return checkpoints.config_from(_checked_config, data, Path(folder) / CONFIG_FILE, "translator", TranslatorError)


def _checked_config(**data) -> TranslatorConfig:
    """A TranslatorConfig whose widths it needs are there (a KeyError names the missing one)."""
    config = TranslatorConfig(**data)
    _ = (config.in_width, config.out_width)
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
