"""Phase-A prototype for issue 20: one batched decode step for B sequences, each with its own cache.

Not engine code (research only; kvviz/runtime/step.py is what the engine took). Every phase-A
measurement of the prototype's steps is a command here, so that they share one ``Stepper``. Run
from the worktree root (``--threads N`` after any command; 1 by default):

    PYTHONPATH=. python research/speed_prototype.py exact [--tokens 32]   # tokens alone vs batched
    PYTHONPATH=. python research/speed_prototype.py speed [--all]         # ms per step by B, per variant
    PYTHONPATH=. python research/speed_prototype.py lean [MODELS]         # the lean step (lean v2)
    PYTHONPATH=. python research/speed_prototype.py compile [MODEL]       # torch.compile of the pieces
    PYTHONPATH=. python research/speed_prototype.py fused MODELS          # fused vs separate products
    PYTHONPATH=. python research/speed_prototype.py overhead MODELS       # the step without its products
    PYTHONPATH=. python research/speed_prototype.py profile MODEL B [--lean]
    PYTHONPATH=. python research/speed_prototype.py tiny                  # the tiny test models
    PYTHONPATH=. python research/speed_prototype.py step-check [--embedded]   # kvviz's DecodeStep, bitwise

(``lean``, ``compile``, ``fused``, ``overhead``, ``profile``, ``tiny`` and ``step-check`` were
research/lean_step.py, compile_pieces.py, fused_kernels.py, overhead.py, profile_lean.py and
profile_lean2.py, tiny_check.py and step_check.py, with the same arguments.)

What a batched step is here (``Stepper.step``):

* The B sequences' new tokens go through the decoder stack as one [M, hidden] block, M a *fixed*
  bucket (``BUCKET`` rows; the unused rows are padding). A linear kernel's rounding depends on the
  number of rows it is given but not on a row's position or on the other rows
  (research/invariance.py), so a fixed M makes every row's bits independent of who else is in the
  batch: a sequence alone and the same sequence in a batch of six get identical hidden states.
* The linear layers use oneDNN with weights packed once (``torch.ops.mkldnn._linear_pointwise``):
  on this CPU it is faster at M = 6 than MKL's F.linear at M = 1 (research/kernels_m.py).
* Attention runs per sequence on its own cache (its own keys, positions and, for sliding-window
  layers that need one, its own mask; kvviz.runtime.attention's rules), so no padding enters any softmax.
  ``Stepper(attention="padded")`` (one of ``exact``'s variants) instead left-pads every layer's keys
  to the longest sequence and runs one masked SDPA for the batch (the "pad and mask" design): not
  bitwise equal to alone.
* Everything else (norms, rotary, activations, residuals) is row-wise.
* The head: one approximate scan for all rows, then each row's candidates rescored exactly
  (kvviz.runtime.head's rule: the exact argmax whenever the winner is among the candidates).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime import cache as kv
from kvviz.runtime.attention import AttentionPlan, positional_mask

BUCKET = 6
INT4_ROWS = 4  # the head's int4 scan is cheaper than the bf16 one up to this many rows (research/head_m.py)


# --- linear kernels --------------------------------------------------------------------------


def pack(weight: torch.Tensor, kind: str):
    """A weight prepared for ``apply_linear`` in one of the kernels compared here."""
    weight = weight.detach()
    if kind == "mkl":  # today's path: F.linear on the fp32 weight
        return ("mkl", weight)
    if kind == "mkldnn":
        return ("mkldnn", torch.ops.mkldnn._reorder_linear_weight(weight, None))
    if kind == "bf16":
        return ("bf16", torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None))
    if kind == "int8":  # per output channel, symmetric; activations in bf16
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
        return ("int8", (torch.round(weight / scales[:, None]).to(torch.int8), scales.bfloat16()))
    raise ValueError(kind)


def apply_linear(x: torch.Tensor, packed, bias=None) -> torch.Tensor:
    kind, w = packed
    if kind == "mkl":
        return F.linear(x, w, bias)
    if kind == "mkldnn":
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    if kind == "bf16":
        return torch.ops.mkldnn._linear_pointwise(x.bfloat16(), w, None, "none", [], "").float() + (0 if bias is None else bias)
    if kind == "int8":
        q, s = w
        flat = x.reshape(-1, x.shape[-1]).bfloat16()
        out = torch.ops.aten._weight_int8pack_mm(flat, q, s).float().reshape(*x.shape[:-1], -1)
        return out + (0 if bias is None else bias)
    raise ValueError(kind)


# --- the lean per-layer step ---------------------------------------------------------------------


class LayerWeights:
    def __init__(self, layer, kind: str, fuse: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.fuse = fuse
        if fuse:
            self.qkv = pack(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), kind)
            self.qkv_bias = None
            if attn.q_proj.bias is not None:
                self.qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).detach()
            self.gate_up = pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), kind)
        else:
            self.q, self.k, self.v = (pack(m.weight, kind) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            self.biases = tuple(None if m.bias is None else m.bias.detach() for m in (attn.q_proj, attn.k_proj, attn.v_proj))
            self.gate, self.up = pack(mlp.gate_proj.weight, kind), pack(mlp.up_proj.weight, kind)
        self.o = pack(attn.o_proj.weight, kind)
        self.down = pack(mlp.down_proj.weight, kind)
        self.sizes = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
        self.intermediate = mlp.gate_proj.out_features

    def qkv_of(self, h):
        if self.fuse:
            return apply_linear(h, self.qkv, self.qkv_bias).split(self.sizes, dim=-1)
        return tuple(apply_linear(h, w, b) for w, b in zip((self.q, self.k, self.v), self.biases))

    def gate_up_of(self, h):
        if self.fuse:
            return apply_linear(h, self.gate_up).split((self.intermediate, self.intermediate), dim=-1)
        return apply_linear(h, self.gate), apply_linear(h, self.up)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Stepper:
    """A batched decode step for one model (Gemma 3 and Llama-family decoders)."""

    def __init__(self, loaded, kind="mkldnn", fuse=True, bucket=BUCKET, attention="per_sequence", head="batched"):
        self.loaded = loaded
        self.decoder = loaded.model.model
        config = loaded.model.config.get_text_config()
        self.config = config
        self.gemma = config.model_type.startswith("gemma3")
        self.layers = [LayerWeights(layer, kind, fuse) for layer in self.decoder.layers]
        self.head_dim = loaded.facts.head_dim
        self.num_heads, self.num_kv = loaded.facts.num_heads, loaded.facts.num_kv_heads
        self.layer_types = list(loaded.facts.layer_types)
        self.window = loaded.facts.sliding_window
        self.scaling = (config.query_pre_attn_scalar ** -0.5) if self.gemma else self.head_dim ** -0.5
        self.bucket = bucket
        self.attention = attention
        self.head_mode = head
        self.has_qk_norm = hasattr(self.decoder.layers[0].self_attn, "q_norm")
        if head == "batched" and loaded.head.scan_index() is not None:
            weight = loaded.head.linear.weight.detach()
            self.head_scan = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None)
        else:
            self.head_scan = None

    # norms exactly as the HF modules compute them (called through the modules: same code)
    def rows(self, count):
        return self.bucket if self.bucket else count

    @torch.no_grad()
    def step(self, states: list[kv.KVState], tokens: list[int]) -> torch.Tensor:
        """Feed one token into each state (in place); returns the final hidden state per sequence [B, hidden]."""
        count = len(states)
        rows = max(self.rows(count), count)
        ids = torch.zeros(rows, 1, dtype=torch.long)
        ids[:count, 0] = torch.tensor(tokens)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        positions[:count, 0] = torch.tensor([s.next_position for s in states])
        x = self.decoder.embed_tokens(ids)  # [rows, 1, hidden]
        tables = {}
        for layer_type in set(self.layer_types):
            if self.gemma:
                tables[layer_type] = self.decoder.rotary_emb(x, positions, layer_type)
            else:
                tables[layer_type] = self.decoder.rotary_emb(x, positions)
        padded = self._padded_caches(states) if self.attention == "padded" else None
        for index, (layer, weights) in enumerate(zip(self.decoder.layers, self.layers)):
            cos, sin = tables[self.layer_types[index]]
            x = self._layer(index, layer, weights, x, cos, sin, states, positions, padded)
        x = self.decoder.norm(x)
        for state in states:
            state.next_position += 1
        return x[:count, 0]

    def _layer(self, index, layer, weights, x, cos, sin, states, positions, padded):
        attn = layer.self_attn
        residual = x
        h = layer.input_layernorm(x)
        q, k, v = weights.qkv_of(h)
        rows = x.shape[0]
        q = q.view(rows, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(rows, 1, self.num_kv, self.head_dim).transpose(1, 2)
        v = v.view(rows, 1, self.num_kv, self.head_dim).transpose(1, 2)
        if self.has_qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        out = torch.zeros(rows, 1, self.num_heads * self.head_dim)
        if padded is None:
            for b, state in enumerate(states):
                keys, values = state.cache.update(k[b : b + 1], v[b : b + 1], index)
                out[b] = self._attend(index, q[b : b + 1], keys, values, state, int(positions[b, 0]))[0]
        else:
            out[: len(states)] = self._attend_padded(index, q, k, v, states, positions, padded)
        o = apply_linear(out, weights.o)
        if self.gemma:
            x = residual + layer.post_attention_layernorm(o)
            h = layer.pre_feedforward_layernorm(x)
            gate, up = weights.gate_up_of(h)
            d = apply_linear(layer.mlp.act_fn(gate) * up, weights.down)
            return x + layer.post_feedforward_layernorm(d)
        x = residual + o
        h = layer.post_attention_layernorm(x)
        gate, up = weights.gate_up_of(h)
        return x + apply_linear(layer.mlp.act_fn(gate) * up, weights.down)

    def _attend(self, index, q, keys, values, state, position):
        """One sequence's attention on its own cache (no mask unless its sliding window needs one)."""
        sliding = self.window if self.layer_types[index] == "sliding_attention" else None
        plan = AttentionPlan(prefix_positions=state.prefix_positions)
        mask = None
        if not plan.sees_every_key(index, keys.shape[2], position, sliding):
            key_positions = plan.key_positions(index, keys.shape[2], position, q.device)
            mask = positional_mask(torch.tensor([position]), key_positions, sliding)
        gqa = self.num_heads != self.num_kv
        if gqa and mask is not None:
            groups = self.num_heads // self.num_kv
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
            gqa = False
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(1, 1, -1)

    # --- the "pad every layer to the longest and mask" alternative ---

    def _padded_caches(self, states):
        """Per layer: left-padded keys/values of every sequence [B, kv, Lmax, D] and key positions
        [B, Lmax] (-1 for padding). Rebuilt every step here (a real engine would keep it)."""
        layers = []
        for index in range(len(self.layers)):
            lengths = [kv.layer_length(s.cache, index) for s in states]
            longest = max(lengths)
            keys = torch.zeros(len(states), self.num_kv, longest, self.head_dim)
            values = torch.zeros_like(keys)
            key_positions = torch.full((len(states), longest), -(10**9), dtype=torch.long)
            for b, (state, length) in enumerate(zip(states, lengths)):
                k, v = kv.layer_kv(state.cache, index)
                keys[b, :, longest - length :] = k[0]
                values[b, :, longest - length :] = v[0]
                plan = AttentionPlan(prefix_positions=state.prefix_positions)
                key_positions[b, longest - length :] = plan.key_positions(index, length, state.next_position - 1, "cpu")
            layers.append((keys, values, key_positions))
        return layers

    def _attend_padded(self, index, q, k, v, states, positions, padded):
        count = len(states)
        keys, values, key_positions = padded[index]
        keys = torch.cat([keys, k[:count]], dim=2)
        values = torch.cat([values, v[:count]], dim=2)
        key_positions = torch.cat([key_positions, positions[:count]], dim=1)
        padded[index] = (keys, values, key_positions)
        for b, state in enumerate(states):  # keep each sequence's own cache in step too
            state.cache.update(k[b : b + 1], v[b : b + 1], index)
        sliding = self.window if self.layer_types[index] == "sliding_attention" else None
        difference = positions[:count] - key_positions  # [B, L]
        allowed = (difference >= 0) & (key_positions >= 0)
        if sliding:
            allowed &= difference < sliding
        groups = self.num_heads // self.num_kv
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q[:count], keys, values, attn_mask=allowed[:, None, None, :], scale=self.scaling)
        return out.transpose(1, 2).reshape(count, 1, -1)

    # --- the head ---

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int]:
        """kvviz.runtime.head's greedy rule per row: approximate scan for all rows at once (int4 for up to
        ``INT4_ROWS`` rows, else bf16 through oneDNN), then each row's candidates scored exactly."""
        head = self.loaded.head
        index = head.scan_index()
        if index is None or hidden.shape[0] == 1 or self.head_mode != "batched":
            return [head.greedy_token(hidden[b : b + 1]) for b in range(hidden.shape[0])]
        from kvviz.runtime.head import CANDIDATES, GROUP_SIZE

        if hidden.shape[0] <= INT4_ROWS or self.head_scan is None:
            packed, scales_and_zeros = index
            approximate = torch.ops.aten._weight_int4pack_mm_for_cpu(hidden.bfloat16(), packed, GROUP_SIZE, scales_and_zeros)
        else:
            approximate = torch.ops.mkldnn._linear_pointwise(hidden.bfloat16(), self.head_scan, None, "none", [], "")
        top = torch.topk(approximate.float(), CANDIDATES, dim=-1).indices
        chosen = []
        for b in range(hidden.shape[0]):
            candidates = top[b]
            exact = F.linear(hidden[b : b + 1], head.linear.weight.index_select(0, candidates))[0].float()
            winners = torch.nonzero(exact == exact.max()).flatten()
            if int(winners[0]) >= CANDIDATES * 3 // 4:
                chosen.append(int(torch.argmax(head.logits(hidden[b : b + 1]), dim=-1)[0]))
            else:
                chosen.append(int(candidates[winners].min()))
        return chosen


# --- the leaner step (lean v2) ---------------------------------------------------------------------
#
# Against ``Stepper`` it changes only how the same arithmetic is issued:
#
# * RMSNorm through ``F.rms_norm`` (one op; bitwise equal to the HF modules' formula here, checked
#   in ``check_lean``) with Gemma's ``1 + weight`` precomputed;
# * queries and keys rotated together (they sit side by side in the fused QKV output);
# * each sequence's keys and values appended in place into a buffer with spare room
#   (``GrowingKV``) instead of ``torch.cat`` of the whole cache every step;
# * one ``torch.cat`` per layer for the sequences' attention outputs.


class GrowingKV:
    """One sequence's keys and values for every layer, in buffers with spare room: appending a token
    writes one slot in place (amortised O(1)) instead of copying the whole layer."""

    def __init__(self, cache, spare: int = 64):
        self.layers = []
        for index in range(kv.num_layers(cache)):
            keys, values = kv.layer_kv(cache, index)
            length = keys.shape[2]
            buffer = torch.empty(2, keys.shape[1], length + spare, keys.shape[3], dtype=keys.dtype)
            buffer[0, :, :length] = keys[0]
            buffer[1, :, :length] = values[0]
            self.layers.append([buffer, length])

    def append(self, index: int, kv_new: torch.Tensor):
        """kv_new: [2, kv_heads, 1, head_dim]. Returns (keys, values) views [1, kv_heads, length, head_dim]."""
        entry = self.layers[index]
        buffer, length = entry
        if length == buffer.shape[2]:
            grown = torch.empty(2, buffer.shape[1], 2 * length, buffer.shape[3], dtype=buffer.dtype)
            grown[:, :, :length] = buffer
            entry[0] = buffer = grown
        buffer[:, :, length : length + 1] = kv_new
        entry[1] = length + 1
        view = buffer[:, None, :, : length + 1]
        return view[0], view[1]


class LeanStepper(Stepper):
    def __init__(self, loaded, kind="mkldnn", fuse=True, bucket=6):
        super().__init__(loaded, kind=kind, fuse=True, bucket=bucket)
        eps = loaded.model.config.get_text_config().rms_norm_eps
        self.eps = eps
        shift = 1.0 if self.gemma else 0.0

        def norm_weight(module):
            return (module.weight.detach().float() + shift) if module is not None else None

        self.norms = []
        for layer in self.decoder.layers:
            attn = layer.self_attn
            names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
            entry = {name: norm_weight(getattr(layer, name, None)) for name in names}
            entry["q_norm"] = norm_weight(getattr(attn, "q_norm", None))
            entry["k_norm"] = norm_weight(getattr(attn, "k_norm", None))
            self.norms.append(entry)
        self.final_norm = norm_weight(self.decoder.norm)
        self.act = self.decoder.layers[0].mlp.act_fn
        self.sliding = [self.window if t == "sliding_attention" else None for t in self.layer_types]

    def rms(self, x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @torch.no_grad()
    def step(self, states, tokens, buffers):
        count = len(states)
        rows = max(self.bucket, count)
        ids = torch.zeros(rows, dtype=torch.long)
        ids[:count] = torch.tensor(tokens)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        positions[:count, 0] = torch.tensor([s.next_position for s in states])
        x = self.decoder.embed_tokens(ids)  # [rows, hidden]
        tables = {}
        for layer_type in set(self.layer_types):
            cos, sin = (self.decoder.rotary_emb(x, positions, layer_type) if self.gemma else self.decoder.rotary_emb(x, positions))
            half = cos.shape[-1] // 2
            signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
            tables[layer_type] = (cos, signed_sin)  # [rows, 1, D]: broadcast over heads
        Hq, Hk, D = self.num_heads, self.num_kv, self.head_dim
        plans = [AttentionPlan(prefix_positions=s.prefix_positions) for s in states]
        last = [int(p) for p in positions[:count, 0]]
        for index, weights in enumerate(self.layers):
            norms = self.norms[index]
            cos, sin = tables[self.layer_types[index]]
            h = self.rms(x, norms["input_layernorm"])
            qkv = apply_linear(h, weights.qkv, weights.qkv_bias).view(rows, Hq + 2 * Hk, D)
            qk, v = qkv[:, : Hq + Hk], qkv[:, Hq + Hk :]
            if norms["q_norm"] is not None:
                qk = torch.cat([self.rms(qk[:, :Hq], norms["q_norm"]), self.rms(qk[:, Hq:], norms["k_norm"])], dim=1)
            qk = qk * cos + torch.roll(qk, D // 2, dims=-1) * sin
            q, k = qk[:, :Hq], qk[:, Hq:]
            kv_new = torch.stack([k, v])  # [2, rows, Hk, D]
            outs = []
            for b in range(count):
                keys, values = buffers[b].append(index, kv_new[:, b, :, None])
                outs.append(self._attend_one(index, q[b, :, None][None], keys, values, plans[b], last[b]))
            attended = torch.cat(outs + ([x.new_zeros(rows - count, Hq * D)] if rows > count else []))
            o = apply_linear(attended, weights.o)
            if self.gemma:
                x = x + self.rms(o, norms["post_attention_layernorm"])
                h = self.rms(x, norms["pre_feedforward_layernorm"])
                gate, up = weights.gate_up_of(h)
                x = x + self.rms(apply_linear(self.act(gate) * up, weights.down), norms["post_feedforward_layernorm"])
            else:
                x = x + o
                h = self.rms(x, norms["post_attention_layernorm"])
                gate, up = weights.gate_up_of(h)
                x = x + apply_linear(self.act(gate) * up, weights.down)
        x = self.rms(x, self.final_norm)
        for state in states:
            state.next_position += 1
        return x[:count]

    def _attend_one(self, index, q, keys, values, plan, position):
        sliding = self.sliding[index]
        mask = None
        if sliding and not plan.sees_every_key(index, keys.shape[2], position, sliding):
            key_positions = plan.key_positions(index, keys.shape[2], position, q.device)
            mask = positional_mask(torch.tensor([position]), key_positions, sliding)
        gqa = self.num_heads != self.num_kv
        if gqa and mask is not None:
            groups = self.num_heads // self.num_kv
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
            gqa = False
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=gqa)
        return out.reshape(1, -1)


def check_lean(loaded, steps=12):
    """The lean step against the first prototype's step (HF modules for norms) and against today's
    HF forward: hidden states over ``steps`` teacher-forced steps from the same prompt."""
    from kvviz.runtime.decode import prefill
    from kvviz.studies.model_speed import prompt_ids

    base = kv.KVState()
    first, _ = prefill(loaded, base, prompt_ids(loaded, 32))
    token = first.greedy_token()
    lean, proto = LeanStepper(loaded), Stepper(loaded)
    s_lean, s_proto, s_hf = copy_state(base), copy_state(base), copy_state(base)
    buffers = [GrowingKV(s_lean.cache)]
    worst_proto = worst_hf = 0.0
    equal = 0
    for _ in range(steps):
        a = lean.step([s_lean], [token], buffers)[0]
        b = proto.step([s_proto], [token])[0]
        c, _ = prefill(loaded, s_hf, [token])
        equal += torch.equal(a, b)
        worst_proto = max(worst_proto, float((a - b).abs().max()))
        worst_hf = max(worst_hf, float((a - c.hidden[0]).abs().max()))
        token = lean.greedy_tokens(a[None])[0]
    print(f"{loaded.name}: lean == first prototype bitwise in {equal}/{steps} steps (max |diff| {worst_proto:.2e}); "
          f"max |diff| vs today's HF forward {worst_hf:.2e}")


# --- torch.compile of the element-wise pieces --------------------------------------------------------
#
# Only the element-wise work between the matrix products of a Gemma-3 / Llama decode step (norms,
# rotary, activation, residuals) is compiled, for the fixed bucket of rows; the oneDNN products and
# the per-sequence attention stay eager.


def rms(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


class CompiledLean(LeanStepper):
    """LeanStepper with the element-wise pieces of each layer as compiled functions."""

    def __init__(self, loaded, compile_: bool = True, **kw):
        super().__init__(loaded, **kw)
        Hq, Hk, D, eps, gemma, act = self.num_heads, self.num_kv, self.head_dim, self.eps, self.gemma, self.act

        def prepare_qkv(qkv, qn, kn, cos, sin):
            qkv = qkv.view(qkv.shape[0], Hq + 2 * Hk, D)
            qk, v = qkv[:, : Hq + Hk], qkv[:, Hq + Hk :]
            if qn is not None:
                qk = torch.cat([rms(qk[:, :Hq], qn, eps), rms(qk[:, Hq:], kn, eps)], dim=1)
            qk = qk * cos + torch.roll(qk, D // 2, dims=-1) * sin
            return qk[:, :Hq], torch.stack([qk[:, Hq:], v])

        def after_attention(x, o, w_post, w_pre):
            if gemma:
                x = x + rms(o, w_post, eps)
                return x, rms(x, w_pre, eps)
            x = x + o
            return x, rms(x, w_post, eps)

        def activation(gate_up):
            gate, up = gate_up.chunk(2, dim=-1)
            return act(gate) * up

        def after_mlp(x, d, w_post_ff, w_next):
            x = x + (rms(d, w_post_ff, eps) if gemma else d)
            return x, rms(x, w_next, eps)

        wrap = (lambda f: torch.compile(f, dynamic=False, fullgraph=True)) if compile_ else (lambda f: f)
        self.prepare_qkv, self.after_attention = wrap(prepare_qkv), wrap(after_attention)
        self.activation, self.after_mlp = wrap(activation), wrap(after_mlp)

    @torch.no_grad()
    def step(self, states, tokens, buffers):
        from kvviz.runtime.attention import AttentionPlan

        count = len(states)
        rows = max(self.bucket, count)
        ids = torch.zeros(rows, dtype=torch.long)
        ids[:count] = torch.tensor(tokens)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        positions[:count, 0] = torch.tensor([s.next_position for s in states])
        x = self.decoder.embed_tokens(ids)
        tables = {}
        for layer_type in set(self.layer_types):
            cos, sin = (self.decoder.rotary_emb(x, positions, layer_type) if self.gemma else self.decoder.rotary_emb(x, positions))
            half = cos.shape[-1] // 2
            tables[layer_type] = (cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1))
        plans = [AttentionPlan(prefix_positions=s.prefix_positions) for s in states]
        last = [int(p) for p in positions[:count, 0]]
        h = self.rms(x, self.norms[0]["input_layernorm"])
        for index, weights in enumerate(self.layers):
            norms = self.norms[index]
            cos, sin = tables[self.layer_types[index]]
            qkv = apply_linear(h, weights.qkv, weights.qkv_bias)
            q, kv_new = self.prepare_qkv(qkv, norms["q_norm"], norms["k_norm"], cos, sin)
            outs = []
            for b in range(count):
                keys, values = buffers[b].append(index, kv_new[:, b, :, None])
                outs.append(self._attend_one(index, q[b, :, None][None], keys, values, plans[b], last[b]))
            attended = torch.cat(outs + ([x.new_zeros(rows - count, self.num_heads * self.head_dim)] if rows > count else []))
            o = apply_linear(attended, weights.o)
            post = norms["post_attention_layernorm"]
            pre = norms["pre_feedforward_layernorm"] if self.gemma else None
            x, h = self.after_attention(x, o, post, pre)
            d = apply_linear(self.activation(apply_linear(h, weights.gate_up)), weights.down)
            following = self.norms[index + 1]["input_layernorm"] if index + 1 < len(self.layers) else self.final_norm
            x, h = self.after_mlp(x, d, norms["post_feedforward_layernorm"] if self.gemma else None, following)
        for state in states:
            state.next_position += 1
        return h[:count]  # after the final norm


# --- a batched greedy decode loop (the generate() rules, per sequence) ----------------------------


def decode_together(stepper: Stepper, items):
    """items: (state, first token, token limit, stop at newline or None) per sequence. Greedy; stops per sequence at EOS / newline / limit.
    Returns the token ids of each sequence and the seconds of each step."""
    from kvviz.core.prompts import has_chat_template, stop_token_ids

    tokenizer = stepper.loaded.tokenizer
    stop_ids = stop_token_ids(tokenizer)
    default_newline = not has_chat_template(tokenizer)
    outputs = [[] for _ in items]
    limits = [item[2] for item in items]
    newlines = [default_newline if item[3] is None else item[3] for item in items]
    live = [(index, state, token) for index, (state, token, _, _) in enumerate(items)]
    step_seconds = []
    while live:
        still = []
        for index, state, token in live:
            if token in stop_ids:
                continue
            outputs[index].append(token)
            text = tokenizer.decode(outputs[index], skip_special_tokens=True)
            if newlines[index] and "\n" in text.lstrip():
                continue
            if len(outputs[index]) >= limits[index]:
                continue
            still.append((index, state, token))
        live = still
        if not live:
            break
        started = time.perf_counter()
        hidden = stepper.step([s for _, s, _ in live], [t for _, _, t in live])
        tokens = stepper.greedy_tokens(hidden)
        step_seconds.append(time.perf_counter() - started)
        live = [(index, state, new) for (index, state, _), new in zip(live, tokens)]
    return outputs, step_seconds


# --- real decode states from the handoffs ----------------------------------------------------------


def capture_states(pair, request, names):
    """Run each handoff as today and capture, at every call of the decode loop, a copy of the state
    and the first token it decodes from, plus today's tokens. Returns [(label, model, state, first
    token, today's tokens, limit, stop_at_newline)]."""
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs import common
    from kvviz.handoffs.ac import handoff as ac
    from kvviz.handoffs.c2c import handoff as c2c
    from kvviz.handoffs.cipher import handoff as cipher
    from kvviz.handoffs.kvcomm import handoff as kvcomm
    from kvviz.runtime import decode

    captured = []
    original = decode.generate

    def spy(loaded, state, first, settings, on_token=None, max_new_tokens=None, stop_at_newline=None, timer=None):
        saved = kv.KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                           prefix_positions=dict(state.prefix_positions), reference_mask=state.reference_mask)
        first_token = first.greedy_token()
        output = original(loaded, state, first, settings, on_token, max_new_tokens, stop_at_newline, timer)
        captured.append([loaded, saved, first_token, output.token_ids, max_new_tokens or settings.max_new_tokens, stop_at_newline])
        return output

    modules = (common, c2c, kvcomm, ac, cipher)
    for module in modules:
        module.generate = spy
    try:
        rows = []
        for name in names:
            before = len(captured)
            result = run_handoff(name, pair, request)
            for number, entry in enumerate(captured[before:]):
                rows.append((f"{name}#{number}", *entry))
            if result.details.get("traceback"):
                print(result.details["traceback"], file=sys.stderr)
        return rows
    finally:
        for module in modules:
            module.generate = original


def teacher_forced_bits(stepper, group):
    """Feed every sequence of a group today's tokens, batched and alone, and compare the hidden states
    bit for bit: (sequence steps, steps whose hidden state differs in any bit, largest |difference|)."""
    steps = max(len(row[4]) for row in group)
    together = [copy_state(row[2]) for row in group]
    alone = [copy_state(row[2]) for row in group]
    feeds = [[row[3]] + row[4] for row in group]
    count = differ = 0
    largest = 0.0
    for step in range(steps):
        live = [b for b in range(len(group)) if step < len(feeds[b])]
        if not live:
            break
        batched = stepper.step([together[b] for b in live], [feeds[b][step] for b in live])
        for row_index, b in enumerate(live):
            single = stepper.step([alone[b]], [feeds[b][step]])[0]
            count += 1
            if not torch.equal(batched[row_index], single):
                differ += 1
                largest = max(largest, float((batched[row_index] - single).abs().max()))
    return count, differ, largest


def copy_state(state):
    return kv.KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                      prefix_positions=dict(state.prefix_positions), reference_mask=state.reference_mask)


# --- commands -------------------------------------------------------------------------------------


def exact(args):
    """Every handoff's decode on the presets: tokens alone (B=1) vs all of one model's sequences batched,
    vs today's generate(); for the fixed-bucket per-sequence design and the alternatives."""
    from kvviz.app.presets import PRESETS
    from kvviz.engine.runner import load_pair
    from kvviz.handoffs.registry import build_request

    pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
    names = ["receiver", "text", "c2c", "c2c_control", "kvcomm", "skyline", "ac", "cipher", "sharer"]
    variants = {
        "bucket6 per-seq (design)": dict(bucket=6, attention="per_sequence"),
        "unpadded M=B per-seq": dict(bucket=0, attention="per_sequence"),
        "bucket6 padded+mask": dict(bucket=6, attention="padded"),
    }
    steppers = {}
    totals = {v: {"sequences": 0, "differ_alone": 0, "differ_today": 0, "alone_vs_today": 0} for v in variants}
    presets = list(PRESETS) if not args.limit else list(PRESETS)[: args.limit]
    for preset in presets:
        request = build_request(preset.query, preset.context, max_new_tokens=args.tokens)
        rows = capture_states(pair, request, names)
        by_model = {}
        for row in rows:
            by_model.setdefault(row[1].name, []).append(row)
        for model_name, group in by_model.items():
            loaded = group[0][1]
            for variant, options in variants.items():
                key = (model_name, variant)
                if key not in steppers:
                    steppers[key] = Stepper(loaded, **options)
                stepper = steppers[key]
                together, _ = decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6]) for r in group])
                bits = teacher_forced_bits(stepper, group)
                t = totals[variant]
                t["steps"] = t.get("steps", 0) + bits[0]
                t["bit_differences"] = t.get("bit_differences", 0) + bits[1]
                t["max_abs_difference"] = max(t.get("max_abs_difference", 0.0), bits[2])
                for row, tokens in zip(group, together):
                    alone, _ = decode_together(stepper, [(copy_state(row[2]), row[3], row[5], row[6])])
                    limit = row[5]
                    today = row[4]
                    t = totals[variant]
                    t["sequences"] += 1
                    t["differ_alone"] += tokens[:limit] != alone[0][:limit]
                    t["differ_today"] += tokens[:limit] != today
                    t["alone_vs_today"] += alone[0][:limit] != today
                    if tokens[:limit] != alone[0][:limit] or alone[0][:limit] != today:
                        print(f"  {preset.key} {row[0]} {variant}: batched {tokens[:limit][:12]} alone {alone[0][:limit][:12]} today {today[:12]}")
        print(f"{preset.key}: {len(rows)} decodes", {v: dict(t) for v, t in totals.items()}, flush=True)
    print("\n| variant | sequences | tokens: batched != alone | batched != today | alone != today | "
          "hidden states: steps | steps not bitwise equal | largest abs difference |")
    print("|---|---|---|---|---|---|---|---|")
    for variant, t in totals.items():
        print(f"| {variant} | {t['sequences']} | {t['differ_alone']} | {t['differ_today']} | {t['alone_vs_today']} | "
              f"{t['steps']} | {t['bit_differences']} | {t['max_abs_difference']:.2e} |")


def speed(args):
    """ms per batched step for B = 1, 2, 4, 6 on each model, on real-length caches (the locker preset's
    receiver state, repeated), interleaved rounds; beside the fp32 stream time of the decoder stack and
    today's single decode step (kvviz.runtime.decode.prefill of one token + the fast head)."""
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.model_speed import PROMPT_TOKENS, prompt_ids

    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    variants = {
        "today (HF forward, MKL, M=1)": None,
        "lean, mkldnn fp32, bucket 6, per-seq attention": dict(kind="mkldnn", fuse=True, bucket=6),
        "lean v2 (fewer ops, in-place KV), mkldnn fp32, bucket 6": dict(kind="mkldnn", bucket=6, lean=True),
    }
    if args.all:
        variants.update({
            "lean, MKL fp32 (F.linear), not fused, M=B": dict(kind="mkl", fuse=False, bucket=0),
            "lean, MKL fp32 (F.linear), fused, M=B": dict(kind="mkl", fuse=True, bucket=0),
            "lean, mkldnn fp32, fused, M=max(B,2)": dict(kind="mkldnn", fuse=True, bucket=2),
            "lean, mkldnn fp32, not fused": dict(kind="mkldnn", fuse=False, bucket=6),
            "lean, bf16 weights (mkldnn), bucket 6": dict(kind="bf16", fuse=True, bucket=6),
            "lean, int8 weights (_weight_int8pack_mm), M=B": dict(kind="int8", fuse=True, bucket=0),
            "lean v2, bf16 weights (mkldnn), bucket 6": dict(kind="bf16", bucket=6, lean=True),
        })
    sizes = (1, 2, 4, 6)
    for name in args.models.split(","):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        prompt = prompt_ids(loaded, PROMPT_TOKENS)
        base = kv.KVState()
        first, _ = prefill(loaded, base, prompt)
        token = first.greedy_token()
        stack = [p for n, p in loaded.model.model.layers.named_parameters()]
        def make(options):
            if options is None:
                return None
            options = dict(options)
            if options.pop("lean", False):
                return LeanStepper(loaded, **options)
            return Stepper(loaded, **options)

        steppers = {label: make(o) for label, o in variants.items()}
        results = {(label, B, part): [] for label in variants for B in sizes for part in ("stack", "head")}
        stream = []
        for round_ in range(args.rounds + 1):
            started = clock(); [p.sum() for p in stack]; stream.append(clock() - started)
            for label, stepper in steppers.items():
                for B in sizes:
                    if stepper is None and B > 1:
                        continue
                    states = [copy_state(base) for _ in range(B)]
                    buffers = [GrowingKV(state.cache) for state in states]
                    stacks, heads = [], []
                    for _ in range(args.steps):
                        started = clock()
                        if stepper is None:
                            next_token, _ = prefill(loaded, states[0], [token])
                            middle = clock()
                            next_token.greedy_token()
                        else:
                            if isinstance(stepper, LeanStepper):
                                hidden = stepper.step(states, [token] * B, buffers)
                            else:
                                hidden = stepper.step(states, [token] * B)
                            middle = clock()
                            stepper.greedy_tokens(hidden)
                        stopped = clock()
                        stacks.append(middle - started); heads.append(stopped - middle)
                    if round_:
                        results[(label, B, "stack")].append(statistics.median(stacks))
                        results[(label, B, "head")].append(statistics.median(heads))
        s = statistics.median(stream[1:])
        pick = min if args.pick == "min" else statistics.median
        print(f"\n**{name}**, {torch.get_num_threads()} thread(s), clock {args.clock}; decoder stack's fp32 weights streamed once: "
              f"{1000 * s:.1f} ms; per step: stack ms + head ms, {args.pick} over {args.rounds} interleaved rounds of the median of {args.steps} steps")
        print("| variant | " + " | ".join(f"B={B} stack + head" for B in sizes) + " | stack B=1 / stream | step B=6 / B=1 | stack B=6 / B=1 |")
        print("|---|" + "---|" * (len(sizes) + 3))
        for label in variants:
            st = {B: 1000 * pick(results[(label, B, "stack")]) for B in sizes if results[(label, B, "stack")]}
            hd = {B: 1000 * pick(results[(label, B, "head")]) for B in sizes if results[(label, B, "head")]}
            cells = [f"{st[B]:.1f} + {hd[B]:.1f}" if B in st else "" for B in sizes]
            r6 = f"{(st[6] + hd[6]) / (st[1] + hd[1]):.2f}" if 6 in st else ""
            s6 = f"{st[6] / st[1]:.2f}" if 6 in st else ""
            print(f"| {label} | " + " | ".join(cells) + f" | {st[1] / (1000 * s):.2f} | {r6} | {s6} |")


def lean(args):
    """The lean step (``LeanStepper``, was research/lean_step.py) checked against the first
    prototype and the HF forward (``check_lean``), then its stack time against the first
    prototype's at B = 1 and 6 (thread CPU time, min of 4 interleaved rounds), beside the stack's
    weight-stream time."""
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.model_speed import prompt_ids

    for name in args.models.split(","):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        check_lean(loaded)
        base = kv.KVState()
        first, _ = prefill(loaded, base, prompt_ids(loaded, 32))
        token = first.greedy_token()
        steppers = {"first prototype": Stepper(loaded), "lean v2": LeanStepper(loaded)}
        stack = [p for p in loaded.model.model.layers.parameters()]
        results, stream = {}, []
        for round_ in range(5):
            t = time.thread_time(); [p.sum() for p in stack]; stream.append(time.thread_time() - t)
            for label, stepper in steppers.items():
                for B in (1, 6):
                    states = [copy_state(base) for _ in range(B)]
                    buffers = [GrowingKV(s.cache) for s in states]
                    times = []
                    for _ in range(6):
                        t = time.thread_time()
                        if isinstance(stepper, LeanStepper):
                            stepper.step(states, [token] * B, buffers)
                        else:
                            stepper.step(states, [token] * B)
                        times.append(time.thread_time() - t)
                    if round_:
                        results.setdefault((label, B), []).append(statistics.median(times))
        s = 1000 * min(stream[1:])
        print(f"{name}: stack stream {s:.1f} ms; stack ms (min of 4 rounds):",
              {f"{label} B={B}": round(1000 * min(v), 1) for (label, B), v in results.items()},
              {f"{label} B=1 / stream": round(1000 * min(results[(label, 1)]) / s, 2) for label in steppers})


def compiled(args):
    """torch.compile of the element-wise pieces between the products (``CompiledLean``, was
    research/compile_pieces.py): the compile time (first call), whether the compiled step is row
    invariant (a sequence alone vs in a batch of six, bitwise) and its distance to the eager step,
    then ms per step eager vs compiled vs lean v2 (thread CPU time, min of 4 rounds)."""
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.model_speed import prompt_ids

    name = args.model
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    base = kv.KVState()
    first, _ = prefill(loaded, base, prompt_ids(loaded, 32))
    token = first.greedy_token()
    eager = CompiledLean(loaded, compile_=False)
    compiled = CompiledLean(loaded, compile_=True)
    plain = LeanStepper(loaded)
    states = [copy_state(base)]
    started = time.perf_counter()
    compiled.step(states, [token], [GrowingKV(states[0].cache)])
    print(f"{name}: first compiled step (compiles) {time.perf_counter() - started:.1f} s wall")
    # bits: compiled alone vs compiled in a batch of 6 (the sequence at slot 3)
    a_state = copy_state(base); a = compiled.step([a_state], [token], [GrowingKV(a_state.cache)])[0]
    batch = [copy_state(base) for _ in range(6)]
    b = compiled.step(batch, [token, 5, 6, token, 7, 8], [GrowingKV(s.cache) for s in batch])[3]
    e_state = copy_state(base); e = plain.step([e_state], [token], [GrowingKV(e_state.cache)])[0]
    print(f"compiled alone == compiled in a batch (slot 3): {torch.equal(a, b)}; compiled vs eager max |diff| {float((a - e).abs().max()):.2e}")
    results = {}
    for round_ in range(5):
        for label, stepper in (("eager pieces", eager), ("compiled pieces", compiled), ("lean v2", plain)):
            for B in (1, 6):
                states = [copy_state(base) for _ in range(B)]
                buffers = [GrowingKV(s.cache) for s in states]
                times = []
                for _ in range(6):
                    t = time.thread_time(); stepper.step(states, [token] * B, buffers); times.append(time.thread_time() - t)
                if round_:
                    results.setdefault((label, B), []).append(statistics.median(times))
    print({f"{label} B={B}": round(1000 * min(v), 1) for (label, B), v in results.items()})


def fused(args):
    """Kernel time of one decode step's matrix products, fused (QKV, gate-up) vs separate, M rows,
    thread CPU time (min of 9); beside streaming the same fp32 weights once (was
    research/fused_kernels.py)."""
    from kvviz.runtime.models import load_model

    for name in args.models.split(","):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        layers = loaded.model.model.layers
        H = loaded.facts.hidden_size
        res = {}
        for fuse in (False, True):
            lw = [LayerWeights(l, "mkldnn", fuse) for l in layers]
            for M in (1, 6):
                x = torch.randn(M, H); xo = torch.randn(M, layers[0].self_attn.o_proj.in_features); xd = torch.randn(M, layers[0].mlp.down_proj.in_features)
                def run():
                    for w in lw:
                        w.qkv_of(x); apply_linear(xo, w.o); w.gate_up_of(x); apply_linear(xd, w.down)
                run()
                ts = []
                for _ in range(9):
                    t = time.thread_time(); run(); ts.append(time.thread_time() - t)
                res[f"{'fused' if fuse else 'separate'} M={M}"] = round(1000 * min(ts), 1)
        stack = list(layers.parameters())
        ts = []
        for _ in range(9):
            t = time.thread_time(); [p.sum() for p in stack]; ts.append(time.thread_time() - t)
        print(name, "stream", round(1000 * min(ts), 1), res)


def overhead(args):
    """The first prototype's step without its matrix products (every linear replaced by a
    preallocated output): what the per-layer Python, norms, rotary, cache appends and per-sequence
    attention cost, by B (thread CPU time, min of 3 rounds; was research/overhead.py)."""
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.model_speed import prompt_ids

    module = globals()  # LayerWeights and Stepper call this module's pack and apply_linear
    real_pack, real_apply = module["pack"], module["apply_linear"]
    packed_rows, outputs = {}, {}

    def counting_pack(weight, kind):
        packed = real_pack(weight, kind)
        packed_rows[id(packed[1])] = weight.shape[0]
        return packed

    def fake_linear(x, packed, bias=None):
        kind, w = packed
        n = w.shape[0] if kind == "mkl" else packed_rows[id(w)]
        key = (x.shape[:-1], n)
        if key not in outputs:
            outputs[key] = torch.zeros(*x.shape[:-1], n)
        return outputs[key]

    module["pack"] = counting_pack
    try:
        for name in args.models.split(","):
            loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
            base = kv.KVState(); first, _ = prefill(loaded, base, prompt_ids(loaded, 32)); token = first.greedy_token()
            st = Stepper(loaded, kind="mkldnn", fuse=True, bucket=6)
            res = {}
            for rnd in range(4):
                for mode in ("real", "no products"):
                    module["apply_linear"] = real_apply if mode == "real" else fake_linear
                    for B in (1, 6):
                        states = [copy_state(base) for _ in range(B)]
                        times = []
                        for _ in range(6):
                            t = time.thread_time(); st.step(states, [token] * B); times.append(time.thread_time() - t)
                        if rnd: res.setdefault((mode, B), []).append(statistics.median(times))
            module["apply_linear"] = real_apply
            print(name, {f"{m} B={B}": round(1000 * min(v), 1) for (m, B), v in res.items()})
    finally:
        module["pack"], module["apply_linear"] = real_pack, real_apply


def profile(args):
    """torch.profiler's table of B sequences' steps: the first prototype's (``Stepper``; was
    research/profile_lean.py) or, with ``--lean``, the lean step's, with its products' share of the
    step (``LeanStepper``; was research/profile_lean2.py)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.model_speed import prompt_ids

    name, B = args.model, args.batch
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    base = kv.KVState(); first, _ = prefill(loaded, base, prompt_ids(loaded, 32)); token = first.greedy_token()
    states = [copy_state(base) for _ in range(B)]
    if not args.lean:
        st = Stepper(loaded, kind="mkldnn", fuse=True, bucket=6)
        for _ in range(3): st.step(states, [token] * B)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5): st.step(states, [token] * B)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
        return
    st = LeanStepper(loaded)
    bufs = [GrowingKV(s.cache) for s in states]
    for _ in range(3): st.step(states, [token] * B, bufs)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10): st.step(states, [token] * B, bufs)
    ka = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ka)
    lin = sum(e.self_cpu_time_total for e in ka if "linear_pointwise" in e.key)
    print(f"{name} B={B}: per step total self CPU {total/10/1000:.1f} ms, linear {lin/10/1000:.1f} ms, other {(total-lin)/10/1000:.1f} ms, ops per step {sum(e.count for e in ka)/10:.0f}")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=14))


def tiny(args):
    """The prototype step on the tiny test models (tests/tiny_models.py: Llama-like with GQA,
    Gemma-3-like with a sliding window of 8 so decode steps need masks): lean step vs HF forward,
    and batched vs alone bitwise on every handoff's decode state (was research/tiny_check.py)."""
    from kvviz.handoffs.registry import build_request
    from tests.conftest import tiny_pair

    for kind in ("llama", "gemma"):
        pair = tiny_pair(kind)
        check_lean(pair.receiver, steps=20)
        request = build_request("Mira keeps her red bicycle where? Answer briefly.", "Context: Mira keeps her red bicycle in the garden shed behind the old library in Lisbon.", max_new_tokens=20)
        rows = capture_states(pair, request, ["receiver", "text", "kvcomm", "skyline", "ac", "cipher", "sharer"])
        stepper = Stepper(pair.receiver, bucket=6)
        count, differ, largest = teacher_forced_bits(stepper, rows)
        together, _ = decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6]) for r in rows])
        same = sum(t[: r[5]] == decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6])])[0][0][: r[5]] for t, r in zip(together, rows))
        today = sum(t[: r[5]] == r[4] for t, r in zip(together, rows))
        print(f"tiny {kind}: {len(rows)} decodes {[r[0] for r in rows]}; steps {count}, not bitwise equal {differ} (max {largest:.1e}); "
              f"tokens batched == alone {same}/{len(rows)}, == today {today}/{len(rows)}; window {pair.receiver.facts.sliding_window}, "
              f"cache lengths {[r[2].next_position for r in rows]}")


class WithHead:
    """kvviz.runtime.step's DecodeStep plus the per-row exact greedy head (the prototype loop's interface)."""

    def __init__(self, loaded):
        from kvviz.runtime.step import DecodeStep

        self.loaded, self.step_ = loaded, DecodeStep(loaded)
        assert self.step_.supported, self.step_.reason

    def step(self, states, tokens):
        return self.step_.step(states, tokens)

    def greedy_tokens(self, hidden):
        return [self.loaded.head.greedy_token(hidden[b : b + 1]) for b in range(hidden.shape[0])]


def check_decode_step(pair, requests, names):
    """``WithHead`` on every handoff's decode states of ``requests``: teacher-forced bits batched vs
    alone, and its greedy tokens batched vs alone vs today's generate()."""
    total = {"decodes": 0, "steps": 0, "bit_differences": 0, "tokens_differ_alone": 0, "tokens_differ_today": 0}
    steppers = {}
    for request in requests:
        rows = capture_states(pair, request, names)
        by_model = {}
        for row in rows:
            by_model.setdefault(row[1].name, []).append(row)
        for group in by_model.values():
            loaded = group[0][1]
            stepper = steppers.setdefault(loaded.name, WithHead(loaded))
            count, differ, _ = teacher_forced_bits(stepper, group)
            together, _ = decode_together(stepper, [(copy_state(r[2]), r[3], r[5], r[6]) for r in group])
            for tokens, row in zip(together, group):
                alone, _ = decode_together(stepper, [(copy_state(row[2]), row[3], row[5], row[6])])
                total["tokens_differ_alone"] += tokens[: row[5]] != alone[0][: row[5]]
                total["tokens_differ_today"] += tokens[: row[5]] != row[4]
                if tokens[: row[5]] != row[4]:
                    print("  differs from today:", row[0], tokens[: row[5]][:16], row[4][:16])
            total["decodes"] += len(group); total["steps"] += count; total["bit_differences"] += differ
    return total


def step_check(args):
    """kvviz/runtime/step.py's DecodeStep on real decode states of every handoff: batched vs alone
    bitwise (teacher-forced), and its greedy tokens vs today's generate(); tiny test models and
    (with ``--embedded``) the embedded pair on the presets (was research/step_check.py)."""
    from kvviz.handoffs.registry import build_request

    names = ["receiver", "text", "c2c", "c2c_control", "kvcomm", "skyline", "ac", "cipher", "sharer"]
    if args.embedded:
        from kvviz.app.presets import PRESETS
        from kvviz.engine.runner import load_pair

        pair = load_pair("embedded", "cpu", "float32", progress=lambda *a: None)
        print("embedded presets:", check_decode_step(pair, [build_request(p.query, p.context, max_new_tokens=32) for p in PRESETS], names))
        return
    from tests.conftest import tiny_pair

    for kind in ("llama", "gemma"):
        requests = [build_request("Mira keeps her red bicycle where? Answer briefly.",
                                  "Context: Mira keeps her red bicycle in the garden shed behind the old library in Lisbon.", max_new_tokens=24),
                    build_request("What is the secret code word?", "The secret code word is pineapple. " * 3, max_new_tokens=24)]
        print(f"tiny {kind}:", check_decode_step(tiny_pair(kind), requests, names))


COMMANDS = {  # name: (function, help)
    "exact": (exact, "every handoff's decode on the presets: tokens batched vs alone vs today"),
    "speed": (speed, "ms per batched step for B = 1, 2, 4, 6, per variant"),
    "lean": (lean, "the lean step (lean v2) against the first prototype"),
    "compile": (compiled, "torch.compile of the element-wise pieces"),
    "fused": (fused, "a step's products, fused vs separate"),
    "overhead": (overhead, "a step without its products"),
    "profile": (profile, "torch.profiler's table of a step"),
    "tiny": (tiny, "the prototype on the tiny test models"),
    "step-check": (step_check, "kvviz's DecodeStep batched vs alone, bitwise"),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    threads = argparse.ArgumentParser(add_help=False)
    threads.add_argument("--threads", type=int, default=1)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        commands.add_parser(name, parents=[threads], help=help_text)
    commands.choices["exact"].add_argument("--tokens", type=int, default=32)
    commands.choices["exact"].add_argument("--limit", type=int, default=0)
    speed_options = commands.choices["speed"]
    speed_options.add_argument("--rounds", type=int, default=5)
    speed_options.add_argument("--steps", type=int, default=8)
    speed_options.add_argument("--models", default="gemma3-270m,smollm2-135m")
    speed_options.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    speed_options.add_argument("--all", action="store_true")
    speed_options.add_argument("--pick", choices=("min", "median"), default="median")
    commands.choices["lean"].add_argument("models", nargs="?", default="gemma3-270m,smollm2-135m")
    commands.choices["compile"].add_argument("model", nargs="?", default="gemma3-270m")
    commands.choices["fused"].add_argument("models", help="comma-separated model names")
    commands.choices["overhead"].add_argument("models", help="comma-separated model names")
    commands.choices["profile"].add_argument("model")
    commands.choices["profile"].add_argument("batch", type=int)
    commands.choices["profile"].add_argument("--lean", action="store_true", help="profile LeanStepper instead of Stepper")
    commands.choices["step-check"].add_argument("--embedded", action="store_true", help="the embedded pair on the presets")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    COMMANDS[args.command][0](args)


if __name__ == "__main__":
    main()
