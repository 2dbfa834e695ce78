"""The C2C fuser: projects a sharer's KV cache into a receiver's and fuses it (REFERENCE §1).

One projector per receiver layer and per K / V. For every fused token it reads the aligned sharer
layer's keys (or values) and the receiver layer's own, heads flattened and concatenated on the
channel axis, ``z = [sharer ; receiver]``, and computes

    x      = Block(Linear_in(z))                       # Block: x + Dropout(W2 GELU(W1 RMSNorm(x)))
    K_proj = Linear_out(Block_proj(x))                 # the receiver's KV width
    w      = sigmoid(Linear_w(Block_w(x)))             # one weight per receiver KV head
    K'     = K_r + g * w * K_proj                      # the receiver's own term is not scaled

``g`` is a per-layer gate (one logit for K and one for V, initialised to 0): Gumbel-sigmoid with
an annealed temperature while training, hard (``logit > 0``) at inference. ``Linear_out`` starts
at zero, so an untrained fuser leaves the receiver exactly as it was.

Checkpoints are a folder with ``fuser.safetensors`` (weights, fp32 or fp16) and ``config.json``
(the pair's architecture fingerprint, the width, how it was trained). Loading never unpickles.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from kvviz.align import terminal_layer_map

WEIGHTS_FILE = "fuser.safetensors"
CONFIG_FILE = "config.json"
FORMAT_VERSION = 1


class FuserError(ValueError):
    """A fuser checkpoint is missing, corrupt, inconsistent or made for another pair."""


def model_fingerprint(facts) -> dict:
    """What must match for a fuser to fit a model: architecture, KV shape, tokenizer."""
    return {
        "name": facts.name,
        "model_type": facts.model_type,
        "num_layers": facts.num_layers,
        "num_kv_heads": facts.num_kv_heads,
        "head_dim": facts.head_dim,
        "tokenizer_hash": facts.tokenizer_hash,
    }


_FINGERPRINT_KEYS = ("model_type", "num_layers", "num_kv_heads", "head_dim", "tokenizer_hash")


@dataclass
class FuserConfig:
    sharer: dict  # model_fingerprint of the sharer
    receiver: dict  # model_fingerprint of the receiver
    width: int = 96
    dropout: float = 0.1
    pair: str = ""
    control: bool = False  # trained with the sharer's KV replaced by zeros
    layer_map: list[int] = field(default_factory=list)
    training: dict = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def __post_init__(self):
        if not self.layer_map:
            self.layer_map = terminal_layer_map(self.sharer["num_layers"], self.receiver["num_layers"])

    @property
    def sharer_width(self) -> int:
        return self.sharer["num_kv_heads"] * self.sharer["head_dim"]

    @property
    def receiver_width(self) -> int:
        return self.receiver["num_kv_heads"] * self.receiver["head_dim"]

    def pair_label(self) -> str:
        return f"'{self.pair or '?'}' (sharer {self.sharer['name']} -> receiver {self.receiver['name']})"

    def to_dict(self) -> dict:
        return asdict(self)


def fingerprints_match(expected: dict, actual: dict) -> bool:
    return all(expected.get(key) == actual.get(key) for key in _FINGERPRINT_KEYS)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """x + Dropout(W2 · GELU(W1 · RMSNorm(x))), bias-free."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.norm = RMSNorm(width)
        self.up = nn.Linear(width, width, bias=False)
        self.down = nn.Linear(width, width, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class Projector(nn.Module):
    """One receiver layer's K (or V) path: [sharer ; receiver] -> (projection, head weights)."""

    def __init__(self, in_width: int, width: int, out_width: int, heads: int, dropout: float):
        super().__init__()
        self.inp = nn.Linear(in_width, width, bias=False)
        self.trunk = Block(width, dropout)
        self.proj_block = Block(width, dropout)
        self.proj_out = nn.Linear(width, out_width, bias=False)
        self.weight_block = Block(width, dropout)
        self.weight_out = nn.Linear(width, heads, bias=False)
        nn.init.zeros_(self.proj_out.weight)  # start as the identity fusion: K' = K_r

    def forward(self, sharer: torch.Tensor, receiver: torch.Tensor):
        x = self.trunk(self.inp(torch.cat([sharer, receiver], dim=-1)))
        projection = self.proj_out(self.proj_block(x))
        weights = torch.sigmoid(self.weight_out(self.weight_block(x)))
        return projection, weights


def flatten_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] -> [B, T, H*D]."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def unflatten_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, T, H*D] -> [B, H, T, D]."""
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


@dataclass
class LayerRecord:
    """What a layer's fusion did, for the app (plain numbers)."""

    layer: int
    sharer_layer: int
    gate_k_logit: float
    gate_v_logit: float
    gate_k: float
    gate_v: float
    gate_k_open: bool
    gate_v_open: bool
    head_weights_k: list[float]
    head_weights_v: list[float]


class C2CFuser(nn.Module):
    def __init__(self, config: FuserConfig):
        super().__init__()
        self.config = config
        heads, width = config.receiver["num_kv_heads"], config.width
        in_width = config.sharer_width + config.receiver_width
        out_width = config.receiver_width
        layers = config.receiver["num_layers"]
        self.key_projectors = nn.ModuleList(
            Projector(in_width, width, out_width, heads, config.dropout) for _ in range(layers)
        )
        self.value_projectors = nn.ModuleList(
            Projector(in_width, width, out_width, heads, config.dropout) for _ in range(layers)
        )
        # [layers, 2]: column 0 gates K, column 1 gates V; logit 0 = undecided
        self.gate_logits = nn.Parameter(torch.zeros(layers, 2))
        self.temperature = 1.0  # Gumbel-sigmoid temperature while training (annealed by the trainer)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def gates(self, hard: bool | None = None) -> torch.Tensor:
        """[layers, 2] gate values: Gumbel-sigmoid while training, 0/1 at inference."""
        hard = (not self.training) if hard is None else hard
        if hard:
            return (self.gate_logits > 0).to(self.gate_logits.dtype)
        uniform = torch.rand_like(self.gate_logits).clamp(1e-6, 1 - 1e-6)
        noise = torch.log(uniform) - torch.log1p(-uniform)  # difference of two Gumbels (logistic)
        return torch.sigmoid((self.gate_logits + noise) / self.temperature)

    def fuse_layer(
        self,
        layer: int,
        receiver_kv: tuple[torch.Tensor, torch.Tensor],
        sharer_kv: tuple[torch.Tensor, torch.Tensor],
        gate: torch.Tensor,
    ):
        """Fuse one layer. KV tensors are [B, H, T, D] over the fused tokens only (same T).

        Returns (K', V', head weights K [B, T, H], head weights V [B, T, H]).
        """
        heads = self.config.receiver["num_kv_heads"]
        out = []
        weights_out = []
        for index, projectors in enumerate((self.key_projectors, self.value_projectors)):
            # the fuser computes in its own dtype (fp32) whatever the models' dtype
            dtype = self.gate_logits.dtype
            own, other = receiver_kv[index].to(dtype), sharer_kv[index].to(dtype)
            projection, weights = projectors[layer](flatten_heads(other), flatten_heads(own))
            delta = unflatten_heads(projection, heads) * weights.transpose(1, 2).unsqueeze(-1)
            out.append((own + gate[index] * delta).to(receiver_kv[index].dtype))
            weights_out.append(weights)
        return out[0], out[1], weights_out[0], weights_out[1]

    def fuse(
        self,
        receiver_layers: list[tuple[torch.Tensor, torch.Tensor]],
        sharer_layers: list[tuple[torch.Tensor, torch.Tensor]] | None,
        receiver_positions: list[int] | torch.Tensor,
        sharer_positions: list[int] | torch.Tensor,
        hard: bool | None = None,
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[LayerRecord]]:
        """Fuse whole caches (lists of (K, V) per layer); only the given token positions change.

        ``receiver_positions[i]`` of the receiver is fused with ``sharer_positions[i]`` of the
        sharer. With ``self.config.control`` (or ``sharer_layers=None``) the sharer's KV is replaced
        by zeros.
        """
        if len(receiver_layers) != len(self.key_projectors):
            raise FuserError(f"the fuser has {len(self.key_projectors)} layers, the receiver cache {len(receiver_layers)}")
        device = receiver_layers[0][0].device
        r_index = torch.as_tensor(receiver_positions, dtype=torch.long, device=device)
        s_index = torch.as_tensor(sharer_positions, dtype=torch.long, device=device)
        gates = self.gates(hard)
        logits = self.gate_logits.detach().float()
        fused, records = [], []
        for layer, (keys, values) in enumerate(receiver_layers):
            source = self.config.layer_map[layer]
            if r_index.numel() == 0:
                fused.append((keys, values))
                heads = keys.shape[1]
                k_weights = v_weights = torch.zeros(heads)
            else:
                if self.config.control or sharer_layers is None:
                    # the control fuser: the sharer input carries no information
                    shape = (keys.shape[0], self.config.sharer["num_kv_heads"], r_index.numel(), self.config.sharer["head_dim"])
                    s_keys = s_values = torch.zeros(shape, dtype=keys.dtype, device=device)
                else:
                    s_keys, s_values = sharer_layers[source]
                    s_keys = s_keys.index_select(2, s_index.to(s_keys.device)).to(device)
                    s_values = s_values.index_select(2, s_index.to(s_values.device)).to(device)
                own = (keys.index_select(2, r_index), values.index_select(2, r_index))
                new_k, new_v, k_w, v_w = self.fuse_layer(layer, own, (s_keys, s_values), gates[layer])
                keys = keys.index_copy(2, r_index, new_k.to(keys.dtype))
                values = values.index_copy(2, r_index, new_v.to(values.dtype))
                fused.append((keys, values))
                k_weights = k_w.detach().float().mean(dim=(0, 1))
                v_weights = v_w.detach().float().mean(dim=(0, 1))
            records.append(
                LayerRecord(
                    layer=layer,
                    sharer_layer=source,
                    gate_k_logit=float(logits[layer, 0]),
                    gate_v_logit=float(logits[layer, 1]),
                    gate_k=float(torch.sigmoid(logits[layer, 0])),
                    gate_v=float(torch.sigmoid(logits[layer, 1])),
                    gate_k_open=bool(logits[layer, 0] > 0),
                    gate_v_open=bool(logits[layer, 1] > 0),
                    head_weights_k=[float(x) for x in k_weights],
                    head_weights_v=[float(x) for x in v_weights],
                )
            )
        return fused, records

    def forward(self, receiver_layers, sharer_layers, receiver_positions, sharer_positions, hard=None):
        """``fuse`` (so that a DDP wrapper sees a forward call and averages the gradients)."""
        return self.fuse(receiver_layers, sharer_layers, receiver_positions, sharer_positions, hard)

    # --- checkpoints -------------------------------------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float32) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in self.state_dict().items()}
        # gate logits decide open/closed: keep them exact whatever the storage dtype
        tensors["gate_logits"] = self.gate_logits.detach().to("cpu", torch.float32).contiguous()
        tmp_weights = folder / (WEIGHTS_FILE + ".tmp")
        save_file(tensors, str(tmp_weights), metadata={"format": "kvviz-c2c-fuser", "version": str(FORMAT_VERSION)})
        tmp_weights.chmod(0o644)
        tmp_weights.replace(folder / WEIGHTS_FILE)
        tmp_config = folder / (CONFIG_FILE + ".tmp")
        tmp_config.write_text(json.dumps(self.config.to_dict(), indent=2))
        tmp_config.replace(folder / CONFIG_FILE)
        return folder


PROJECT_ROOT = Path(__file__).resolve().parents[1]


def checkpoint_label(folder: str | Path) -> str:
    """A checkpoint's path for results and reports: relative to the project when inside it, so
    that shipped results name no machine-specific folder."""
    path = Path(folder).resolve()
    try:
        return str(path.relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def read_config(folder: str | Path) -> FuserConfig:
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FuserError(f"No fuser at {folder}: {CONFIG_FILE} is missing (a fuser folder holds {CONFIG_FILE} and {WEIGHTS_FILE}).")
    try:
        data = json.loads(path.read_text())
        config = FuserConfig(**data)
        _ = (config.sharer_width, config.receiver_width, config.receiver["num_layers"], config.sharer["num_layers"])
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FuserError(f"The fuser config {path} is not valid JSON: {error}") from error
    except (TypeError, KeyError) as error:
        raise FuserError(f"The fuser config {path} is incomplete or has unknown fields: {error}") from error
    if config.version != FORMAT_VERSION:
        raise FuserError(f"The fuser config {path} has format version {config.version}; this kvviz reads {FORMAT_VERSION}.")
    return config


def load_fuser(folder: str | Path, sharer_facts=None, receiver_facts=None, pair_name: str = "", device="cpu") -> C2CFuser:
    """Load a checkpoint; with facts given, refuse a fuser made for another pair (naming both)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    config = read_config(folder)
    if sharer_facts is not None and receiver_facts is not None:
        wanted_s, wanted_r = model_fingerprint(sharer_facts), model_fingerprint(receiver_facts)
        if not (fingerprints_match(config.sharer, wanted_s) and fingerprints_match(config.receiver, wanted_r)):
            differ = [
                f"{role} {key} {saved.get(key)!r} != {wanted.get(key)!r}"
                for role, saved, wanted in (("sharer", config.sharer, wanted_s), ("receiver", config.receiver, wanted_r))
                for key in _FINGERPRINT_KEYS
                if saved.get(key) != wanted.get(key)
            ]
            raise FuserError(
                f"The fuser at {folder} was trained for pair {config.pair_label()}, "
                f"but the loaded pair is '{pair_name or '?'}' (sharer {sharer_facts.name} -> receiver {receiver_facts.name}); "
                f"they differ in: {'; '.join(differ[:3])}. Train a fuser for this pair with: python -m kvviz train-fuser"
            )
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise FuserError(f"The fuser at {folder} has no weights file {WEIGHTS_FILE}.")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise FuserError(f"The fuser weights {path} are corrupt or not a safetensors file: {error}") from error
    fuser = C2CFuser(config)
    expected = fuser.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [
        f"{name} {tuple(tensors[name].shape)} != {tuple(expected[name].shape)}"
        for name in expected
        if name in tensors and tensors[name].shape != expected[name].shape
    ]
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if wrong:
            problems.append(f"shape mismatch: {wrong[0]}")
        raise FuserError(f"The fuser config at {folder} does not match its weights: " + "; ".join(problems) + ".")
    fuser.load_state_dict({name: tensor.to(expected[name].dtype) for name, tensor in tensors.items()})
    fuser.eval()
    return fuser.to(device)


def new_fuser(sharer_facts, receiver_facts, width: int = 96, dropout: float = 0.1, pair: str = "", control: bool = False) -> C2CFuser:
    config = FuserConfig(
        sharer=model_fingerprint(sharer_facts),
        receiver=model_fingerprint(receiver_facts),
        width=width,
        dropout=dropout,
        pair=pair,
        control=control,
    )
    return C2CFuser(config)


def annealed_temperature(step: int, total_steps: int, start: float = 1.0, end: float = 0.001) -> float:
    """Exponential annealing from ``start`` to ``end`` over training (REFERENCE §1: 1.0 -> 0.001)."""
    if total_steps <= 1:
        return end
    fraction = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(math.exp(math.log(start) + fraction * (math.log(end) - math.log(start))))
