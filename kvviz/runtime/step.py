"""The decode step: one new token for each of several sequences through the decoder stack at once.

A decode step reads every weight of the stack for a handful of multiply-adds per weight, so on a
CPU it is bound by memory and per-layer overhead: feeding the next token of six sequences costs
little more than feeding one. ``DecodeStep.step`` does that for sequences that have nothing in
common but the model: each keeps its own cache (KVComm's spliced prefix, C2C's fused cache,
Skyline's long prompt, the receiver alone), its own positions and its own mask.

Every sequence gets exactly the bits it would get alone, by construction:

* **A fixed number of rows.** A matrix kernel's rounding depends on how many rows it is given, but
  not on which row a sequence sits in or on what the other rows hold. The tokens therefore go
  through the stack as one block of ``rows(B)`` rows (padding rows fill the block), where
  ``rows`` maps every batch size to row counts that the kernel treats alike (found once per model
  by ``probe_row_classes``). A sequence alone takes the same path with B = 1.
* **Attention per sequence**, on its own keys, with a mask only where a sliding window needs one
  (``kvviz.runtime.attention``'s rules). No padding ever enters a softmax.
* Everything else (embedding, norms, rotary, activation, residuals) is row by row.

The stack runs from its weights, not through the model's modules (a leaner path: no mask building,
no per-layer keyword plumbing): Q, K and V in one product, gate and up in another, on a CPU
through oneDNN with the weights packed once (faster than MKL's ``F.linear`` for a few rows;
research/kernels_m.py), in the precision of the process's numeric mode (fp32, or bf16 weights:
``kvviz.runtime.numerics``). It covers Gemma 3 and the Llama family (Llama, Mistral, Qwen2, Qwen3);
``DecodeStep.supported`` is False, with a reason, for anything else, for a model spread over
several devices, or when the first-use check against the model's own forward fails, and the
decode loop then runs the model's forward for one sequence at a time. Module hooks do not fire
inside a decode step (kvviz arms hooks only around prompt passes). A sequence whose state asks for
its attention rows (``KVState.token_rows``, ``kvviz.runtime.crossed``) gets them recorded here, per
sequence, beside its attention: no second forward, and no bit of any sequence's output changes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvviz.runtime import cache as kv
from kvviz.runtime import numerics
from kvviz.runtime.attention import AttentionPlan, positional_mask, query_probabilities

MAX_ROWS = 16  # one kernel call takes at most this many sequences; more run as several calls
# The row count at which oneDNN's product of a few rows is fastest on this CPU family, fp32 and bf16
# alike (research/kernels_m.py, research/numerics.py kernels --rows 1,2,3,4,5,6,8: on AVX-512, 6 rows
# cost less than 2 or 3); 1 elsewhere.
FAST_ROWS = {"AVX512": 6}
GEMMA_TYPES = ("gemma3_text",)
LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Relative, on the final hidden state, against the model's own forward, per product precision. With
# bf16 products a last-bit difference between the step's norms and the model's (F.rms_norm against
# transformers' own) can round an input to the neighbouring bfloat16 (2^-8 apart), which the layers
# carry on: Gemma-3-270M's step and forward then differ by 1.4e-2; a wrong weight layout by O(1).
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2}


# --- products ----------------------------------------------------------------------------------


def packed_kind(weight: torch.Tensor) -> torch.dtype | None:
    """The dtype oneDNN multiplies ``weight`` in once packed (fp32, or bf16 in the ``bf16`` numeric
    mode: ``kvviz.runtime.numerics``), or None where the weight stays as it is (not on a CPU, no oneDNN)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype == torch.bfloat16:  # oneDNN packs bf16 only where the CPU multiplies it natively
        return torch.bfloat16 if numerics.native_bf16() else None
    return torch.float32 if weight.dtype == torch.float32 else None


class Product:
    """``x @ weight.T + bias`` for a weight prepared once: packed for oneDNN on a CPU in fp32 or bf16
    (``kind``; bf16 takes fp32 rows and gives fp32 rows, its bias added in fp32), else the weight as it
    is (``F.linear``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kind: torch.dtype | None):
        self.bias = None if bias is None else bias.detach()
        self.out_features = weight.shape[0]
        self.kind = kind
        self.weight = numerics.pack(weight) if kind is not None else weight.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.kind == torch.bfloat16:
            out = numerics.packed_product(x, self.weight, torch.bfloat16)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)


def _joined(modules, kind: torch.dtype | None):
    """One product for several linears that read the same input (Q, K and V; gate and up): their
    weights packed as one matrix for oneDNN; on the model's own weights (no copy to gain from) the
    products one after another."""
    if kind is None:
        return _Separate([Product(m.weight, m.bias, None) for m in modules])
    biases = [m.bias for m in modules]
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else torch.zeros(m.out_features, dtype=torch.float32) for b, m in zip(biases, modules)]
    )
    return Product(torch.cat([m.weight.detach() for m in modules]), bias, kind)


class _Separate:
    def __init__(self, products: list[Product]):
        self.products = products
        self.out_features = sum(p.out_features for p in products)

    def __call__(self, x):
        return torch.cat([p(x) for p in self.products], dim=-1)


class LayerWeights:
    def __init__(self, layer, kind: torch.dtype | None, shift: float):
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _joined([attn.q_proj, attn.k_proj, attn.v_proj], kind)
        self.o = Product(attn.o_proj.weight, attn.o_proj.bias, kind)
        self.gate_up = _joined([mlp.gate_proj, mlp.up_proj], kind)
        self.down = Product(mlp.down_proj.weight, mlp.down_proj.bias, kind)
        self.intermediate = mlp.gate_proj.out_features

        def norm(module):
            return None if module is None else (module.weight.detach().float() + shift).to(module.weight.dtype)

        self.input_norm = norm(layer.input_layernorm)
        self.post_attention_norm = norm(layer.post_attention_layernorm)
        self.pre_mlp_norm = norm(getattr(layer, "pre_feedforward_layernorm", None))
        self.post_mlp_norm = norm(getattr(layer, "post_feedforward_layernorm", None))
        self.q_norm = norm(getattr(attn, "q_norm", None))
        self.k_norm = norm(getattr(attn, "k_norm", None))


# --- row counts ----------------------------------------------------------------------------------


def probe_row_classes(products: list, widths: list[int], dtype, device, max_rows: int = MAX_ROWS) -> list[list[int]]:
    """Group the row counts 1..max_rows by the bits a row gets: counts in one group give every row
    identical results (the same random row, last in blocks of random rows, through each of
    ``products``, whose input widths are ``widths``)."""
    generator = torch.Generator().manual_seed(0)
    signatures = {}
    for rows in range(1, max_rows + 1):
        outputs = []
        for product, width in zip(products, widths):
            block = torch.randn(rows, width, generator=generator)
            block[-1] = torch.randn(width, generator=torch.Generator().manual_seed(1))
            outputs.append(product(block.to(device=device, dtype=dtype))[-1])
        signatures[rows] = outputs
    classes: list[list[int]] = []
    for rows in range(1, max_rows + 1):
        for group in classes:
            if all(torch.equal(a, b) for a, b in zip(signatures[group[0]], signatures[rows])):
                group.append(rows)
                break
        else:
            classes.append([rows])
    return classes


def row_floor(classes: list[list[int]], max_rows: int = MAX_ROWS, fast: int = 1) -> int | None:
    """The smallest row count from which every count up to ``max_rows`` is in one class, raised to
    ``fast`` when that is in the same class; None when no such count exists (then every call is padded
    to ``max_rows``)."""
    for group in classes:
        if max_rows in group:
            floor = max_rows
            while floor - 1 in group:
                floor -= 1
            return max(floor, min(fast, max_rows))
    return None


# --- the step ----------------------------------------------------------------------------------


class DecodeStep:
    """Batched decode steps for one model (built once per model, by ``kvviz.runtime.decode``)."""

    def __init__(self, loaded):
        self.loaded = loaded
        self.reason = unsupported_reason(loaded)
        self.supported = self.reason is None
        if not self.supported:
            return
        decoder = loaded.model.model
        config = loaded.model.config.get_text_config()
        facts = loaded.facts
        self.decoder = decoder
        self.gemma = config.model_type in GEMMA_TYPES
        self.eps = config.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = facts.num_heads, facts.num_kv_heads, facts.head_dim
        self.layer_types = list(facts.layer_types)
        self.windows = [facts.sliding_window if t == "sliding_attention" else None for t in self.layer_types]
        self.scaling = config.query_pre_attn_scalar**-0.5 if self.gemma else self.head_dim**-0.5
        self.activation = decoder.layers[0].mlp.act_fn
        first_weight = decoder.layers[0].mlp.down_proj.weight
        kind = packed_kind(first_weight)
        self.products = (f"oneDNN, packed {'bf16' if kind == torch.bfloat16 else 'fp32'} weights" if kind is not None
                         else "F.linear on the model's weights")
        shift = 1.0 if self.gemma else 0.0  # Gemma's norms scale by (1 + weight)
        self.layers = [LayerWeights(layer, kind, shift) for layer in decoder.layers]
        final = decoder.norm.weight.detach()
        self.final_norm = (final.float() + shift).to(final.dtype)
        first = self.layers[0]
        widths = [facts.hidden_size, decoder.layers[0].self_attn.o_proj.in_features, facts.hidden_size,
                  decoder.layers[0].mlp.down_proj.in_features]
        self.row_classes = probe_row_classes([first.qkv, first.o, first.gate_up, first.down], widths,
                                             loaded.dtype, first_weight.device)
        fast = FAST_ROWS.get(torch.backends.cpu.get_cpu_capability(), 1) if first_weight.device.type == "cpu" else 1
        self.floor = row_floor(self.row_classes, MAX_ROWS, fast)
        problem = self._check()
        if problem:
            self.supported, self.reason = False, problem

    def rows(self, count: int) -> int:
        """Rows of the block that carries ``count`` (<= MAX_ROWS) sequences."""
        return MAX_ROWS if self.floor is None else max(count, self.floor)

    @torch.no_grad()
    def step(self, states: list[kv.KVState], tokens: list[int]) -> torch.Tensor:
        """Feed ``tokens[i]`` into ``states[i]`` (in place); the final hidden state of each [B, hidden]."""
        if len(states) != len(tokens) or not states:
            raise ValueError("one token per state, at least one")
        outputs = [self._block(states[start : start + MAX_ROWS], tokens[start : start + MAX_ROWS])
                   for start in range(0, len(states), MAX_ROWS)]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _block(self, states, tokens):
        count, rows = len(states), self.rows(len(states))
        device = self.loaded.device
        ids = torch.zeros(rows, dtype=torch.long, device=device)
        ids[:count] = torch.tensor(tokens, device=device)
        positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        positions[:count, 0] = torch.tensor([s.next_position for s in states], device=device)
        x = self.decoder.embed_tokens(ids)  # [rows, hidden]
        tables = {layer_type: self._rotary(x, positions, layer_type) for layer_type in set(self.layer_types)}
        plans = [AttentionPlan(prefix_positions=s.prefix_positions, prefix_bias=s.prefix_bias) for s in states]
        query_positions = [s.next_position for s in states]
        for state in states:
            kv.place(state.cache, self.loaded.layer_devices)
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        padding = x.new_zeros(rows - count, heads * head_dim) if rows > count else None
        for index, w in enumerate(self.layers):
            cos, sin = tables[self.layer_types[index]]
            h = self._norm(x, w.input_norm)
            qkv = w.qkv(h).view(rows, heads + 2 * kv_heads, head_dim)
            qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
            if w.q_norm is not None:
                qk = torch.cat([self._norm(qk[:, :heads], w.q_norm), self._norm(qk[:, heads:], w.k_norm)], dim=1)
            qk = qk * cos + torch.roll(qk, head_dim // 2, dims=-1) * sin  # rotary (sin carries the sign)
            q, k = qk[:, :heads], qk[:, heads:]
            attended = [self._attend(index, q[b], k[b], v[b], states[b], plans[b], query_positions[b]) for b in range(count)]
            if padding is not None:
                attended.append(padding)
            o = w.o(torch.cat(attended))
            if self.gemma:
                x = x + self._norm(o, w.post_attention_norm)
                gate, up = w.gate_up(self._norm(x, w.pre_mlp_norm)).split(w.intermediate, dim=-1)
                x = x + self._norm(w.down(self.activation(gate) * up), w.post_mlp_norm)
            else:
                x = x + o
                gate, up = w.gate_up(self._norm(x, w.post_attention_norm)).split(w.intermediate, dim=-1)
                x = x + w.down(self.activation(gate) * up)
        for state in states:
            state.next_position += 1
            if state.token_rows is not None:
                state.token_rows.commit()
        return self._norm(x, self.final_norm)[:count]

    def _norm(self, x, weight):
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def _rotary(self, x, positions, layer_type):
        rotary = self.decoder.rotary_emb
        cos, sin = rotary(x, positions, layer_type) if self.gemma else rotary(x, positions)
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2]: one op fewer per layer
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)

    def _attend(self, layer, q, k, v, state, plan, position):
        """One sequence's attention at ``layer``: append its new key and value, attend to its own keys.
        q [heads, head_dim]; k, v [kv_heads, head_dim]. Returns [1, heads * head_dim]."""
        keys, values = kv.append_token(state.cache, layer, k[None, :, None], v[None, :, None])
        # a prefix's per-key score bias (a KV translator's token weights and gates), 0 on the own keys
        bias = plan.key_bias(layer, keys.shape[2], keys.device, q.dtype)
        window = self.windows[layer]
        if state.token_rows is not None and not state.token_rows.full:
            self._record(layer, q, keys, state, plan, position, window)
        mask = None
        if window and not plan.sees_every_key(layer, keys.shape[2], position, window):
            # the oldest keys have left this layer's window: attend to the keys inside it, which
            # are the last ones when the cache holds its keys in the order of their positions
            # (always, for kvviz's caches); else mask by positions
            key_positions = plan.key_positions(layer, keys.shape[2], position, keys.device)
            visible = positional_mask(torch.tensor([position], device=keys.device), key_positions, window)[0, 0, 0]
            if not bool(visible.any()):
                raise ValueError(f"no key of layer {layer} is inside its sliding window at position {position}")
            first = int(visible.to(torch.int8).argmax())
            if bool(visible[first:].all()):
                keys, values = keys[:, :, first:], values[:, :, first:]
                bias = None if bias is None else bias[first:]
            else:
                mask = visible[None, None, None]
        if bias is not None:  # an additive float mask: the bias where a key is visible
            bias = bias[None, None, None]
            mask = bias if mask is None else torch.where(mask, bias, torch.finfo(q.dtype).min)
        grouped = self.num_heads != self.num_kv_heads
        if grouped and mask is not None:
            groups = self.num_heads // self.num_kv_heads
            keys, values, grouped = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1), False
        out = F.scaled_dot_product_attention(q[None, :, None], keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=grouped)
        return out.reshape(1, -1)

    def _record(self, layer, q, keys, state, plan, position, window) -> None:
        """The sequence asked for its attention rows (``KVState.token_rows``): this token's
        probabilities over every key of the layer, by position, computed beside the attention
        (which stays the fused kernel's, so recording changes no bit of the output)."""
        key_positions = plan.key_positions(layer, keys.shape[2], position, keys.device)
        visible = None  # a decode token sees every key of its cache, but where a window hides the oldest
        if window and not plan.sees_every_key(layer, keys.shape[2], position, window):
            visible = positional_mask(torch.tensor([position], device=keys.device), key_positions, window)[0, 0, 0]
        probabilities = query_probabilities(q, keys[0], self.scaling, visible)
        state.token_rows.record(layer, probabilities, key_positions)

    def _check(self) -> str | None:
        """The step against the model's own forward on a short prompt: None when they agree."""
        model, device = self.loaded.model, self.loaded.device
        vocabulary = model.config.get_text_config().vocab_size
        prompt = torch.arange(3, 3 + 12, device=device)[None] % vocabulary
        follow = int((prompt[0, -1] + 1) % vocabulary)
        with torch.no_grad():
            cache = kv.new_cache()
            model.model(input_ids=prompt, cache=cache, use_cache=True)
            state = kv.KVState(cache=kv.copy_cache(cache), next_position=prompt.shape[1])
            ours = self.step([state], [follow])[0].float()
            theirs = model.model(input_ids=torch.tensor([[follow]], device=device), cache=cache, use_cache=True,
                                 position_ids=torch.tensor([[prompt.shape[1]]], device=device)).last_hidden_state[0, -1].float()
        difference = float((ours - theirs).norm() / theirs.norm().clamp(min=1e-12))
        if not difference <= CHECK_TOLERANCE.get(self.layers[0].down.kind, CHECK_TOLERANCE[torch.float32]):
            return f"the batched decode step differs from the model's own forward (relative {difference:.1e})"
        return None


def unsupported_reason(loaded) -> str | None:
    """Why the batched step cannot run this model (None when it can)."""
    config = loaded.model.config.get_text_config()
    if config.model_type not in GEMMA_TYPES + LLAMA_TYPES:
        return f"no batched decode step for the {config.model_type} architecture"
    if len({str(d) for d in loaded.layer_devices}) > 1:
        return "the model is spread over several devices"
    if any(p.device.type == "meta" for p in loaded.model.parameters()):
        return "some weights are offloaded"
    if getattr(config, "attn_logit_softcapping", None):
        return "attention logit soft-capping is not in the batched step"
    layers = getattr(loaded.model.model, "layers", None)
    if not layers or getattr(layers[0].mlp, "gate_proj", None) is None or getattr(layers[0].self_attn, "q_proj", None) is None:
        return "the decoder layers are not laid out as Llama's or Gemma's"
    return None


