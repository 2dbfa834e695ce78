"""A leaner batched decode step (phase-A prototype, second version): fewer ops per layer.

Against ``speed_prototype.Stepper`` it changes only how the same arithmetic is issued:

* RMSNorm through ``F.rms_norm`` (one op; bitwise equal to the HF modules' formula here, checked
  in ``check`` below) with Gemma's ``1 + weight`` precomputed;
* queries and keys rotated together (they sit side by side in the fused QKV output);
* each sequence's keys and values appended in place into a buffer with spare room
  (``GrowingKV``) instead of ``torch.cat`` of the whole cache every step;
* one ``torch.cat`` per layer for the sequences' attention outputs.

Run: PYTHONPATH=. python research/lean_step.py [models] (timings: thread CPU time, interleaved).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime import cache as kv
from kvviz.runtime.attention import AttentionPlan, positional_mask
from research.speed_prototype import Stepper, apply_linear, copy_state, pack


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


def check(loaded, steps=12):
    """The lean step against the first prototype's step (HF modules for norms) and against today's
    HF forward: hidden states over ``steps`` teacher-forced steps from the same prompt."""
    from kvviz.runtime.decode import prefill
    from kvviz.studies.speed import _prompt_ids

    base = kv.KVState()
    first, _ = prefill(loaded, base, _prompt_ids(loaded, 32))
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


def main():
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.speed import _prompt_ids

    torch.set_num_threads(1)
    for name in (sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m,smollm2-135m").split(","):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        check(loaded)
        base = kv.KVState()
        first, _ = prefill(loaded, base, _prompt_ids(loaded, 32))
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


if __name__ == "__main__":
    main()
