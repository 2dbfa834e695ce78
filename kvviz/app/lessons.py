"""Does a preset's precomputed run still show its lesson? Each preset's ``check`` (assets/presets.toml)
holds claims about its results, column by column; ``failures`` lists the claims its results do not
show. ``tests/unit/test_presets.py`` runs it over assets/precomputed/presets.json (so a regenerated
preset that stops showing its lesson fails the tests) and ``scripts/precompute_presets.py`` prints
it after writing the file.

Verdicts are the page's (``kvviz.data.metrics.verdict``: the answer states a gold answer, not only
denied and not as one of several candidates), plus "na" for a column whose handoff does not apply.
The ``says`` and ``writes`` claims are plain containment (``contains_answer``): the words are there.
"""

from __future__ import annotations

from kvviz.app.presets import Preset
from kvviz.data.metrics import contains_answer, verdict
from kvviz.handoffs import registry

VERDICT_KINDS = ("right", "wrong", "none", "na")


def mark(result: dict, answers) -> str | None:
    """A result's verdict: right / wrong / none, "na" when its handoff did not apply, None without gold."""
    if not result.get("applicable", True):
        return "na"
    return verdict(result.get("answer", ""), answers)


def timed_of(result: dict) -> str:
    """How a result's times were taken: "alone" (the handoff ran by itself on a warm process, as a
    precomputed preset's do: its own cost) or "shared" (a live run's wall clock while its columns
    shared the CPU: compare those within one run only)."""
    return result.get("timed") or ("alone" if result.get("precomputed") else "shared")


# What a right answer is evidence of, by what its control and the swapped note did (``evidence_of``):
# only "carried" says the note's content got through.
EVIDENCE = ("carried", "not needed", "did not follow", "unchecked", "own")


def evidence_of(name: str, results: dict[str, dict], answers) -> str | None:
    """For a right answer: "carried" (its control ran and was wrong and, where the swapped note ran,
    it followed the swap), "not needed" (its control was right too), "did not follow" (right, but
    on the swapped note it did not give the swapped answer), "unchecked" (its control did not run),
    "own" (a column with no control: nothing was sent to it); None for a column that is not right."""
    result = results.get(name)
    if result is None or mark(result, answers) != "right":
        return None
    control = registry.control_of(name)
    if not control:
        return "own"
    if control not in results:
        return "unchecked"
    if mark(results[control], answers) == "right":
        return "not needed"
    outcome = (result.get("swap") or {}).get("outcome")
    return "did not follow" if outcome not in (None, "followed") else "carried"


def sent_layers(result: dict) -> list[int]:
    """The layers a result says it sent (its per-layer records marked ``selected``)."""
    return sorted(record["layer"] for record in result.get("layers") or [] if record.get("selected"))


def claim_failures(check: dict, results: list[dict], answers, where: str) -> list[str]:
    """The claims of one check that ``results`` (one run's, by handoff) do not show."""
    by_name = {result.get("handoff"): result for result in results}
    out = []

    def result_of(name):
        if name not in by_name:
            out.append(f"{where}: no result for {name}")
        return by_name.get(name)

    for kind in VERDICT_KINDS:
        for name in check.get(kind, []):
            result = result_of(name)
            if result is not None and mark(result, answers) != kind:
                out.append(f"{where}: {name} should be {kind}, is {mark(result, answers)} ({result.get('answer', '')!r})")
    for name, words in check.get("says", {}).items():
        result = result_of(name)
        if result is not None and not contains_answer(result.get("answer", ""), [words]):
            out.append(f"{where}: {name} should say {words!r}, says {result.get('answer', '')!r}")
    for name, words in check.get("writes", {}).items():
        result = result_of(name)
        message = (result or {}).get("seen", {}).get("message", "")
        if result is not None and not contains_answer(message, [words]):
            out.append(f"{where}: {name}'s message should hold {words!r}, is {message!r}")
    for name, wanted in check.get("sent_layers", {}).items():
        result = result_of(name)
        if result is None:
            continue
        sent = sent_layers(result)
        if (len(sent) != wanted) if isinstance(wanted, int) else (sent != sorted(wanted)):
            out.append(f"{where}: {name} should send {wanted} layer(s), sent {sent}")
    carried = check.get("carried")
    if carried is not None:
        found = sorted(name for name in by_name if evidence_of(name, by_name, answers) == "carried")
        if found != sorted(carried):
            out.append(f"{where}: the note's content should be carried by {sorted(carried)} (right, control wrong, "
                       f"followed the swap), is by {found}")
    for kind in ("followed", "kept", "neither"):
        for name in check.get(kind, []):
            result = result_of(name)
            outcome = ((result or {}).get("swap") or {}).get("outcome")
            if result is not None and outcome != kind:
                out.append(f"{where}: {name} should have {kind} the swap, has {outcome or 'no swap run'} "
                           f"({((result or {}).get('swap') or {}).get('answer', '')!r})")
    for name in check.get("gain_spans_zero", []):
        result = result_of(name)
        measured = ((result or {}).get("details") or {}).get("communication") or {}
        low, high = measured.get("ci95", (None, None))
        if result is not None and not (low is not None and low <= 0 <= high):
            out.append(f"{where}: {name}'s held-out communication gain interval should hold 0, is {[low, high]}")
    return out


def failures(preset: Preset, entry: dict | None) -> list[str]:
    """Every claim of ``preset.check`` and of its runs' checks that its precomputed ``entry``
    (``{"results": [...], "runs": {label: {"results": [...]}}}``) does not show."""
    if not entry:
        return [f"{preset.key}: no precomputed results"]
    out = claim_failures(preset.check, entry.get("results", []), preset.answers, preset.key)
    for run in preset.runs:
        stored = (entry.get("runs") or {}).get(run.label)
        if stored is None:
            out.append(f"{preset.key}, {run.label}: not precomputed")
            continue
        out += claim_failures(run.check, stored.get("results", []), preset.answers, f"{preset.key}, {run.label}")
    return out
