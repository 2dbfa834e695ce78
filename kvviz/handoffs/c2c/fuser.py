"""The C2C fuser: projects a sharer's KV cache into a receiver's and fuses it (REFERENCE §1).

One projector per receiver layer and per K / V. For every fused token it reads the aligned sharer
layer's keys (or values) and the receiver layer's own, heads flattened and concatenated on the
channel axis, ``z = [sharer ; receiver]``, and computes

    x      = Block(Linear_in(z))                       # Block: x + Dropout(W2 GELU(W1 RMSNorm(x)))
    K_proj = Linear_out(Block_proj(x))                 # the receiver's KV width
    w      = sigmoid(Linear_w(Block_w(x)))             # one weight per receiver KV head
    K'     = K_r + g * w * K_proj                      # the receiver's own term is not scaled

``g`` is a gate per layer (one logit for K and one for V, initialised to 0). While training it is
``sigmoid((logit + Gumbel noise) / tau)`` with the noise drawn per batch item, receiver head and
token, as the reference trains it; at inference it is hard, ``logit > 0``.

Architecture variants (all in the config, so a checkpoint says what it is):

* ``bias``, ``intermediate`` (the inner width of the trunk and projection blocks; the weighting
  block's inner width is ``width``) and ``proj_blocks``: the paper's published ``C2CProjector``
  has biases on its three linear maps, intermediate 1024 and ``num_layers - 2`` projection blocks;
  kvviz's own fusers up to format 1 had none of these (bias-free, inner width = width, one block).
* ``rope``: ``"plain"`` feeds the keys as cached, after RoPE (the paper). ``"aware"`` (beyond the
  paper) first undoes each model's rotation at the token's own position, projects position-free
  keys, and rotates the projected keys at the receiver's positions, so that a sharer whose tokens
  sit at other positions (a private context shifts them) gives the projector the same input.
  The rotary tables come from each model's own rotary module (``kvviz.runtime.rope.RopeTables``).
* ``fuse``: ``"kv"`` (the paper), ``"k"`` or ``"v"`` (ablations: the other gate is held closed).
* ``layer_map``: receiver layer -> sharer layer; ``-1`` leaves a receiver layer unfused.
* ``token_alignment``: how the sharer reads the message (``kvviz.handoffs.c2c.align``): ``"longest"`` (the
  paper: one re-encoded sharer token per receiver token) or ``"natural"`` (the sharer's own
  tokenization; each receiver token reads the sharer token holding its last character).
* ``fuse_template``: also fuse the receiver's template tokens before its last prompt token, paired
  with the end of the sharer's generation prompt (where the sharer is about to answer).

Checkpoints are a folder with ``fuser.safetensors`` (weights, fp32 or fp16) and ``config.json``
(``kvviz.handoffs.c2c.config``: the pair's architecture fingerprint, the architecture, how it was
trained); the projector is ``kvviz.handoffs.c2c.projector``. Loading never unpickles.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kvviz.handoffs.c2c.config import CONFIG_FILE, FORMAT_VERSION, WEIGHTS_FILE, FuserConfig, FuserError, check_pair, read_config
from kvviz.handoffs.c2c.projector import Projector, flatten_heads, gumbel_noise, unflatten_heads
from kvviz.runtime.checkpoints import model_fingerprint, read_weights
from kvviz.runtime.rope import apply_rotation, undo_rotation


@dataclass
class LayerRecord:
    """What a layer's fusion did, for the app (plain numbers)."""

    layer: int
    sharer_layer: int
    gate_k_logit: float
    gate_v_logit: float
    gate_k: float  # sigmoid of the logit (what training moves)
    gate_v: float
    gate_k_open: bool  # the gate applied at inference: 1 when open, 0 when closed
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

        def projector():
            return Projector(
                in_width, width, out_width, heads, config.dropout, config.intermediate, config.bias, config.proj_blocks
            )

        self.key_projectors = nn.ModuleList(projector() for _ in range(layers))
        self.value_projectors = nn.ModuleList(projector() for _ in range(layers))
        # [layers, 2]: column 0 gates K, column 1 gates V; logit 0 = undecided
        self.gate_logits = nn.Parameter(torch.zeros(layers, 2))
        self.temperature = 1.0  # Gumbel-sigmoid temperature while training (annealed by the trainer)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def zero_output(self) -> None:
        """Zero every projection output (an untrained fuser then leaves the receiver as it is)."""
        with torch.no_grad():
            for projector in list(self.key_projectors) + list(self.value_projectors):
                projector.proj_out.weight.zero_()
                if projector.proj_out.bias is not None:
                    projector.proj_out.bias.zero_()

    def allowed(self) -> torch.Tensor:
        """[layers, 2] 1 where a gate may open: fused layers, and the paths ``fuse`` keeps."""
        mask = torch.ones_like(self.gate_logits)
        mask[torch.tensor([s < 0 for s in self.config.layer_map], device=mask.device)] = 0
        if self.config.fuse == "k":
            mask[:, 1] = 0
        elif self.config.fuse == "v":
            mask[:, 0] = 0
        return mask

    def open_gates(self) -> torch.Tensor:
        """[layers, 2] booleans: the gates applied at inference."""
        return (self.gate_logits.detach() > 0) & (self.allowed() > 0)

    def gates(self, hard: bool | None = None) -> torch.Tensor:
        """[layers, 2] per-layer gate values: 0/1 at inference; sigmoid(logit / tau) (no noise) else.

        While training the fusion draws its noise per batch item, head and token (``gate``).
        """
        hard = (not self.training) if hard is None else hard
        if hard:
            return self.open_gates().to(self.gate_logits.dtype)
        return torch.sigmoid(self.gate_logits / self.temperature) * self.allowed()

    def gate(self, layer: int, index: int, shape: tuple, hard: bool) -> torch.Tensor:
        """The gate of one layer's K (index 0) or V (1) path, broadcastable to [B, H, T, D]."""
        logit = self.gate_logits[layer, index]
        if not bool(self.allowed()[layer, index]):
            return torch.zeros((), dtype=logit.dtype, device=logit.device)
        if hard:
            return (logit > 0).to(logit.dtype)
        noise = gumbel_noise((shape[0], shape[1], shape[2], 1), logit.device, logit.dtype)
        return torch.sigmoid((logit + noise) / self.temperature)

    def fuse_layer(
        self,
        layer: int,
        receiver_kv: tuple[torch.Tensor, torch.Tensor],
        sharer_kv: tuple[torch.Tensor, torch.Tensor],
        hard: bool,
        rope: tuple | None = None,
    ):
        """Fuse one layer. KV tensors are [B, H, T, D] over the fused tokens only (same T).

        ``rope``: ((cos_r, sin_r), (cos_s, sin_s)) at the fused tokens' positions, for
        ``rope="aware"``. Returns (K', V', head weights K [B, T, H], head weights V [B, T, H]).
        """
        heads = self.config.receiver["num_kv_heads"]
        dtype = self.key_projectors[layer].inp.weight.dtype  # the fuser's own dtype, whatever the models'
        out, weights_out = [], []
        for index, projectors in enumerate((self.key_projectors, self.value_projectors)):
            own, other = receiver_kv[index].to(dtype), sharer_kv[index].to(dtype)
            rotated = index == 0 and self.config.rope == "aware"
            own_in = own
            if rotated:
                (cos_r, sin_r), (cos_s, sin_s) = rope
                own_in = undo_rotation(own, cos_r, sin_r)
                other = undo_rotation(other, cos_s, sin_s)
            projection, weights = projectors[layer](flatten_heads(other), flatten_heads(own_in))
            delta = unflatten_heads(projection, heads) * weights.transpose(1, 2).unsqueeze(-1)
            if rotated:
                delta = apply_rotation(delta, cos_r, sin_r)
            gate = self.gate(layer, index, own.shape, hard).to(dtype)
            out.append((own + gate * delta).to(receiver_kv[index].dtype))
            weights_out.append(weights)
        return out[0], out[1], weights_out[0], weights_out[1]

    def fuse(
        self,
        receiver_layers: list[tuple[torch.Tensor, torch.Tensor]],
        sharer_layers: list[tuple[torch.Tensor, torch.Tensor]] | None,
        receiver_positions: list[int] | torch.Tensor,
        sharer_positions: list[int] | torch.Tensor,
        hard: bool | None = None,
        rope=None,
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list[LayerRecord]]:
        """Fuse whole caches (lists of (K, V) per layer); only the given token positions change.

        ``receiver_positions[i]`` of the receiver is fused with ``sharer_positions[i]`` of the
        sharer (indices into the caches). With ``self.config.control`` (or ``sharer_layers=None``)
        the sharer's KV is replaced by zeros. ``rope`` (a ``kvviz.runtime.rope.RopeTables``) gives the
        rotary tables a ``rope="aware"`` fuser needs.
        """
        if len(receiver_layers) != len(self.key_projectors):
            raise FuserError(f"the fuser has {len(self.key_projectors)} layers, the receiver cache {len(receiver_layers)}")
        hard = (not self.training) if hard is None else hard
        if self.config.rope == "aware" and rope is None and len(receiver_positions):
            raise FuserError("this fuser projects position-free keys (rope='aware') and needs the models' rotary tables")
        device = receiver_layers[0][0].device
        r_index = torch.as_tensor(receiver_positions, dtype=torch.long, device=device)
        s_index = torch.as_tensor(sharer_positions, dtype=torch.long, device=device)
        logits = self.gate_logits.detach().float()
        applied = self.open_gates()
        fused, records = [], []
        for layer, (keys, values) in enumerate(receiver_layers):
            source = self.config.layer_map[layer]
            heads = keys.shape[1]
            k_weights = v_weights = torch.zeros(heads)
            if r_index.numel() == 0 or source < 0:
                fused.append((keys, values))
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
                tables = None
                if self.config.rope == "aware":
                    tables = (rope.receiver(layer), rope.sharer(source))
                new_k, new_v, k_w, v_w = self.fuse_layer(layer, own, (s_keys, s_values), hard, tables)
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
                    gate_k_open=bool(applied[layer, 0]),
                    gate_v_open=bool(applied[layer, 1]),
                    head_weights_k=[float(x) for x in k_weights],
                    head_weights_v=[float(x) for x in v_weights],
                )
            )
        return fused, records

    def forward(self, receiver_layers, sharer_layers, receiver_positions, sharer_positions, hard=None, rope=None):
        """``fuse`` (so that a DDP wrapper sees a forward call and averages the gradients)."""
        return self.fuse(receiver_layers, sharer_layers, receiver_positions, sharer_positions, hard, rope)

    # --- checkpoints -------------------------------------------------------------------------

    def save(self, folder: str | Path, dtype: torch.dtype = torch.float32) -> Path:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: tensor.detach().to("cpu", dtype).contiguous() for name, tensor in self.state_dict().items()}
        # gate logits decide open/closed: keep them exact whatever the storage dtype
        tensors["gate_logits"] = self.gate_logits.detach().to("cpu", torch.float32).contiguous()
        self.config.version = FORMAT_VERSION
        tmp_weights = folder / (WEIGHTS_FILE + ".tmp")
        save_file(tensors, str(tmp_weights), metadata={"format": "kvviz-c2c-fuser", "version": str(FORMAT_VERSION)})
        tmp_weights.chmod(0o644)
        tmp_weights.replace(folder / WEIGHTS_FILE)
        tmp_config = folder / (CONFIG_FILE + ".tmp")
        tmp_config.write_text(json.dumps(self.config.to_dict(), indent=2))
        tmp_config.replace(folder / CONFIG_FILE)
        return folder


def build_from_tensors(config: FuserConfig, tensors: dict, where, dtype: torch.dtype | None = torch.float32) -> C2CFuser:
    """A fuser from a config and its tensors; FuserError when they do not describe each other.

    Built on the meta device and filled with the tensors (no random initialisation of weights
    that are overwritten anyway). ``dtype``: the projectors' dtype (None: as stored); the gate
    logits stay float32.
    """
    with torch.device("meta"):
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
        raise FuserError(f"The fuser config at {where} does not match its weights: " + "; ".join(problems) + ".")
    state = {}
    for name, tensor in tensors.items():
        wanted = torch.float32 if name == "gate_logits" or tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32) else dtype
        state[name] = tensor.to(wanted or tensor.dtype).clone()
    fuser.load_state_dict(state, assign=True)
    fuser.eval()
    return fuser


def load_fuser(
    folder: str | Path, sharer_facts=None, receiver_facts=None, pair_name: str = "", device="cpu", dtype: torch.dtype = torch.float32
) -> C2CFuser:
    """Load a checkpoint; with facts given, refuse a fuser made for another pair (naming both)."""
    folder = Path(folder)
    config = read_config(folder)
    if sharer_facts is not None and receiver_facts is not None:
        check_pair(config, folder, sharer_facts, receiver_facts, pair_name)
    tensors = read_weights(folder, WEIGHTS_FILE, "fuser", FuserError)
    return build_from_tensors(config, tensors, folder, dtype).to(device)


def new_fuser(
    sharer_facts, receiver_facts, width: int = 96, dropout: float = 0.1, pair: str = "", control: bool = False,
    **variants,
) -> C2CFuser:
    """A freshly initialised fuser. ``variants``: bias, intermediate, proj_blocks, rope, fuse, token_alignment, layer_map."""
    config = FuserConfig(
        sharer=model_fingerprint(sharer_facts),
        receiver=model_fingerprint(receiver_facts),
        width=width,
        dropout=dropout,
        pair=pair,
        control=control,
        **variants,
    )
    return C2CFuser(config)


def annealed_temperature(step: int, total_steps: int, start: float = 1.0, end: float = 0.001) -> float:
    """Exponential annealing from ``start`` to ``end`` over ``total_steps`` (then held at ``end``)."""
    if total_steps <= 1:
        return end
    fraction = min(max(step / (total_steps - 1), 0.0), 1.0)
    return float(math.exp(math.log(start) + fraction * (math.log(end) - math.log(start))))
