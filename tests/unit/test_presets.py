"""The presets' lessons hold in their precomputed results, with no model run.

Two layers of checks over the stored runs the page paints from, every numeric mode's file
(assets/precomputed/presets.json in bf16, presets-fp32.json in fp32: ``kvviz.app.presets.stored_in``):

* each preset's own ``check`` (assets/presets.toml), the claims its lesson line makes;
* the kinds of lesson the issue asks the set to have, each defined here independently of the
  presets' own claims (``KINDS``), and no preset whose reference is wrong unless that is its lesson.

A regenerated presets file (``python scripts/precompute_presets.py``) that stops showing a lesson
fails here: then change the preset or its lesson, never the test's definitions.
"""

from __future__ import annotations

import re

import pytest

from kvviz.app.lessons import failures, stored_reading
from kvviz.app.page import views
from kvviz.app.presets import PRECOMPUTED_PATH, PRESETS, _preset, preset, stored_in
from kvviz.app.reading import catalog, evidence
from kvviz.handoffs import registry
from kvviz.handoffs.common import CONTENT_FREE_WORDS, content_free_note
from kvviz.runtime.numerics import MODES
from tests.lesson_words import contradictions
from tests.stored_runs import STORED_BY_MODE

PRECOMPUTED: dict = {}  # the stored runs the running test reads: ``stored_runs`` sets it, once per mode


def reading(key: str, entry: dict | None = None):
    """A preset's stored run (or one of its ``runs``), read by its answers as the page reads it."""
    return stored_reading(preset(key), entry or PRECOMPUTED["presets"][key])


def kvcomm_runs(key: str) -> list[tuple[int, str]]:
    """(layers sent, verdict) of KVComm in every stored run of a preset, the page's own included."""
    entry = PRECOMPUTED["presets"][key]
    found = []
    for run in [entry] + list((entry.get("runs") or {}).values()):
        column = reading(key, run).column("kvcomm")
        if column.applicable:
            found.append((len(column.sent_layers), column.mark))
    return found


def reference(key: str) -> str:
    """The column a learner compares with: Skyline (the receiver reading the context itself) for a
    private context, the sharer alone (the model that holds the knowledge) for a shared question."""
    return "skyline" if preset(key).scenario == "private" else "sharer"


def marks(key: str) -> dict[str, str]:
    read = reading(key)
    return read.marks(read.columns)


def carried(key: str) -> set[str]:
    """The columns whose right answer the note's content carried (it followed the swapped fact)."""
    return set(reading(key).crossed())


def only_text_crosses(key: str) -> bool:
    shown = [name for name in registry.default_handoffs() if name not in ("skyline", "sharer")]
    verdicts = marks(key)
    return "text" in carried(key) and all(verdicts[name] == "wrong" for name in shown if name != "text")


def right_without_content(key: str) -> bool:
    """A column right on the note, its control wrong, that does not follow the swapped fact."""
    read = reading(key)
    return any(kind == evidence.DID_NOT_FOLLOW and read.column(catalog.control_of(name)).mark == "wrong"
               for name, kind in read.evidence(read.columns).items())


def kvcomm_crosses_with_few_layers(key: str) -> bool:
    runs = kvcomm_runs(key)
    fewest_right = min((count for count, verdict in runs if verdict == "right"), default=None)
    return fewest_right is not None and fewest_right <= 3 and any(
        count < fewest_right and verdict == "wrong" for count, verdict in runs)


def kvcomm_has_a_threshold(key: str) -> bool:
    runs = kvcomm_runs(key)
    return any(verdict == "right" and (count - 1, "wrong") in runs for count, verdict in runs)


def shared_question_with_a_reference(key: str) -> bool:
    verdicts = marks(key)
    return preset(key).scenario == "shared" and verdicts["sharer"] == "right" and verdicts["receiver"] == "wrong"


def c2c_differs_from_its_control_while_held_out_says_zero(key: str) -> bool:
    verdicts = marks(key)
    return {verdicts["c2c"], verdicts["c2c_control"]} == {"right", "wrong"} and reading(key).column("c2c").gain == "includes 0"


KINDS = {
    "only-text-crosses": only_text_crosses,
    "kvcomm-few-layers": kvcomm_crosses_with_few_layers,
    "right-without-content": right_without_content,
    "kvcomm-layers": kvcomm_has_a_threshold,
    "shared-reference": shared_question_with_a_reference,
    "c2c-differs-from-control": c2c_differs_from_its_control_while_held_out_says_zero,
    "reference-wrong": lambda key: marks(key)[reference(key)] == "wrong",
    "receiver-knows": lambda key: marks(key)["receiver"] == "right",
    # a column besides the sharer itself answers what the sharer that learned the opposite says
    "follows-the-opposite-sharer": lambda key: preset(key).swap is not None and preset(key).swap.pair is not None
    and bool(carried(key) - {"sharer"}),
}
REQUIRED = ("only-text-crosses", "right-without-content", "shared-reference", "c2c-differs-from-control")


@pytest.fixture(autouse=True, params=MODES)
def stored_runs(request):
    """Every test of this module, once on each numeric mode's stored runs (a page shows its own mode's)."""
    global PRECOMPUTED
    mode, PRECOMPUTED = request.param, STORED_BY_MODE[request.param]
    if not PRECOMPUTED.get("presets"):
        pytest.fail(f"{stored_in(PRECOMPUTED_PATH, mode).name} is missing or unreadable: "
                    f"KVVIZ_NUMERICS={mode} python scripts/precompute_presets.py")
    assert PRECOMPUTED.get("numerics") == mode


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_each_presets_lesson_holds_in_its_precomputed_results(key):
    assert failures(preset(key), PRECOMPUTED["presets"].get(key)) == []


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_each_preset_is_the_kind_of_lesson_it_says(key):
    for kind in preset(key).shows:
        assert kind in KINDS, f"{key}: unknown kind {kind}"
        assert KINDS[kind](key), f"{key} does not show {kind}: {marks(key)}; KVComm runs {kvcomm_runs(key)}"


def test_the_set_has_every_lesson_the_page_needs_and_no_wrong_reference_unless_that_is_the_lesson():
    kinds = {kind for p in PRESETS for kind in p.shows}
    assert set(REQUIRED) <= kinds
    for p in PRESETS:
        if "reference-wrong" not in p.shows:
            assert marks(p.key)[reference(p.key)] == "right", f"{p.key}: its reference {reference(p.key)} is wrong"


def test_every_preset_names_registered_columns_and_states_its_lesson():
    for p in PRESETS:
        assert p.lesson and p.subject and p.answers
        claims = p.claims + [claim for run in p.runs for claim in run.claims]
        named = set(p.handoffs) | {name for run in p.runs for name in run.handoffs}
        named |= {name for claim in claims if claim.question.kind != "crossed" for name in claim.question.columns()}
        assert named <= set(registry.HANDOFFS), f"{p.key}: {sorted(named - set(registry.HANDOFFS))}"
        assert (p.context is None) == (p.scenario == "shared")


def test_a_preset_with_an_unknown_field_or_claim_is_refused():
    raw = {"key": "x", "title": "X", "scenario": "private", "query": "Q?", "context": "C.", "answers": ["a"]}
    assert _preset(raw).context == "C."
    with pytest.raises(ValueError, match="unknown field"):
        _preset({**raw, "lessons": "typo"})
    with pytest.raises(ValueError, match="unknown claim"):
        _preset({**raw, "check": {"rigth": ["text"]}})
    with pytest.raises(ValueError, match="verdict of text must be one of"):
        _preset({**raw, "check": {"verdict": {"text": "maybe"}}})
    with pytest.raises(ValueError, match="scenario"):
        _preset({**raw, "scenario": "public"})


# function words: a word outside this list could name what a question asks for
FUNCTION_WORDS = set("""a an the it its is are was were be been being as and or but so if then than that this these those
of in on at to for from by with without will would shall should can could may might must do does did has have had
not no nor very just also too here there what which who whom whose when where why how""".split())


def content_words(text: str | None) -> set[str]:
    return {word for word in re.findall(r"[a-z0-9']+", (text or "").lower()) if word not in FUNCTION_WORDS}


def test_the_controls_note_names_nothing_any_preset_asks_or_answers():
    """The KVComm and translation controls read ``content_free_note`` instead of the note: it must
    share no content word with any preset's question, note or answer, so that a control's answer
    cannot repeat one (the old control sentence named a person, a shed, a bicycle and Lisbon)."""
    assert not content_words(" ".join(CONTENT_FREE_WORDS))
    asked = set().union(*(content_words(p.query) | content_words(p.context) | content_words(" ".join(p.answers))
                          for p in PRESETS))
    for p in PRESETS:
        note = content_free_note(p.context)
        assert len(note.split()) == max(3, len((p.context or "").split())), p.key  # the note's length
        assert not content_words(note) & asked, (p.key, note)


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_no_strip_says_the_note_got_through_a_column_that_did_not_follow_the_swap(key):
    """The verdict strip of every preset, with every column ticked: each column it lists under "got
    through by" is right and followed the swapped fact; every private preset declares which columns
    the note crossed by and has a swap; a shared question with no swap (no note to swap, no sharer
    that learned the opposite) lists none."""
    p = preset(key)
    read = reading(key)
    strip = views.verdict(read, list(read.columns))["verdict"]
    listed = re.search(r"got through by: <b>(.*?)</b>", strip).group(1)
    labels = {catalog.label_of(name): name for name in read.columns}
    for label in filter(None, listed.split(", ")):
        if label == "none":
            continue
        column = read.column(labels[label])
        assert column.mark == "right" and column.swap.outcome == "followed", (key, column.name, column.swap)
    if p.scenario == "private" or p.swap is not None:
        assert p.swap is not None and "crossed" in p.check
    else:
        assert listed == "none", (key, strip)


@pytest.mark.parametrize("key", [p.key for p in PRESETS])
def test_every_column_ticked_each_lesson_says_what_the_strip_says(key):
    """With all 14 columns ticked (a preset's stored run holds every column), the strip's "got
    through by" is exactly the lesson's ``crossed`` claim, and no sentence of the lesson says the
    note got across by a column the evidence rule does not show it for (Lena's "only the text
    message" and a shared question's "carries it across" failed this)."""
    p, read = preset(key), reading(key)
    assert len(read.columns) == len(catalog.names()) == 14
    strip = views.verdict(read, catalog.names())["verdict"]
    listed = re.search(r"got through by: <b>(.*?)</b>", strip).group(1)
    claimed = next(c.expected for c in p.claims if c.question.kind == "crossed")
    assert listed == (", ".join(catalog.label_of(name) for name in catalog.in_page_order(claimed)) or "none"), strip
    assert contradictions(p.lesson, set(read.crossed())) == []


def test_the_lesson_check_catches_a_lesson_the_evidence_contradicts():
    read = reading("colosseum")
    old_lena = "Only the text message gets Italy across. KVComm says Russia like the receiver alone."
    assert contradictions(old_lena, set(read.crossed())) != []  # the latent relay and Skyline got it across too
    assert contradictions("The text message carries it across; C2C and its control do not.", set()) != []
    assert contradictions("KVComm's right answer is not shown to come from the note.", {"kvcomm"}) != []
    assert contradictions(preset("colosseum").lesson, set(read.crossed())) == []


def test_the_opening_presets_times_were_taken_alone_and_do_not_contradict_the_work_each_does():
    """Precomputed presets are timed one handoff at a time on a warm process (the page says
    "alone"): the receiver alone, which reads only the question, is not shown slower than Skyline,
    which reads the note too, by more than noise (a shared or cold run showed it 6x slower)."""
    from kvviz.app.presets import DEFAULT_PRESET

    assert PRECOMPUTED.get("timed") == "alone" and "one handoff at a time" in PRECOMPUTED["generated"]
    found = {r["handoff"]: r for r in PRECOMPUTED["presets"][DEFAULT_PRESET]["results"]}
    receiver, skyline = (float(found[name]["timings"]["total"]) for name in ("receiver", "skyline"))
    generated = lambda name: max(1, int(found[name]["tokens"]["generated"]))  # noqa: E731
    # per answer token, so that a longer answer is not read as a slower handoff
    assert receiver / generated("receiver") <= 1.25 * skyline / generated("skyline"), (receiver, skyline)
