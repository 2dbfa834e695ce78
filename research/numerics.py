"""Which numerics for the decoder stack and the output head on this CPU (issue 42): every candidate
kernel's products, its weight-stream time and its row invariance, measured side by side in one run.

    PYTHONPATH=. nice -n 10 python research/numerics.py kernels [--models gemma3-270m,smollm2-135m] [--rounds 7] [--rows 1,6,16,64,128]
    PYTHONPATH=. nice -n 10 python research/numerics.py head [--rounds 7] [--rows 1,6]
    PYTHONPATH=. python research/numerics.py classes [--threads 1,2]
    PYTHONPATH=. nice -n 10 python research/numerics.py prompts [--rounds 7]
    PYTHONPATH=. nice -n 10 python research/numerics.py compiled [--models gemma3-270m] [--layers 3] [--rows 6]

``kernels``: per model, one pass over every decoder-stack matrix for M rows (M = 1, 6, 16 for decode
steps, 64 and 128 for prompt passes), per kernel, in thread CPU ms (the time the process held a core:
another process on the machine does not count, its memory traffic does), median of interleaved rounds;
beside it, in the same rounds, the time to stream the stack's weights once at each precision (a sum of
each matrix's bytes read as fp32 words: the memory a decode step must read). Kernels:

* ``fp32 MKL``: ``F.linear`` on the fp32 weights (the transformers forward: every prompt pass today);
* ``fp32 oneDNN``: the weights packed once for oneDNN (kvviz's decode step today);
* ``bf16 oneDNN``: the weights rounded to bfloat16 and packed for oneDNN, activations rounded to
  bfloat16 at each product's input (AVX-512-BF16 dot products; fp32 accumulation);
* ``int8 weight-only``: per-output-channel int8 weights (``_weight_int8pack_mm``, bf16 activations);
* ``int8 dynamic``: int8 weights and per-row int8 activations through ``torch._int_mm`` (exact integer
  accumulation, so batch invariant by construction), scales applied after.

``head``: the output head's scan (approximate logits over the vocabulary) for 1 and 6 rows per kernel
(int4 weight-only, today's few-row scan; bf16 oneDNN, today's many-row scan; int8 weight-only; the fp32
product), beside the stream time of the head's weights at each precision.

``prompts``: would batching the prompt passes of a run's handoffs (or of several runs) pay? The locker
run's receiver prompts (Gemma-3-270M: the receiver alone, Skyline, the text handoff's receiver, C2C's
prefix) each through the model's own forward, one after another, against one forward of all their
tokens as one sequence (an upper bound on what batching them could gain: the same rows through every
product in one call, one set of per-layer overheads; attention aside), per numeric mode (both loaded
here: model-level work only), thread CPU ms, median of interleaved rounds.

``compiled``: does PyTorch's own compiler write a faster product for this CPU than the kernels above?
``torch.compile`` with max-autotune and frozen weights, so that Inductor may choose its C++ GEMM
templates (micro-kernels for AVX2 and AVX-512: fp32, bf16 activations with bf16 weights, and int8
weight-only with a small-M kernel) or ATen's, by its own benchmark. One compiled product per matrix of
the first ``--layers`` decoder layers (enough matrices that they do not stay in the CPU's caches),
against MKL's and oneDNN's products of the same matrices, thread CPU ms, median of interleaved rounds.
Needs a C++ compiler; compiling takes minutes.

``classes``: for each kernel and each of the embedded models' matrix shapes, the row counts M in 1..32
and 48..512 whose rows get identical bits (a row's result must not depend on how many rows the kernel
gets, else a sequence's tokens depend on its batch: docs/SPEED.md 1a), at each torch thread count.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kvviz.runtime.models import load_model

DECODE_ROWS = (1, 6, 16)
PROMPT_ROWS = (64, 128)
CLASS_ROWS = list(range(1, 33)) + [48, 64, 100, 128, 200, 256, 512]


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 weights and their fp32 scales."""
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    return torch.round(weight / scale[:, None]).to(torch.int8), scale


def kernels_for(weights: list[torch.Tensor]) -> dict:
    """name -> (prepare(weight) -> prepared, product(x fp32, prepared) -> y, bytes per weight)."""

    def onednn(weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def int8_dynamic(x, prepared):
        quantised, scale = prepared
        x_scale = (x.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        x_int = torch.round(x / x_scale).to(torch.int8)
        return torch._int_mm(x_int, quantised).float() * x_scale * scale

    return {
        "fp32 MKL": (lambda w: w, lambda x, w: F.linear(x, w), 4),
        "fp32 oneDNN": (onednn, lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), 4),
        "bf16 oneDNN": (lambda w: onednn(w.bfloat16()),
                        lambda x, w: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), w, None, "none", [], "").float(), 2),
        "int8 weight-only": (lambda w: (lambda q, s: (q, s.bfloat16()))(*int8_rows(w)),
                             lambda x, p: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), p[0], p[1]).float(), 1),
        "int8 dynamic": (lambda w: (lambda q, s: (q.t().contiguous(), s))(*int8_rows(w)), int8_dynamic, 1),
    }


def stream(weight: torch.Tensor) -> torch.Tensor:
    """Read every byte of ``weight`` once: a sum of its bytes seen as fp32 words, the same work per
    byte at every precision (a sum in the weight's own dtype is compute-bound for int8)."""
    return weight.reshape(-1).view(torch.float32).sum()


def thread_ms(function) -> float:
    started = time.thread_time()
    function()
    return 1000 * (time.thread_time() - started)


def stack_matrices(name: str, layers: int | None = None) -> list[torch.Tensor]:
    """The fp32 weight of every linear layer in the model's decoder stack (its first ``layers`` layers)."""
    loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
    return [m.weight.detach() for layer in loaded.model.model.layers[:layers] for m in layer.modules()
            if isinstance(m, torch.nn.Linear)]


def kernels(models: list[str], rounds: int, rows: tuple[int, ...] = DECODE_ROWS + PROMPT_ROWS) -> None:
    torch.set_num_threads(1)
    for name in models:
        weights = stack_matrices(name)
        inputs = {m: [torch.randn(m, w.shape[1]) for w in weights] for m in rows}
        prepared = {}
        for kernel, (prepare, _, _) in kernels_for(weights).items():
            try:
                prepared[kernel] = [prepare(w) for w in weights]
            except RuntimeError as error:  # this CPU or build has no such kernel
                print(f"{name}: {kernel} unavailable ({str(error)[:80]})")
        copies = {"fp32": weights, "bf16": [w.bfloat16() for w in weights], "int8": [int8_rows(w)[0] for w in weights]}
        products = {k: v for k, v in kernels_for(weights).items() if k in prepared}
        times = {(k, m): [] for k in products for m in rows}
        streams = {p: [] for p in copies}
        for kernel, (_, product, _) in products.items():  # warm up
            for m in rows:
                [product(x, w) for x, w in zip(inputs[m], prepared[kernel])]
        for _ in range(rounds):
            for precision, matrices in copies.items():
                streams[precision].append(thread_ms(lambda: [stream(w) for w in matrices]))
            for kernel, (_, product, _) in products.items():
                for m in rows:
                    times[(kernel, m)].append(thread_ms(lambda: [product(x, w) for x, w in zip(inputs[m], prepared[kernel])]))
        mb = {p: sum(w.numel() * w.element_size() for w in matrices) / 1e6 for p, matrices in copies.items()}
        stream_ms = {p: statistics.median(v) for p, v in streams.items()}
        print(f"\n{name}: stack weights fp32 {mb['fp32']:.0f} MB; stream once (thread ms, median of {rounds}): "
              + ", ".join(f"{p} {stream_ms[p]:.1f} ({mb[p]:.0f} MB)" for p in copies))
        print("| kernel | " + " | ".join(f"M={m}" for m in rows)
              + f" | M={rows[0]} / its stream | M={rows[1]} / its stream | M={rows[-1]} per row |")
        print("|---|" + "---|" * (len(rows) + 3))
        for kernel, (_, _, width) in products.items():
            own = stream_ms[{4: "fp32", 2: "bf16", 1: "int8"}[width]]
            med = {m: statistics.median(times[(kernel, m)]) for m in rows}
            print(f"| {kernel} | " + " | ".join(f"{med[m]:.1f}" for m in rows)
                  + f" | {med[rows[0]] / own:.2f} | {med[rows[1]] / own:.2f} | {med[rows[-1]] / rows[-1]:.2f} |")


def head(rounds: int, rows: tuple[int, ...] = (1, 6)) -> None:
    from kvviz.runtime.head import GROUP_SIZE

    torch.set_num_threads(1)
    for name in ("gemma3-270m", "smollm2-135m"):
        loaded = load_model(name, "cpu", "float32", progress=lambda *a: None)
        weight = loaded.head.linear.weight.detach()
        index = loaded.head.scan_index()
        q8, s8 = int8_rows(weight)
        scans = {"fp32 MKL (exact)": lambda x: F.linear(x, weight),
                 "int8 weight-only": lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q8, s8.bfloat16()),
                 "int8 weight-only, fp32 rows": lambda x: torch.ops.aten._weight_int8pack_mm(x, q8, s8)}
        try:
            bf16 = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None)
            scans["bf16 oneDNN"] = lambda x: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), bf16, None, "none", [], "")
        except RuntimeError as error:  # this CPU has no bfloat16 product (AVX2)
            print(f"{name}: bf16 oneDNN unavailable ({str(error)[:80]})")
        if index is not None:
            scans["int4 weight-only (today, <= 4 rows)"] = (
                lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), index[0], GROUP_SIZE, index[1]))
        copies = {"fp32": weight, "bf16": weight.bfloat16(), "int8": q8}
        inputs = {m: torch.randn(m, weight.shape[1]) for m in rows}
        times = {(k, m): [] for k in scans for m in inputs}
        streams = {p: [] for p in copies}
        for scan in scans.values():
            for x in inputs.values():
                scan(x)
        for _ in range(rounds):
            for p, w in copies.items():
                streams[p].append(thread_ms(lambda: stream(w)))
            for k, scan in scans.items():
                for m, x in inputs.items():
                    times[(k, m)].append(thread_ms(lambda: scan(x)))
        print(f"\n{name} head {list(weight.shape)}: stream once " + ", ".join(f"{p} {statistics.median(v):.1f} ms" for p, v in streams.items()))
        for k in scans:
            print(f"| {k} | " + " | ".join(f"M={m} {statistics.median(times[(k, m)]):.1f}" for m in rows) + " |")


def prompts(rounds: int) -> None:
    from kvviz.core.prompts import build_segments
    from kvviz.studies.run_speed import FULL_RUN_CONTEXT, FULL_RUN_QUERY

    torch.set_num_threads(1)
    for mode in ("fp32", "bf16"):
        loaded = load_model("gemma3-270m", "cpu", "float32", progress=lambda *a: None, numeric_mode=mode)
        tokenizer = loaded.tokenizer
        prompts = [build_segments(tokenizer, FULL_RUN_QUERY).input_ids,  # the receiver alone
                   build_segments(tokenizer, FULL_RUN_QUERY, FULL_RUN_CONTEXT).input_ids,  # Skyline
                   build_segments(tokenizer, FULL_RUN_QUERY, "Locker 12's code is 4471.").input_ids,  # text's receiver
                   build_segments(tokenizer, FULL_RUN_QUERY, FULL_RUN_CONTEXT).context_ids]  # KVComm's sender
        joined = [token for prompt in prompts for token in prompt]

        def forward(ids):
            with torch.no_grad():
                loaded.model.model(input_ids=torch.tensor([ids]))

        for ids in prompts + [joined]:
            forward(ids)
        apart, together = [], []
        for _ in range(rounds):
            apart.append(thread_ms(lambda: [forward(ids) for ids in prompts]))
            together.append(thread_ms(lambda: forward(joined)))
        print(f"{mode}: {len(prompts)} prompts of {[len(p) for p in prompts]} tokens: one after another "
              f"{statistics.median(apart):.1f} ms, as one sequence of {len(joined)} tokens {statistics.median(together):.1f} ms "
              f"({statistics.median(together) / statistics.median(apart):.2f}x)")


class _Product(torch.nn.Module):
    """One matrix's product for ``torch.compile``: fp32, bf16 (activations and weights) or int8
    weight-only (per-channel int8 weights, bf16 activations: the pattern Inductor lowers to its
    weight-only-int8 GEMM)."""

    def __init__(self, weight: torch.Tensor, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "int8":
            quantised, scale = int8_rows(weight)
            self.register_buffer("weight", quantised)
            self.register_buffer("scale", scale.bfloat16())
        else:
            self.register_buffer("weight", weight.bfloat16() if kind == "bf16" else weight.clone())

    def forward(self, x):
        if self.kind == "fp32":
            return F.linear(x, self.weight)
        if self.kind == "bf16":
            return F.linear(x.bfloat16(), self.weight).float()
        return (F.linear(x.bfloat16(), self.weight.to(torch.bfloat16)) * self.scale).float()


def compiled(models: list[str], rounds: int, layers: int, rows: tuple[int, ...]) -> None:
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    # one compiled graph per matrix, all from the same forward: past dynamo's default of 8
    # recompilations the rest would silently run eager
    dynamo.recompile_limit = dynamo.accumulated_recompile_limit = 10_000
    inductor.max_autotune = True
    inductor.max_autotune_gemm_backends = "CPP,ATEN"
    inductor.freezing = True
    torch.set_num_threads(1)
    for name in models:
        weights = stack_matrices(name, layers)
        inputs = {m: [torch.randn(m, w.shape[1]) for w in weights] for m in rows}
        products = {k: v for k, v in kernels_for(weights).items() if k in ("fp32 MKL", "fp32 oneDNN")}
        runs = {}
        for kernel, (prepare, product, _) in products.items():
            prepared = [prepare(w) for w in weights]
            runs[kernel] = lambda m, product=product, prepared=prepared: [product(x, w) for x, w in zip(inputs[m], prepared)]
        for kind in ("fp32", "bf16", "int8"):
            started = time.perf_counter()
            try:
                with torch.no_grad():
                    modules = [torch.compile(_Product(w, kind).eval(), dynamic=False) for w in weights]
                    for m in rows:
                        [module(x) for module, x in zip(modules, inputs[m])]
            except Exception as error:  # no compiler, or no kernel Inductor can write here
                print(f"{name}: compiled {kind} unavailable ({str(error)[:120]})")
                continue
            print(f"{name}: compiled {kind}: {time.perf_counter() - started:.0f} s to compile", flush=True)
            runs[f"compiled {kind}"] = lambda m, modules=modules: [module(x) for module, x in zip(modules, inputs[m])]
        copies = {"fp32": weights, "bf16": [w.bfloat16() for w in weights], "int8": [int8_rows(w)[0] for w in weights]}
        times = {(k, m): [] for k in runs for m in rows}
        streams = {p: [] for p in copies}
        with torch.no_grad():
            for _ in range(rounds):
                for precision, matrices in copies.items():
                    streams[precision].append(thread_ms(lambda: [stream(w) for w in matrices]))
                for kernel, run in runs.items():
                    for m in rows:
                        times[(kernel, m)].append(thread_ms(lambda: run(m)))
        mb = sum(w.numel() * 4 for w in weights) / 1e6
        print(f"\n{name}, the {len(weights)} matrices of the first {layers} layers ({mb:.0f} MB in fp32); stream once "
              f"(thread ms, median of {rounds}): " + ", ".join(f"{p} {statistics.median(v):.1f}" for p, v in streams.items()))
        print("| kernel | " + " | ".join(f"M={m}" for m in rows) + " |")
        print("|---|" + "---|" * len(rows))
        for kernel in runs:
            print(f"| {kernel} | " + " | ".join(f"{statistics.median(times[(kernel, m)]):.2f}" for m in rows) + " |")


def classes(thread_counts: list[int]) -> None:
    shapes = {"gemma3-270m": [(1536, 640), (640, 1024), (4096, 640), (640, 2048)],
              "smollm2-135m": [(960, 576), (576, 576), (3072, 576), (576, 1536)]}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for model, model_shapes in shapes.items():
            for out_features, in_features in model_shapes:
                weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(2))
                line = []
                for kernel, (prepare, product, _) in kernels_for([weight]).items():
                    try:
                        prepared = prepare(weight)
                    except RuntimeError:
                        continue
                    signatures = {}
                    generator = torch.Generator().manual_seed(0)
                    last = torch.randn(in_features, generator=torch.Generator().manual_seed(1))
                    for m in CLASS_ROWS:
                        block = torch.randn(m, in_features, generator=generator)
                        block[-1] = last
                        signatures[m] = product(block, prepared)[-1]
                    groups: list[list[int]] = []
                    for m in CLASS_ROWS:
                        for group in groups:
                            if torch.equal(signatures[group[0]], signatures[m]):
                                group.append(m)
                                break
                        else:
                            groups.append([m])
                    line.append(f"{kernel}: " + " ".join(f"{{{g[0]}..{g[-1]}}}" if len(g) > 1 else f"{{{g[0]}}}" for g in groups))
                print(f"threads {threads} {model} [{out_features} x {in_features}]: " + "; ".join(line))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["kernels", "head", "classes", "prompts", "compiled"])
    parser.add_argument("--layers", type=int, default=3, help="compiled: how many decoder layers' matrices")
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rows", default=None,
                        help="kernels: the row counts M (at least two; default "
                             f"{','.join(map(str, DECODE_ROWS + PROMPT_ROWS))}); head: the row counts (default 1,6)")
    args = parser.parse_args()
    if args.what == "kernels":
        kernels(args.models.split(","), args.rounds,
                tuple(int(m) for m in args.rows.split(",")) if args.rows else DECODE_ROWS + PROMPT_ROWS)
    elif args.what == "head":
        head(args.rounds, tuple(int(m) for m in args.rows.split(",")) if args.rows else (1, 6))
    elif args.what == "prompts":
        prompts(args.rounds)
    elif args.what == "compiled":
        compiled(args.models.split(","), args.rounds, args.layers,
                 tuple(int(m) for m in args.rows.split(",")) if args.rows else (6,))
    else:
        classes([int(t) for t in args.threads.split(",")])


if __name__ == "__main__":
    main()
