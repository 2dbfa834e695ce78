"""Where is the knowledge? ``python -m kvviz probe-kv --models smollm2-135m@handbook,smollm2-135m``.

C2C hands the receiver the sharer's KV cache at the prompt's tokens. A sharer that knows a fact
helps only if its cache there holds it. This probe asks, per layer, whether the answer can be read
from a model's KV at three places of its prompt about a handbook question
(``kvviz.data.handbook``):

* ``entity``: the last token of the entity's name ("... Orlesk");
* ``question end``: the question's last token ("?");
* ``prompt end``: the last prompt token, where the model is about to answer (C2C fuses it only with
  ``--fuse-template``, paired with the receiver's template tail).

For each (layer, place, keys or values) a multinomial logistic regression per relation (12
values) is fitted on the fuser-train entities in the train phrasings and scored on the held-out
entities in the unseen phrasings: the generalisation a fuser needs (it never sees a held-out
entity). Keys are read with their rotation undone (``kvviz.runtime.rope``), so the place's position
in the prompt does not matter. Chance is 1/12. A model's own values are its adapter's: a permuted
sharer (its card says ``permuted``) is scored on the permuted values.

Controls: the base model without the adapter (it never learned the facts: chance), and the
receiver (it never did either).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kvviz.core.prompts import user_message
from kvviz.data import handbook, wilson_interval
from kvviz.engine import flags
from kvviz.handoffs.c2c.align import message_span
from kvviz.runtime import adapters
from kvviz.runtime import cache as kv
from kvviz.runtime.decode import prefill
from kvviz.runtime.models import load_model
from kvviz.runtime.rope import rotary_tables, undo_rotation

PLACES = ("entity", "question end", "prompt end")


def configure_parser(parser) -> None:
    parser.add_argument("--models", default="smollm2-135m@handbook,smollm2-135m@handbook-permuted,smollm2-135m,gemma3-270m",
                        help="comma-separated model names (BASE@ADAPTER for a taught sharer)")
    parser.add_argument("--train-per-entity", type=int, default=3, help="train phrasings per fuser-train entity (0: all five)")
    parser.add_argument("--test-per-entity", type=int, default=1, help="unseen phrasings per held-out entity (0: all three)")
    parser.add_argument("--steps", type=int, default=300, help="optimisation steps of each probe")
    parser.add_argument("--l2", type=float, default=1e-3, help="weight decay of each probe")
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)


def place_indices(tokenizer, record) -> dict[str, int]:
    """Token index of each place in the model's prompt for ``record`` (``PLACES``)."""
    span = message_span(tokenizer, record.question)
    query_at = user_message(record.question)[1].index(record.question)  # offsets count from the message's start

    def token_holding(char: int) -> int:
        for k, (begin, end) in enumerate(span.offsets):
            if begin <= char < end:
                return span.start + k
        raise ValueError(f"no token holds character {char} of {record.question!r}")

    entity_end = query_at + record.question.index(record.meta["entity"]) + len(record.meta["entity"]) - 1
    return {"entity": token_holding(entity_end), "question end": token_holding(query_at + len(record.question) - 1),
            "prompt end": len(span.input_ids) - 1}


def features(loaded, records) -> dict[tuple[int, str, str], torch.Tensor]:
    """(layer, place, "K" or "V") -> [records, KV width]: the model's KV at each place, keys
    un-rotated at their position."""
    rows: dict[tuple[int, str, str], list[torch.Tensor]] = {}
    layer_types = list(loaded.facts.layer_types)
    for record in records:
        ids = message_span(loaded.tokenizer, record.question).input_ids
        where = place_indices(loaded.tokenizer, record)
        state = kv.KVState()
        prefill(loaded, state, ids, need_logits=False)
        positions = [where[p] for p in PLACES]
        tables = {t: rotary_tables(loaded, positions, t) for t in set(layer_types)}
        for layer in range(kv.num_layers(state.cache)):
            keys, values = kv.layer_kv(state.cache, layer)
            picked_k = keys[0][:, positions].float()  # [H, places, D]
            cos, sin = tables[layer_types[layer]]
            picked_k = undo_rotation(picked_k[None], cos, sin)[0]
            picked_v = values[0][:, positions].float()
            for k, place in enumerate(PLACES):
                rows.setdefault((layer, place, "K"), []).append(picked_k[:, k].reshape(-1).cpu())
                rows.setdefault((layer, place, "V"), []).append(picked_v[:, k].reshape(-1).cpu())
    return {key: torch.stack(value) for key, value in rows.items()}


def fit_probe(train_x, train_y, test_x, classes: int, steps: int, l2: float) -> torch.Tensor:
    """A multinomial logistic regression on standardised features; its predictions on ``test_x``."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)
    x, t = (train_x - mean) / std, (test_x - mean) / std
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(x.shape[1], classes, generator=generator) * 0.01).requires_grad_()
    bias = torch.zeros(classes, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.05, weight_decay=l2)
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(x @ weight + bias, train_y).backward()
        optimizer.step()
    with torch.no_grad():
        return (t @ weight + bias).argmax(-1)


def permuted_model(name: str) -> bool:
    """Whether the model's adapter learned the permuted values (its card says so)."""
    base, adapter = adapters.split_name(name)
    return bool(adapter and adapters.read_card(adapters.adapter_folder(base, adapter)).get("permuted"))


def probe_model(name: str, train, test, steps: int, l2: float, device: str, log) -> dict:
    """Held-out probe accuracy per (layer, place, K / V), over the three relations together."""
    loaded = load_model(name, device)
    permuted = permuted_model(name)
    answer = (lambda r: r.meta["permuted"]) if permuted else (lambda r: r.meta["value"])  # noqa: E731
    log(f"{name}: reading {len(train) + len(test)} prompts ...")
    train_x, test_x = features(loaded, train), features(loaded, test)
    cells = {}
    for key in sorted(train_x):
        right = 0
        for relation in handbook.RELATIONS:
            labels = {value: i for i, value in enumerate(relation.values)}
            fit = [i for i, r in enumerate(train) if r.meta["relation"] == relation.name]
            score = [i for i, r in enumerate(test) if r.meta["relation"] == relation.name]
            predicted = fit_probe(train_x[key][fit], torch.tensor([labels[answer(train[i])] for i in fit]),
                                  test_x[key][score], len(relation.values), steps, l2)
            right += sum(int(p) == labels[answer(test[i])] for p, i in zip(predicted.tolist(), score))
        layer, place, part = key
        low, high = wilson_interval(right, len(test))
        cells[f"{layer}|{place}|{part}"] = {"layer": layer, "place": place, "part": part, "right": right, "n": len(test),
                                            "accuracy": right / len(test), "ci95": [low, high]}
    return {"model": name, "permuted": permuted, "layers": loaded.facts.num_layers, "cells": cells}


def best_cells(report: dict) -> dict[str, dict]:
    """Per place, the layer and part (K or V) whose probe read the most held-out answers."""
    best = {}
    for cell in report["cells"].values():
        if cell["place"] not in best or cell["accuracy"] > best[cell["place"]]["accuracy"]:
            best[cell["place"]] = cell
    return best


def format_reports(reports: list[dict], chance: float) -> str:
    lines = [f"Held-out probe accuracy (chance {chance:.3f}); per place, the best layer and part, then every layer (K / V):", ""]
    for report in reports:
        lines.append(f"{report['model']}" + (" (its permuted values)" if report["permuted"] else ""))
        for place, cell in best_cells(report).items():
            lines.append(f"  best at {place:<12}: layer {cell['layer']:>2} {cell['part']}  {cell['right']}/{cell['n']} = "
                         f"{cell['accuracy']:.3f} [{cell['ci95'][0]:.3f}, {cell['ci95'][1]:.3f}]")
        for place in PLACES:
            row = [f"{report['cells'][f'{layer}|{place}|K']['accuracy']:.2f}/{report['cells'][f'{layer}|{place}|V']['accuracy']:.2f}"
                   for layer in range(report["layers"])]
            lines.append(f"  {place:<12} " + " ".join(row))
        lines.append("")
    return "\n".join(lines)


def main(args) -> int:
    flags.apply_threads(args)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    train = handbook.questions("train", "train", per_entity=args.train_per_entity)
    test = handbook.questions("heldout", "unseen", per_entity=args.test_per_entity)
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    reports = [probe_model(name, train, test, args.steps, args.l2, args.device, log) for name in names]
    chance = 1 / len(handbook.RELATIONS[0].values)
    result = {"train": len(train), "test": len(test), "chance": chance, "places": list(PLACES), "reports": reports,
              "command": "python -m kvviz " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["probe-kv"] else None}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else format_reports(reports, chance))
    return 0
