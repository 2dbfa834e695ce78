"""``eval-translator`` (kvviz.studies.c2c: ``translator_sets``, ``translator_rows``, ``translator_summary``,
``translator_eval``): every row on held-out records, its checks, matched / deranged, harm against the
receiver alone, follow rates on swapped facts, the binding breakdown and the presets. Tiny models."""

from __future__ import annotations

from kvviz.data import recall, whereabouts
from kvviz.data.record import Record
from kvviz.data.swaps import swap_outcome, swaps_for
from kvviz.studies.c2c import translator_eval, translator_rows, translator_sets, translator_summary
from tests.unit.test_translator import random_translator


def quiet(message):
    return None


def test_the_evaluator_measures_every_row_and_its_checks_hold(mixed_tiny_pair, one_thread):
    """Receiver, Skyline (and Skyline on the other note), translator and control on held-out records;
    the oracle equals Skyline and closed gates equal the receiver alone on the checked records; each
    reader of the note gets its matched / deranged cell and its harm against the receiver alone."""
    pair = mixed_tiny_pair
    records = recall.generate("heldout", 4, seed=1)
    report = translator_rows.evaluate(pair, random_translator(pair), {"recall": records}, seed=0, max_new_tokens=3,
                                      progress=quiet, checks=3)
    summary = report["recall"]
    assert set(summary["rows"]) == {"receiver", "skyline", "skyline_control", "translator", "control"}
    assert all(row["n"] == 4 for row in summary["rows"].values())
    for check in summary["checks"].values():
        assert check["records"] == 3 and check["same_answers"] == 3 and check["max_nll_difference"] < 1e-3
    assert summary["communication"]["of"] == 4 and len(summary["communication"]["ci95"]) == 2
    assert summary["answers"]["ids"] == [r.id for r in records] and len(summary["answers"]["translator"]) == 4
    answers = summary["answers"]  # each record's answer on its swapped note, kept to pair follow rates across reports
    for row in ("skyline", "translator"):
        followed = sum(swap_outcome(text, gold, twin) == "followed" for text, gold, twin
                       in zip(answers[f"{row}_swap"], answers["golds"], answers["swap_golds"]) if twin is not None)
        assert followed == summary["swap"]["rows"][row]["followed"]
    cells = summary["matched_deranged"]
    assert cells["translator"]["matched"] is summary["rows"]["translator"] and cells["translator"]["deranged"] is summary["rows"]["control"]
    assert cells["skyline"]["deranged"] is summary["rows"]["skyline_control"]
    for row in ("translator", "control", "skyline_control"):
        compared = summary["harm"][row]
        difference = (summary["rows"][row]["contains"] - summary["rows"]["receiver"]["contains"]) / 4
        assert compared["n"] == 4 and abs(compared["difference"] - difference) < 1e-9
        assert compared["ci95"][0] <= compared["difference"] <= compared["ci95"][1]
        assert compared["no_worse"] == (compared["ci95"][1] >= 0)
    text = translator_eval.format_report(report)
    assert "translator closes" in text and "matched / deranged" in text and "against the receiver alone" in text
    measured = translator_summary.measured_summary({**report, "draw": {"seed": 0}})
    assert measured["communication_gain"]["n"] == 4 and measured["draw"] == {"seed": 0}
    assert measured["sets"]["recall"]["matched_deranged"]["translator"]["deranged"]["n"] == 4
    # another translator on the same records: its own rows only (the receiver's and Skyline's do not change)
    only = translator_rows.evaluate(pair, random_translator(pair, seed=1), {"recall": records}, rows=("translator", "control"),
                                    max_new_tokens=3, progress=quiet, checks=0)
    assert set(only["recall"]["rows"]) == {"translator", "control"} and only["recall"]["communication"]["of"] == 4
    assert "communication gain" in translator_eval.format_report(only)


def test_the_evaluator_counts_a_control_that_answers_with_the_other_note():
    """The control reads another record's note (its partner): an answer naming the partner's answer,
    and not its own, is counted as the other note crossing; so is Skyline's on the other note."""
    records = [Record(id=str(i), question="Where?", context=f"note {i}", answers=[country], choices=None,
                      answer_index=None, source="test", response=country, meta={})
               for i, country in enumerate(["France", "Japan", "Peru"])]
    partner = translator_sets.partners(records, seed=0)
    assert all(partner[i] != i for i in range(3))
    control = [(f"In {records[partner[i]].answers[0]}.", 1.0, 1) for i in range(2)] + [("Nowhere", 1.0, 1)]
    assert translator_summary.control_follows_other({"control": control}, records, partner) == {
        "names_the_other_notes_answer": 2, "of": 3}
    both = translator_summary.control_follows_other({"control": control, "skyline_control": control[:1] * 3}, records, partner)
    assert both["skyline_names_the_other_notes_answer"] == 1
    assert translator_summary.control_follows_other({"translator": control}, records, partner) is None


def test_the_held_out_sets_keep_their_records_apart(shared_data):
    """Paragraphs are HotpotQA's supporting paragraphs (swapped by HotpotQA's rule); the harm set's
    notes never hold the landmark asked about; the same seed draws the same records, another seed others."""
    sets = translator_sets.heldout_sets(3, 0, seed=5, whereabouts_n=3, paragraphs_n=4, unneeded_n=6)
    assert [len(sets[name]) for name in ("recall", "whereabouts", "paragraphs", "unneeded")] == [3, 3, 4, 6]
    assert all("\n" in r.context for r in sets["paragraphs"])  # "title\ntext" paragraphs
    assert set(translator_sets.set_swaps("paragraphs", sets["paragraphs"], 0)) <= {r.id for r in sets["paragraphs"]}
    for record in sets["unneeded"]:
        assert record.meta["landmark"].removeprefix("the ") not in record.context
        assert record.answers == whereabouts.answers_for(record.meta["country"])
    again = translator_sets.heldout_sets(0, 0, seed=5, unneeded_n=6)["unneeded"]
    other = translator_sets.heldout_sets(0, 0, seed=6, unneeded_n=6)["unneeded"]
    assert [r.question for r in again] == [r.question for r in sets["unneeded"]] and [r.context for r in other] != [r.context for r in again]
    assert {r.context for r in sets["unneeded"]}.isdisjoint(r.context for r in whereabouts.generate("heldout", 6, seed=6))


def test_the_evaluator_adds_the_swapped_fact_the_binding_breakdown_and_the_presets(mixed_tiny_pair, one_thread):
    """Follow rates beside the receiver alone and the control (which never read the swapped note: the
    chance floor), who-is-where by people per note, and the presets with another preset's note."""
    pair = mixed_tiny_pair
    records = whereabouts.generate("heldout", 4, seed=1)
    report = translator_rows.evaluate(pair, random_translator(pair), {"whereabouts": records}, seed=0, max_new_tokens=3,
                                      progress=quiet, checks=0)
    summary = report["whereabouts"]
    swap = summary["swap"]
    assert swap["records"] == 4 and set(swap["rows"]) == {"receiver", "control", "skyline", "translator"}
    # the receiver's follow count is its own answers judged against the swapped answers
    swaps = swaps_for("whereabouts", records, 0)
    receiver_answers = [e["receiver"] for e in summary["examples"]]
    expected = sum(swap_outcome(a, r.answers, swaps[r.id].answers) == "followed" for a, r in zip(receiver_answers, records))
    assert swap["rows"]["receiver"]["followed"] == expected
    assert all(0 <= v["followed"] <= v["n"] == 4 for v in swap["rows"].values()) and "nll" in swap["rows"]["translator"]
    assert summary["examples"][0]["swapped"] and "translator_swap" in summary["examples"][0]
    assert set(summary["by_people"]) == {"1", "2", "3", "2-3"} and summary["by_people"]["2-3"]["translator"]["n"] == 2
    assert "follow rate" in translator_eval.format_report(report)
    presets = translator_sets.preset_records()
    assert {r.meta["preset"] for r, _ in presets} >= {"locker", "big-ben"}
    ran = translator_rows.run_presets(pair, random_translator(pair), presets[:2], max_new_tokens=3)
    assert [e["preset"] for e in ran] == [r.meta["preset"] for r, _ in presets[:2]]
    assert ran[0]["other_note"] == presets[1][0].context and ran[0]["translator_swap"]["outcome"] in ("followed", "kept", "neither")
    assert "preset locker" in translator_eval.format_report({"presets": ran})
    assert translator_summary.measured_summary({**report, "presets": ran})["sets"]["whereabouts"]["swap"]["records"] == 4
