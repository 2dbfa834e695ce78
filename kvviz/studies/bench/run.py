"""Running the benchmark: handoff variants x samples, one row each, resumable and splittable.

Variants: every handoff named in ``--handoffs`` is one variant, except a handoff with swept options
(its descriptor's options with a ``sweep_flag``), which becomes one variant per combination of the
listed values: KVComm's ``--ratios 0.3,0.5 --strategies kvcomm,random`` gives ``kvcomm@0.3``,
``kvcomm@0.5``, ``kvcomm-random@0.3`` ... Other option flags (``--fuser``, ``--alpha`` ...) apply
to every row of their handoff.

Every (sample, variant) pair goes through the one evaluation loop (``kvviz.engine.evaluation``); a
handoff that calibrates on the task (its descriptor's ``task_calibration``: KVComm) gets the task's
first sample, which is then left out of the score.

Several processes each take samples ``rank::world`` (RANK / WORLD_SIZE / LOCAL_RANK from the
environment) and write their own part file; the process that finishes last (all ``.done`` markers
present) writes the merged summary.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from kvviz.core.results import HandoffRequest
from kvviz.data import choice_query, load_dataset_with_report
from kvviz.data.contradictions import contradictions_for
from kvviz.data.swaps import swaps_for
from kvviz.engine import contradiction, runner
from kvviz.engine.evaluation import Variant, evaluate, pending
from kvviz.engine.flags import option_arguments
from kvviz.handoffs import registry
from kvviz.handoffs.registry import build_request
from kvviz.studies.bench.content import swap_columns
from kvviz.studies.bench.contradiction import contradiction_columns
from kvviz.studies.bench.rows import RowWriter, done_pairs, drop_variants, part_path, row_files
from kvviz.studies.bench.scoring import likelihood_columns, result_row
from kvviz.studies.bench.summary import write_summary

# The settings a resumed run must share with the run it continues.
RESUME_KEYS = (
    "pair", "dataset", "dataset_options", "seed", "max_new_tokens", "message_tokens", "shuffle", "options",
    "calibration_sample", "swap", "contradict",
)


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
    """The request of one sample and variant: greedy, the run's settings, the variant's values; a
    handoff that calibrates on the task (``Handoff.task_calibration``) calibrated on
    ``calibration_record`` when one is given (the task's first sample)."""
    given = {name: dict(values) for name, values in options.items()}
    given.setdefault(variant.handoff, {}).update(variant.options)
    request = build_request(choice_query(record), record.context, args.max_new_tokens, False, 0.7, args.seed, given)
    calibration = registry.get(variant.handoff).task_calibration
    if calibration is not None and calibration_record is not None:
        request = calibration.apply(request, calibration_record.context, choice_query(calibration_record))
    return request


def calibrating_on_task(handoffs: list[str], options: dict[str, dict]) -> list[str]:
    """The handoffs of the run that calibrate on the task's first sample (as KVComm's reference
    code does): those with a ``task_calibration`` whose ``unless_option`` was not given. That sample
    is then left out of the score."""
    return [name for name in handoffs if (calibration := registry.get(name).task_calibration) is not None
            and calibration.unless_option not in options.get(name, {})]


def calibration_note(record, handoffs: list[str]) -> str:
    labels = " and ".join(registry.label_of(name) for name in handoffs)
    return (f"{labels} calibrated on the task's first sample, {record.id} (left out of the score): "
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
        if "numerics" in old:  # checked once the models load (``record_numerics``)
            merged["numerics"] = old["numerics"]
        config = merged
    write_config(path, config)


def write_config(path: Path, config: dict) -> None:
    """config.json replaced at once (ranks of one run may write it together)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(config, indent=2), encoding="utf-8")
    os.replace(temporary, path)


def record_numerics(out: Path, mode: str, has_rows: bool) -> None:
    """The numeric mode the run computes in (``kvviz.runtime.numerics``), kept in its config.json: a
    run resumed in another mode is refused (its rows would mix two modes). A folder written before
    runs recorded their mode keeps none (its rows' mode is not known); a new one records it."""
    path = out / "config.json"
    if not path.exists():  # a rank other than 0 before rank 0 wrote it: rank 0 records the mode
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    stored = config.get("numerics")
    if stored is not None and stored != mode:
        raise ValueError(f"{out} holds rows computed in the {stored} numeric mode and this process computes in {mode}: "
                         f"run it with KVVIZ_NUMERICS={stored}, or use another --out.")
    if stored is None and not has_rows:
        write_config(path, {**config, "numerics": mode})


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


def load_records(args, extra: int = 0):
    """The run's records (``extra`` more than ``--limit``: the task's calibration sample)."""
    options = parse_dataset_options(args.dataset_option)
    limit = None if args.limit is None else args.limit + extra
    records, report = load_dataset_with_report(args.dataset, limit=limit, seed=args.seed if args.shuffle else None, **options)
    if report.problems:
        print(report.summary(), file=sys.stderr)
    return records


def split_option_arguments(args, handoffs: list[str]) -> tuple[dict, dict]:
    """(swept lists, single values) from the option flags, for the chosen handoffs."""
    given = option_arguments(args)
    sweeps, single = {}, {}
    for name in handoffs:
        swept = {option.name for option in registry.get(name).swept_options()}
        for option, value in given.get(name, {}).items():
            (sweeps if option in swept else single).setdefault(name, {})[option] = value
    return sweeps, single


@dataclass
class Plan:
    """What one benchmark process runs: its records, the variants, the options, and where."""

    out: Path
    rank: int
    world: int
    local: int
    variants: list[Variant]
    options: dict[str, dict]
    records: list[tuple[int, object]]  # (index in the task, record), this process's share
    calibration_record: object | None
    calibrated: list[str]  # the handoffs calibrated on it
    swaps: dict | None = None  # record id -> its swapped note (bench --swap), None without a swap arm
    contradictions: dict | None = None  # record id -> its contradicted note (bench --contradict), None without


def plan(args) -> Plan:
    """Variants, records (the task's calibration sample set apart), the config check, --fresh and --redo."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rank, world, local = distributed_rank()
    if args.fresh and rank == 0:
        for path in row_files(out) + list(out.glob(".done-*")) + [out / "config.json"]:
            path.unlink(missing_ok=True)
    handoffs = registry.parse_handoffs(args.handoffs)
    sweeps, options = split_option_arguments(args, handoffs)
    variants = expand_variants(handoffs, sweeps)
    probe = build_request("probe", None, args.max_new_tokens, options=options)
    config = {
        "pair": args.pair,
        "dataset": args.dataset,
        "dataset_options": parse_dataset_options(args.dataset_option),
        "seed": args.seed,
        "shuffle": args.shuffle,
        "max_new_tokens": args.max_new_tokens,
        "message_tokens": registry.tokens_before_answer(probe),
        "limit": args.limit,
        "variants": [v.label for v in variants],
    }
    if options:
        config["options"] = options
    calibrated = calibrating_on_task(handoffs, options)
    records = list(enumerate(load_records(args, extra=1 if calibrated else 0)))
    calibration_record = None
    if calibrated:
        # the first sample calibrates and is not scored: one more was loaded so that --limit are scored
        calibration_record = records.pop(0)[1] if records else None
        config["calibration_sample"] = calibration_record.id if calibration_record else None
        config["calibrated_handoffs"] = calibrated
    swaps = contradicted = None
    if getattr(args, "contradict", False):
        made = contradictions_for(args.dataset, [record for _, record in records], args.seed)
        contradicted, records = counterfactual_records("--contradict", made, records)
        config["contradict"] = {"samples": len(records), "rule": f"kvviz.data.contradictions ({args.dataset}), seed {args.seed}"}
    if getattr(args, "swap", False):
        made = swaps_for(args.dataset, [record for _, record in records], args.seed)
        swaps, records = counterfactual_records("--swap", made, records)
        config["swap"] = {"samples": len(records), "rule": f"kvviz.data.swaps ({args.dataset}), seed {args.seed}"}
    if rank == 0 or world == 1 or (out / "config.json").exists():
        # the other ranks check against what rank 0 wrote (or will write: same command line)
        check_config(out, config)
    if args.redo and rank == 0:
        dropped = drop_variants(out, set(parse_names(args.redo)))
        print(f"--redo: removed {dropped} row(s) of {args.redo} to run them again", file=sys.stderr)
    mine = [(index, record) for index, record in records if index % world == rank]
    return Plan(out, rank, world, local, variants, options, mine, calibration_record, calibrated, swaps, contradicted)


def counterfactual_records(flag: str, made: dict, records: list[tuple[int, object]]) -> tuple[dict, list[tuple[int, object]]]:
    """(record id -> its counterfactual note, the records that have one): ``bench --swap`` and
    ``--contradict`` score only samples whose note has one, and say how many they left out."""
    kept = [(index, record) for index, record in records if record.id in made]
    if len(kept) < len(records):
        print(f"{flag}: {len(records) - len(kept)} of {len(records)} sample(s) have none and are left out", file=sys.stderr)
    return {record.id: made[record.id] for _, record in kept}, kept


def with_counter_lens(request, record, contradicted: dict | None):
    """With a contradiction arm, the original request's logit lens follows the gold and the counter
    answers too (their probabilities on the original note)."""
    made = None if contradicted is None else contradicted.get(record.id)
    if made is None:
        return request
    return dataclasses.replace(request, inspect=contradiction.lens_inspect(request, record.answers, made.answers))


def write_rows(args, run: Plan) -> None:
    """The evaluation loop over this process's share, one row written per answer (resumable)."""
    done = done_pairs(run.out)
    todo = pending(run.records, run.variants, done)
    skipped = len(run.records) * len(run.variants) - todo
    if skipped:
        print(f"resuming: {skipped} sample/handoff pair(s) already in {run.out}", file=sys.stderr)
    if not todo:
        return
    device = args.device
    if device is None and run.world > 1:
        device = f"cuda:{run.local}" if torch.cuda.is_available() else "cpu"
    pair = runner.load_pair(args.pair, device, args.dtype, progress=lambda message: print(message, file=sys.stderr))
    record_numerics(run.out, pair.receiver.numerics, has_rows=bool(done))
    writer = RowWriter(part_path(run.out, run.rank, run.world))
    bar = tqdm(total=todo, desc=f"bench {args.dataset}" + (f" [{run.rank}/{run.world}]" if run.world > 1 else ""),
               position=run.rank if run.world > 1 else 0, disable=args.quiet)
    def request_for(record, variant):
        request = variant_request(record, variant, args, run.options, run.calibration_record)
        return with_counter_lens(request, record, run.contradictions)

    swap_of = None if run.swaps is None else (lambda record: run.swaps.get(record.id))
    try:
        for item in evaluate(pair, run.records, run.variants, request_for, done, swap_of=swap_of):
            bar.set_postfix_str(item.variant.label, refresh=False)
            row = result_row(item.record, item.index, item.variant, item.result, args, run.rank, run.world)
            if item.swapped is not None:
                row.update(swap_columns(item.record, item.result, item.swapped, item.swap))
            made = None if run.contradictions is None else run.contradictions.get(item.record.id)
            if made is not None:
                other = contradiction.contradicted_result(item.variant.handoff, pair, item.request, made, item.record.answers)
                row.update(contradiction_columns(item.record, item.result, other, made))
            record = item.record
            if item.result.applicable and record.choices is not None and not args.no_likelihood:
                row.update(likelihood_columns(pair, record, item.variant.handoff, item.request, item.result))
            elif record.choices is not None and args.no_likelihood:
                row["likelihood_note"] = "not computed: --no-likelihood"
            writer.write(row)
            bar.update(1)
    finally:
        bar.close()
        writer.close()


def run_bench(args) -> int:
    run = plan(args)
    marker = run.out / f".done-{run.rank}-of-{run.world}"
    marker.unlink(missing_ok=True)
    write_rows(args, run)
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"), encoding="utf-8")
    out, world = run.out, run.world
    if all((out / f".done-{r}-of-{world}").exists() for r in range(world)):
        title = f"{args.dataset} on pair {args.pair}"
        if run.calibration_record is not None:
            title += f"\n\n{calibration_note(run.calibration_record, run.calibrated)}"
        summary = write_summary(out, [v.label for v in run.variants], title=title)
        if not args.quiet:
            print((out / "summary.md").read_text(encoding="utf-8"))
        print(f"wrote {out}/summary.csv, summary.md, figures.html and {part_path(out, run.rank, world).name}", file=sys.stderr)
    else:
        print(f"rank {run.rank}: rows written to {part_path(out, run.rank, world)}; the last process to finish writes the summary",
              file=sys.stderr)
    return 0
