"""Running the benchmark: handoff variants x samples, one row each, resumable and splittable.

Variants: every handoff named in ``--handoffs`` is one variant, except a handoff with swept options
(its descriptor's options with a ``sweep_flag``), which becomes one variant per combination of the
listed values: KVComm's ``--ratios 0.3,0.5 --strategies kvcomm,random`` gives ``kvcomm@0.3``,
``kvcomm@0.5``, ``kvcomm-random@0.3`` ... Other option flags (``--fuser``, ``--alpha`` ...) apply
to every row of their handoff.

Several processes each take samples ``rank::world`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment) and write their own part file; the process that finishes last (all ``.done`` markers
present) writes the merged summary.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvviz.bench.rows import RowWriter, done_pairs, drop_variants, part_path, row_files
from kvviz.bench.scoring import likelihood_columns, result_row
from kvviz.bench.summary import summary_markdown, write_summary
from kvviz.data import choice_query
from kvviz.handoffs import registry
from kvviz.handoffs.registry import build_request
from kvviz.results import HandoffRequest

# The settings a resumed run must share with the run it continues.
RESUME_KEYS = (
    "pair", "dataset", "dataset_options", "seed", "max_new_tokens", "message_tokens", "shuffle", "options",
    "kvcomm_calibration_sample",
)


@dataclass(frozen=True)
class Variant:
    label: str  # the row name: "text", "kvcomm@0.3", "kvcomm-random@0.5"
    handoff: str  # the registry name
    options: dict = field(default_factory=dict)  # the swept option values of this variant


def expand_variants(handoffs: list[str], sweeps: dict[str, dict] | None = None) -> list[Variant]:
    """One variant per handoff, or per combination of its swept options' values.

    ``sweeps`` maps handoff -> {option: "comma,list" or a list}; a swept option not given takes its
    ``sweep_default``. The first swept option varies fastest.
    """
    sweeps = sweeps or {}
    variants: list[Variant] = []
    for name in handoffs:
        handoff = registry.get(name)
        swept = handoff.swept_options()
        if not swept:
            variants.append(Variant(name, name))
            continue
        lists = []
        for option in swept:
            given = sweeps.get(name, {}).get(option.name, option.sweep_default)
            values = option.parse_list(given) if isinstance(given, str) else [option.parse(value) for value in given]
            if not values:
                raise ValueError(f"{option.sweep_flag} lists no value for {name}.")
            lists.append(values)
        for combination in itertools.product(*reversed(lists)):
            values = dict(zip(reversed([option.name for option in swept]), combination))
            values = {option.name: values[option.name] for option in swept}
            variants.append(Variant(handoff.label_variant(values), name, values))
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"A handoff or a swept value is listed twice: {labels}")
    return variants


def variant_request(record, variant: Variant, args, options: dict[str, dict],
                    calibration_record=None) -> HandoffRequest:
    """The request of one sample and variant: greedy, the run's settings, the variant's values;
    KVComm calibrated on ``calibration_record`` when one is given (the task's first sample)."""
    given = {name: dict(values) for name, values in options.items()}
    given.setdefault(variant.handoff, {}).update(variant.options)
    request = build_request(choice_query(record), record.context, args.max_new_tokens, False, 0.7, args.seed,
                            args.message_tokens, given)
    if variant.handoff == "kvcomm" and calibration_record is not None:
        sample = (calibration_record.context, choice_query(calibration_record))
        request = replace(request, kvcomm=replace(request.kvcomm, calibration="sample", calibration_sample=sample))
    return request


def calibrates_on_task(handoffs: list[str], options: dict[str, dict]) -> bool:
    """KVComm in the run and no --calibration given: calibrate on the task's first sample, as the
    reference code does, and leave that sample out of the score."""
    return "kvcomm" in handoffs and "calibration" not in options.get("kvcomm", {})


def calibration_note(record) -> str:
    return (f"KVComm calibrated on the task's first sample, {record.id} (left out of the score): "
            f"{choice_query(record).strip()!r}")


def check_config(out: Path, config: dict) -> None:
    """A resumed run must use the settings of the run it continues; the first run records them."""
    path = out / "config.json"
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
        changed = [key for key in RESUME_KEYS if old.get(key) != config.get(key)]
        if changed:
            details = ", ".join(f"{key}: {old.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise ValueError(f"{out} holds a run with other settings ({details}). Use another --out, or --fresh to start over.")
        # the same run, extended: remember every variant (in order); the limit is the latest one
        merged = dict(config)
        merged["variants"] = list(dict.fromkeys(list(config.get("variants", [])) + list(old.get("variants", []))))
        config = merged
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(config, indent=2), encoding="utf-8")
    os.replace(temporary, path)


def distributed_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from the environment that accelerate launch / torchrun set."""
    rank = int(os.environ.get("RANK", os.environ.get("ACCELERATE_PROCESS_INDEX", "0")) or 0)
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("ACCELERATE_NUM_PROCESSES", "1")) or 1)
    local = int(os.environ.get("LOCAL_RANK", str(rank)) or 0)
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is outside WORLD_SIZE {world}")
    return rank, world, local


def parse_names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_dataset_options(items: list[str] | None) -> dict:
    options = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--dataset-option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        lowered = value.strip().lower()
        options[key.strip()] = {"true": True, "false": False}.get(lowered, value.strip())
    return options


def load_records(args):
    from kvviz.data import load_dataset_with_report

    options = parse_dataset_options(args.dataset_option)
    records, report = load_dataset_with_report(args.dataset, limit=args.limit, seed=args.seed if args.shuffle else None, **options)
    if report.problems:
        print(report.summary(), file=sys.stderr)
    return records


def split_option_arguments(args, handoffs: list[str]) -> tuple[dict, dict]:
    """(swept lists, single values) from the option flags, for the chosen handoffs."""
    from kvviz.flags import option_arguments

    given = option_arguments(args)
    sweeps, single = {}, {}
    for name in handoffs:
        swept = {option.name for option in registry.get(name).swept_options()}
        for option, value in given.get(name, {}).items():
            (sweeps if option in swept else single).setdefault(name, {})[option] = value
    return sweeps, single


def run_bench(args) -> int:
    from kvviz import engine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world, local = distributed_rank()
    if args.fresh and rank == 0:
        for path in row_files(out) + list(out.glob(".done-*")) + [out / "config.json"]:
            path.unlink(missing_ok=True)
    handoffs = registry.parse_handoffs(args.handoffs)
    sweeps, options = split_option_arguments(args, handoffs)
    variants = expand_variants(handoffs, sweeps)
    config = {
        "pair": args.pair,
        "dataset": args.dataset,
        "dataset_options": parse_dataset_options(args.dataset_option),
        "seed": args.seed,
        "shuffle": args.shuffle,
        "max_new_tokens": args.max_new_tokens,
        "message_tokens": args.message_tokens,
        "limit": args.limit,
        "variants": [v.label for v in variants],
    }
    if options:
        config["options"] = options
    calibration_record = None
    if calibrates_on_task(handoffs, options):
        # the first sample calibrates KVComm and is not scored: one more is loaded so that --limit are scored
        more = None if args.limit is None else args.limit + 1
        records = list(enumerate(load_records(argparse.Namespace(**{**vars(args), "limit": more}))))
        calibration_record = records.pop(0)[1] if records else None
        config["kvcomm_calibration_sample"] = calibration_record.id if calibration_record else None
    else:
        records = list(enumerate(load_records(args)))
    if rank == 0 or world == 1 or (out / "config.json").exists():
        # the other ranks check against what rank 0 wrote (or will write: same command line)
        check_config(out, config)
    marker = out / f".done-{rank}-of-{world}"
    marker.unlink(missing_ok=True)
    if args.redo and rank == 0:
        dropped = drop_variants(out, set(parse_names(args.redo)))
        print(f"--redo: removed {dropped} row(s) of {args.redo} to run them again", file=sys.stderr)

    mine = [(index, record) for index, record in records if index % world == rank]
    done = done_pairs(out)
    todo = [(index, record, variant) for index, record in mine for variant in variants if (record.id, variant.label) not in done]
    skipped = len(mine) * len(variants) - len(todo)
    if skipped:
        print(f"resuming: {skipped} sample/handoff pair(s) already in {out}", file=sys.stderr)

    pair = None
    if todo:
        device = args.device
        if device is None and world > 1:
            import torch

            device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
        pair = engine.load_pair(args.pair, device, args.dtype, progress=lambda message: print(message, file=sys.stderr))

    from tqdm.auto import tqdm

    writer = RowWriter(part_path(out, rank, world))
    try:
        bar = tqdm(todo, desc=f"bench {args.dataset}" + (f" [{rank}/{world}]" if world > 1 else ""),
                   position=rank if world > 1 else 0, disable=args.quiet)
        for index, record, variant in bar:
            bar.set_postfix_str(variant.label, refresh=False)
            request = variant_request(record, variant, args, options, calibration_record)
            result = engine.run_handoff(variant.handoff, pair, request)
            row = result_row(record, index, variant, result, args, rank, world)
            if result.applicable and record.choices is not None and not args.no_likelihood:
                row.update(likelihood_columns(pair, record, variant.handoff, request, result))
            elif record.choices is not None and args.no_likelihood:
                row["likelihood_note"] = "not computed: --no-likelihood"
            writer.write(row)
    finally:
        writer.close()
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"), encoding="utf-8")
    finished = all((out / f".done-{r}-of-{world}").exists() for r in range(world))
    if finished:
        title = f"{args.dataset} on pair {args.pair}"
        if calibration_record is not None:
            title += f"\n\n{calibration_note(calibration_record)}"
        summary = write_summary(out, [v.label for v in variants], title=title)
        if not args.quiet:
            print(summary_markdown(summary, title))
        print(f"wrote {out}/summary.csv, summary.md, figures.html and {part_path(out, rank, world).name}", file=sys.stderr)
    else:
        print(f"rank {rank}: rows written to {part_path(out, rank, world)}; the last process to finish writes the summary",
              file=sys.stderr)
    return 0
