"""Phase-A prototype for issue 20: one batched decode step for B sequences, each with its own cache.

Not engine code (research only; the engine is untouched in phase A). Run from the worktree root:

    PYTHONPATH=. python research/speed_prototype.py exact  [--threads 1]   # tokens alone vs batched
    PYTHONPATH=. python research/speed_prototype.py speed  [--threads 1]   # ms per step by B, per variant
    PYTHONPATH=. python research/speed_prototype.py levers [--threads 1]   # int8 / bf16 / fused / HF path

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
  ``--attention padded`` instead left-pads every layer's keys to the longest sequence and runs one
  masked SDPA for the batch (the "pad and mask" design): not bitwise equal to alone.
* Everything else (norms, rotary, activations, residuals) is row-wise.
* The head: one approximate scan for all rows, then each row's candidates rescored exactly
  (kvviz.runtime.head's rule: the exact argmax whenever the winner is among the candidates).
"""

from __future__ import annotations

import argparse
import copy
import math
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
    from kvviz.handoffs import ac, cipher, common
    from kvviz.handoffs.c2c import handoff as c2c
    from kvviz.handoffs.kvcomm import handoff as kvcomm
    from kvviz.runtime import decode

    captured = []
    original = decode.generate

    def spy(loaded, state, first, settings, on_token=None, max_new_tokens=None, stop_at_newline=None):
        saved = kv.KVState(cache=kv.copy_cache(state.cache), next_position=state.next_position,
                           prefix_positions=dict(state.prefix_positions), reference_mask=state.reference_mask)
        first_token = first.greedy_token()
        output = original(loaded, state, first, settings, on_token, max_new_tokens, stop_at_newline)
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
    from kvviz.studies.speed import PROMPT_TOKENS, _prompt_ids

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
        prompt = _prompt_ids(loaded, PROMPT_TOKENS)
        base = kv.KVState()
        first, _ = prefill(loaded, base, prompt)
        token = first.greedy_token()
        stack = [p for n, p in loaded.model.model.layers.named_parameters()]
        from research.lean_step import GrowingKV, LeanStepper

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


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=("exact", "speed"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--pick", choices=("min", "median"), default="median")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    {"exact": exact, "speed": speed}[args.command](args)


if __name__ == "__main__":
    main()
