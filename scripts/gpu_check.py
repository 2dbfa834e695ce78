"""Every handoff on the papers' model architectures, on this machine's device, with no network.

    python scripts/gpu_check.py [--device cuda] [--dtype bfloat16] [--pairs qwen,qwen3-self,gemma3-self]
    python scripts/gpu_check.py --tiny --threads 1      # the same code, tiny sizes, on CPU (a test runs this)

The models are built from the architecture configs below (copied from the hub models' own
config.json: layers, heads, KV heads, head dims, vocabulary, RoPE settings) with **random
weights**: what this measures is speed and memory on the real shapes, and that every handoff runs
on the device; the answers are noise. Tokenizers need no download: Gemma-3-270M's own (from the
embedded package, the same 262,144-word vocabulary), and for the Qwen models SmolLM2's (the
embedded one: the same ChatML chat format, 49,152 words, the embedding padded to Qwen's
151,936 rows as the real models pad theirs). ``--tiny`` shrinks every size and uses the tests'
400-word tokenizer, trained on the spot, so that it runs anywhere in seconds.

Each pair runs every registered handoff once (a table with tokens per second and peak GPU memory
per handoff), then ``bench --perf``'s measurement (``kvviz.studies.perf``: the C2C/text/receiver and
KVComm/Skyline ratios, bytes, peak memory, decode and prefill speed). C2C runs with a random,
untrained fuser (and its control), written under the kvviz cache folder. KVComm needs a sender of
the receiver's architecture: each pair here uses the receiver itself (the ``qwen`` pair's registry
entry names none).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The hub models' config.json, the fields that shape compute and the cache.
ARCHITECTURES = {
    "Qwen/Qwen3-0.6B": {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
    },
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "use_sliding_window": False, "hidden_act": "silu",
    },
    "google/gemma-3-270m": {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "vocab_size": 262144, "max_position_embeddings": 32768, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 3, "rms_norm_eps": 1e-6,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
    },
}
# pair -> (sharer, receiver); KVComm's sender is the receiver (see the module docstring)
PAIRS = {
    "qwen": ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-0.6B"),
    "qwen3-self": ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
    "gemma3-self": ("google/gemma-3-270m", "google/gemma-3-270m"),
}
# which embedded model lends each architecture its tokenizer
TOKENIZER_FROM = {"qwen2": "smollm2-135m", "qwen3": "smollm2-135m", "gemma3_text": "gemma3-270m"}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "query_pre_attn_scalar": 16, "sliding_window": 8}


def config_for(name: str, tiny: bool):
    from transformers import AutoConfig

    fields = dict(ARCHITECTURES[name])
    if tiny:
        fields.update({key: value for key, value in TINY.items() if key in fields or key == "head_dim"})
        fields["num_key_value_heads"] = 1 if fields["model_type"] == "gemma3_text" else 2
        if "layer_types" in fields:
            fields["layer_types"] = ["sliding_attention", "full_attention"] * (TINY["num_hidden_layers"] // 2)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def tokenizer_for(model_type: str, tiny: bool):
    if tiny:  # the tests' 400-word tokenizer, trained on the spot (ChatML for the chat models)
        from tests.tiny_models import tiny_tokenizer

        return tiny_tokenizer(chat=model_type != "gemma3_text")
    from transformers import AutoTokenizer

    from kvviz.runtime.model_files import prepare_embedded

    folder = prepare_embedded(TOKENIZER_FROM[model_type], progress=lambda message: print(message, file=sys.stderr))
    return AutoTokenizer.from_pretrained(folder)


def build_model(name: str, device: str, dtype, tiny: bool, seed: int = 0):
    """A LoadedModel of ``name``'s architecture with random weights, on ``device``."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from kvviz.core.facts import facts_from_config
    from kvviz.runtime import attention
    from kvviz.runtime.models import LoadedModel

    started = time.perf_counter()
    config = config_for(name, tiny)
    tokenizer = tokenizer_for(config.model_type, tiny)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer for {name} has {len(tokenizer)} words, more than the model's {config.vocab_size}")
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    attention.register()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention.ATTENTION_NAME, dtype=dtype)
    if device == "auto":
        from accelerate import dispatch_model, infer_auto_device_map

        model = dispatch_model(model, device_map=infer_auto_device_map(model, no_split_module_classes=model._no_split_modules))
    else:
        model.to(device)
    model.eval().requires_grad_(False)
    label = f"{name} (random{', tiny' if tiny else ''})"
    parameters = sum(p.numel() for p in model.parameters())
    return LoadedModel(name=label, model=model, tokenizer=tokenizer, facts=facts_from_config(label, model.config, tokenizer, parameters),
                       source="built from config, random weights", load_seconds=time.perf_counter() - started,
                       device=next(model.parameters()).device)


def build_pair(pair_name: str, device: str, dtype, tiny: bool):
    from kvviz.runtime.models import LoadedPair, PairSpec

    sharer_name, receiver_name = PAIRS[pair_name]
    receiver = build_model(receiver_name, device, dtype, tiny, seed=1)
    sharer = receiver if sharer_name == receiver_name else build_model(sharer_name, device, dtype, tiny, seed=2)
    spec = PairSpec(name=pair_name, sharer=sharer.name, receiver=receiver.name, same_shape_sender=receiver.name,
                    description=f"{sharer_name} -> {receiver_name}, random weights")
    return LoadedPair(spec=spec, sharer=sharer, receiver=receiver, same_shape_sender=receiver)


def random_fusers(pair) -> Path:
    """An untrained C2C fuser and its control for the pair, under the kvviz cache folder, and an
    untrained KV translator beside them (``translator``); returns the C2C one (its control sits
    beside it, as the C2C handoff's ``fuser`` option expects)."""
    from kvviz.core.paths import cache_dir
    from kvviz.handoffs.c2c.fuser import new_fuser
    from kvviz.handoffs.translate.translator import new_translator

    folder = cache_dir() / "fusers" / "gpu-check" / pair.name.replace("/", "--")
    for kind in ("c2c", "control"):
        new_fuser(pair.sharer.facts, pair.receiver.facts, pair=pair.name, control=kind == "control").save(folder / kind)
    new_translator(pair.sharer.facts, pair.receiver.facts, pair.name, pair.sharer.tokenizer, sharer_layers=[0],
                   rank=8).save(folder / "translator")
    return folder / "c2c"


def every_handoff(pair, fuser: Path, max_new_tokens: int) -> list[dict]:
    """Each registered handoff once on a context question: what it took and what it held."""
    from kvviz.engine.runner import run_handoff
    from kvviz.handoffs import registry

    options = {"text": {"message_tokens": max_new_tokens}, "c2c": {"fuser": str(fuser)},
               "c2c_translate": {"translator": str(fuser.parent / "translator")}}
    request = registry.build_request("What is the code for locker 12?", "The code for locker 12 is 4471.", max_new_tokens,
                                     options=options)
    rows = []
    for handoff in registry.all_handoffs():
        run_handoff(handoff.name, pair, request)  # warm-up (kernels, calibration, fuser load)
        result = run_handoff(handoff.name, pair, request)
        decode = result.timings.get("receiver_decode") or result.timings.get("sharer_decode") or 0.0
        generated = result.tokens.get("generated", 0)
        rows.append({
            "handoff": handoff.name,
            "applicable": result.applicable,
            "reason": result.reason,
            "total_s": result.total_seconds,
            "generated": generated,
            "tokens_per_s": generated / decode if decode else None,
            "peak_gpu_memory_bytes": result.details.get("peak_gpu_memory_bytes", {}),
        })
    return rows


def handoff_table(rows: list[dict]) -> str:
    lines = ["| handoff | total s | generated | tokens/s (decode) | peak GPU MiB |", "|---|---|---|---|---|"]
    for row in rows:
        if not row["applicable"]:
            lines.append(f"| {row['handoff']} | not applicable: {row['reason']} | | | |")
            continue
        peak = ", ".join(f"{device} {value / 2**20:.0f}" for device, value in row["peak_gpu_memory_bytes"].items()) or "n/a (not CUDA)"
        speed = f"{row['tokens_per_s']:.1f}" if row["tokens_per_s"] else "n/a"
        lines.append(f"| {row['handoff']} | {row['total_s']:.3f} | {row['generated']} | {speed} | {peak} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default where available), cuda:N, cpu, or auto (accelerate)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes and a tokenizer trained here (a CPU test)")
    parser.add_argument("--lengths", default=None, help="bench --perf context lengths in tokens (default 128,512,1024,2048; tiny 80)")
    parser.add_argument("--repeats", type=int, default=None, help="bench --perf repeats (default 3; tiny 1)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", metavar="FILE", help="also write every measurement as JSON")
    args = parser.parse_args(argv)

    import torch

    from kvviz.runtime.models import default_device, parse_dtype
    from kvviz.studies import perf

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or default_device()
    dtype = parse_dtype(args.dtype, device)
    lengths = [int(x) for x in (args.lengths or ("80" if args.tiny else "128,512,1024,2048")).split(",")]
    repeats = args.repeats or (1 if args.tiny else 3)
    names = [name.strip() for name in args.pairs.split(",") if name.strip()]
    unknown = [name for name in names if name not in PAIRS]
    if unknown:
        parser.error(f"unknown pair(s) {', '.join(unknown)}; choose from {', '.join(PAIRS)}")

    out: dict = {"device": str(device), "dtype": str(dtype).replace("torch.", ""), "tiny": args.tiny, "pairs": {}}
    print(f"# kvviz GPU check: device {device}, {out['dtype']}{', tiny sizes' if args.tiny else ''}, random weights\n")
    for name in names:
        pair = build_pair(name, device, dtype, args.tiny)
        fuser = random_fusers(pair)
        print(f"## {name}: {PAIRS[name][0]} -> {PAIRS[name][1]}\n")
        models = [pair.sharer] + ([pair.receiver] if pair.receiver is not pair.sharer else [])
        for model in models:
            facts = model.facts
            print(f"- {model.name}: {facts.num_layers} layers, {facts.num_heads} heads, {facts.num_kv_heads} KV heads, "
                  f"head dim {facts.head_dim}, vocabulary {facts.vocab_size:,}, {facts.num_parameters / 1e6:.1f}M parameters, "
                  f"on {sorted({str(d) for d in model.layer_devices})}")
        rows = every_handoff(pair, fuser, args.max_new_tokens)
        print("\n**Every handoff once** (after a warm-up run)\n")
        print(handoff_table(rows))
        report = perf.measure(pair, lengths, repeats, message_tokens=args.max_new_tokens, fuser=str(fuser),
                              progress=lambda message: print(f"  {message}", file=sys.stderr))
        print("\n**bench --perf**\n")
        print(perf.markdown(report))
        out["pairs"][name] = {"handoffs": rows, "perf": report,
                              "models": [dataclasses.asdict(m.facts) for m in models]}
        del pair
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
