"""Aligned sharer / receiver KV of the translator corpus: ridge sums (stage 1) or raw samples.

    # ridge sums over the corpus's fit texts, resumable, saved every few minutes
    python research/translator_extract.py stats --corpus DATA/corpus/corpus.jsonl \\
        --out DATA/stats-n1 --neighbours 1 --tokens 1000000
    # raw features and targets of a few texts (pilot comparisons, held-out R^2)
    python research/translator_extract.py raw --corpus ... --split check --out DATA/raw/check.safetensors
    python research/translator_extract.py raw --heldout-entities --out DATA/raw/unseen.safetensors

Both models read ``Context: <text>\\n\\n`` exactly as the translation handoff lays it out
(``kvviz.handoffs.translate.translator.align_context``); the receiver reads it here in training only. Features are
the sharer's position-free keys and values at the aligned token (``kvviz.handoffs.translate.translator.features``),
targets the receiver's position-free keys and values at every layer.

Raw samples hold a superset of features: the aligned token at every sharer layer, then the token
before it at the default layers, then the three alignment numbers (``RAW_LAYOUT`` in the file's
metadata says where each sits), float16.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvviz.data import recall, whereabouts  # noqa: E402
from kvviz.handoffs.translate import align as tr_align
from kvviz.handoffs.translate import ridge as tr_ridge
from kvviz.handoffs.translate import translator as tr  # noqa: E402

MAX_RECEIVER_TOKENS = 256
BATCH_TOKENS = 1024


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)


def corpus_texts(path: str, split: str) -> list[str]:
    rows = [json.loads(line) for line in open(path)]
    return [row["text"] for row in rows if row["split"] == split]


def heldout_entity_texts() -> list[str]:
    """Contexts whose names and values training never saw: recall's held-out split, the
    evaluators' 100 Countries records and who-is-where notes of the held-out landmarks and cities."""
    from kvviz.studies.c2c.translator_sets import countries_split

    texts = [r.context for r in recall.generate("heldout", 400, seed=7)]
    _, countries = countries_split()
    knowledge = [r.context for r in whereabouts.generate("heldout", 200, seed=7, cities=0.3)]
    return texts + [r.context for r in countries] + knowledge


def batches(pair, texts: list[str]):
    """Yield lists of (text, alignment), similar lengths together, about BATCH_TOKENS per batch."""
    aligned = []
    for text in texts:
        alignment = tr_align.align_context(pair.receiver.tokenizer, pair.sharer.tokenizer, text)
        if len(alignment.receiver_ids) > MAX_RECEIVER_TOKENS or alignment.translated_count == 0:
            continue
        aligned.append((text, alignment))
    window = 64
    for start in range(0, len(aligned), window):
        group = sorted(aligned[start : start + window], key=lambda item: len(item[1].sharer_ids))
        batch = []
        for item in group:
            longest = max([len(a.sharer_ids) for _, a in batch] + [len(item[1].sharer_ids), len(item[1].receiver_ids)])
            if batch and longest * (len(batch) + 1) > BATCH_TOKENS:
                yield batch
                batch = []
            batch.append(item)
        if batch:
            yield batch


def batch_kv(pair, batch):
    sharer_kv = tr_align.read_kv(pair.sharer, [a.sharer_ids for _, a in batch])
    receiver_kv = tr_align.read_kv(pair.receiver, [a.receiver_ids for _, a in batch])
    return sharer_kv, receiver_kv


def run_stats(args, pair) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layers = [int(x) for x in args.layers.split(",")]
    width = tr_align.feature_width(tr.model_fingerprint(pair.sharer.facts), layers, args.neighbours)
    out_width = pair.receiver.facts.num_layers * 2 * pair.receiver.facts.num_kv_heads * pair.receiver.facts.head_dim
    stats_path, progress_path = out / "stats.safetensors", out / "progress.json"
    texts = corpus_texts(args.corpus, "fit")[args.skip :]  # --skip: texts already in a raw sample
    texts = texts[args.shard :: args.shards]
    done = 0
    stats = tr_ridge.RidgeStats(width, out_width)
    if stats_path.is_file() and progress_path.is_file():
        stats = tr_ridge.RidgeStats.load(stats_path)
        done = json.loads(progress_path.read_text())["texts"]
        log(f"resumed: {done} texts, {stats.n} tokens")
    meta = {"layers": layers, "neighbours": args.neighbours, "corpus": args.corpus, "shard": args.shard, "shards": args.shards,
            "skip": args.skip}
    started, last_save = time.perf_counter(), time.perf_counter()
    start_tokens = stats.n
    position = done
    chunk = 128
    while position < len(texts) and stats.n < args.tokens:
        group = texts[position : position + chunk]
        xs, ys = [], []
        for batch in batches(pair, group):
            sharer_kv, receiver_kv = batch_kv(pair, batch)
            for row, (_, alignment) in enumerate(batch):
                xs.append(tr_align.features(sharer_kv, alignment, layers, args.neighbours, row))
                ys.append(tr_align.targets(receiver_kv, alignment, row))
        if xs:
            stats.add(torch.cat(xs), torch.cat(ys))
        position += len(group)
        rate = (stats.n - start_tokens) / max(time.perf_counter() - started, 1e-9)
        log(f"{position}/{len(texts)} texts, {stats.n} tokens, {rate:.1f} tokens/s")
        if time.perf_counter() - last_save > args.save_minutes * 60 or position >= len(texts) or stats.n >= args.tokens:
            stats.save(stats_path, meta)
            progress_path.write_text(json.dumps({"texts": position, "tokens": stats.n, **meta}, indent=2))
            last_save = time.perf_counter()
            log(f"saved {stats_path}")


def raw_features(sharer_kv, alignment, row: int, sharer_layers: int) -> torch.Tensor:
    aligned = tr_align.features(sharer_kv, alignment, list(range(sharer_layers)), 0, row)[:, : -tr_align.ALIGNMENT_FEATURES]
    before = tr_align.features(sharer_kv, alignment, list(tr.DEFAULT_SHARER_LAYERS), 1, row)
    per = before.shape[1] - tr_align.ALIGNMENT_FEATURES
    return torch.cat([aligned, before[:, per // 2 :]], dim=1)  # the token before, then the alignment numbers


def run_raw(args, pair) -> None:
    from safetensors.torch import save_file

    texts = heldout_entity_texts() if args.heldout_entities else corpus_texts(args.corpus, args.split)
    texts = texts[: args.limit] if args.limit else texts
    xs, ys, ids = [], [], []
    for index, batch in enumerate(batches(pair, texts)):
        sharer_kv, receiver_kv = batch_kv(pair, batch)
        for row, (_, alignment) in enumerate(batch):
            xs.append(raw_features(sharer_kv, alignment, row, pair.sharer.facts.num_layers).half())
            ys.append(tr_align.targets(receiver_kv, alignment, row).half())
            ids.append(len(ids))
        if index % 20 == 0:
            log(f"batch {index}: {sum(x.shape[0] for x in xs)} tokens")
    x, y = torch.cat(xs), torch.cat(ys)
    text_index = torch.cat([torch.full((t.shape[0],), i) for i, t in enumerate(xs)])
    layout = {"aligned_layers": pair.sharer.facts.num_layers, "before_layers": list(tr.DEFAULT_SHARER_LAYERS),
              "per_layer": 2 * pair.sharer.facts.num_kv_heads * pair.sharer.facts.head_dim, "alignment": tr_align.ALIGNMENT_FEATURES}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_file({"x": x.contiguous(), "y": y.contiguous(), "text": text_index}, args.out, metadata={"RAW_LAYOUT": json.dumps(layout)})
    log(f"wrote {args.out}: {x.shape[0]} tokens, {x.shape[1]} features, {y.shape[1]} targets")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("stats", "raw"))
    parser.add_argument("--corpus", default="runs/translator/corpus/corpus.jsonl")
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", default=",".join(map(str, tr.DEFAULT_SHARER_LAYERS)))
    parser.add_argument("--neighbours", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=1_000_000, help="stats: stop after this many aligned tokens")
    parser.add_argument("--shard", type=int, default=0, help="stats: this process takes texts shard, shard + shards, ...")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--skip", type=int, default=0, help="stats: leave out the first N fit texts (e.g. the raw pilot's)")
    parser.add_argument("--save-minutes", type=float, default=10)
    parser.add_argument("--split", default="check", help="raw: corpus split to read")
    parser.add_argument("--heldout-entities", action="store_true", help="raw: recall held-out and Countries held-out contexts")
    parser.add_argument("--limit", type=int, default=0, help="raw: first N texts")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from kvviz.engine.runner import load_pair

    pair = load_pair("embedded", "cpu", None, progress=lambda message: None)
    run_stats(args, pair) if args.mode == "stats" else run_raw(args, pair)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
