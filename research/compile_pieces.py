"""torch.compile lever, phase-A prototype: compile only the element-wise work between the matrix
products of a Gemma-3 / Llama decode step (norms, rotary, activation, residuals), for the fixed
bucket of rows, and keep the oneDNN products and the per-sequence attention eager.

    PYTHONPATH=. python research/compile_pieces.py [model]

Prints the compile time (first calls), ms per step eager vs compiled (thread CPU time, min of
rounds) and whether the compiled step is row-invariant (a sequence alone vs in a batch, bitwise).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kvviz.runtime import cache as kv
from research.lean_step import GrowingKV, LeanStepper
from research.speed_prototype import apply_linear, copy_state


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


def main():
    from kvviz.runtime.decode import prefill
    from kvviz.runtime.models import load_model
    from kvviz.studies.speed import _prompt_ids

    torch.set_num_threads(1)
    name = sys.argv[1] if len(sys.argv) > 1 else "gemma3-270m"
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    base = kv.KVState()
    first, _ = prefill(loaded, base, _prompt_ids(loaded, 32))
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


if __name__ == "__main__":
    main()
