"""The guided walk-through: its steps (what each says, the preset it loads, the tab it opens, what
it points at) and its predictions, asked before a step's answers show and answered by the step's
preset's stored run through its reading (``kvviz.app.reading``: one vocabulary of questions, the
same the presets and the exercises use). No Gradio.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass

from kvviz.app.methods import registry as methods
from kvviz.app.methods.registry import MethodPage, Prediction
from kvviz.app.presets import DEFAULT_PRESET, preset
from kvviz.app.reading import catalog
from kvviz.app.reading.reading import Reading

@dataclass(frozen=True)
class WalkStep:
    """One step: its title and text (markdown, fixed sentences), the preset it loads (None: keep
    the page as it is), the tab it opens (None: none) and the element it scrolls to and outlines."""

    title: str
    text: str
    preset: str | None = None
    tab: str | None = None
    target: str = "kv-answers"
    # a question asked before the answer shows (its text filled from the preset), and what the
    # reveal adds after the verdict (the preset's lesson)
    predict: Prediction | None = None
    reveal: str = ""


PREDICTION_CHOICES = ("Yes", "No")  # the question says what yes means; the reveal says what the stored run did


def prediction_outcome(prediction: Prediction, reading: Reading) -> tuple[int | None, str]:
    """Which choice the run ``reading`` makes right (0 yes, 1 no; None when it cannot say: a column
    that did not run, or no swapped note) and the sentence that says what it shows."""
    ask, columns = prediction.ask, [reading.column(name) for name in prediction.ask.columns()]
    missing = next((column for column in columns if not column.applicable), None)
    if missing is not None:
        return None, f"{missing.label} did not run in these results, so they cannot say."
    answer = reading.answer(ask)
    if answer is None:
        return None, f"{catalog.label_of(ask.column)} has no answer to this in these results, so they cannot say."
    said = "; ".join(f"{column.label} answered *{html.escape(column.answer.strip())}* ({column.mark})" for column in columns)
    if ask.kind == "follow":
        column = columns[0]
        changed = html.escape(column.swap.changed.replace(" -> ", " swapped for "))
        said += (f"; on the note with {changed} it answered *{html.escape(column.swap.answer.strip())}* "
                 f"({'followed' if answer == 'followed' else 'did not follow'})")
    evidence = columns[0].evidence_sentence()
    return (0 if answer == prediction.yes else 1), said + "." + (f" {html.escape(evidence)}." if evidence else "")


# On a phone the walk-through panel holds a whole step without a scroll of its own: while a choice is
# due its text folds to three lines (the question and the choices are what it asks); once the learner
# picked, the reveal takes the text's place and the choices go (the reveal says which was right).
PHONE = "@media (max-width: 640px)"
FOLDED_TEXT = (f"{PHONE} {{#kv-walk-text {{display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical; "
               "overflow: hidden}}}}")
REVEALED_CSS = f"<style>{PHONE} {{#kv-walk-text, #kv-walk-guess {{display: none !important}}}}</style>"


def prediction_veil_css(prediction: Prediction | None) -> str:
    """The CSS that hides what would give a prediction away until the learner picks: the column's
    (and its control's) answer, mark, stats, swap and what-if rows, every swap and contradiction row, the verdict
    strip and the lesson; on a phone it also folds the step's text. Empty when there is nothing to hide."""
    if prediction is None:
        return ""
    hidden = ["#kv-verdict", "#kv-lesson-row", ".kv-swap-row", ".kv-contra-row"]
    for name in prediction.ask.columns():
        hidden += [f"#kv-answer-{name}", f"#kv-mark-{name}", f"#kv-stats-{name}", f"#kv-whatif-{name}"]
    return f"<style>{', '.join(hidden)} {{filter: blur(7px); pointer-events: none; user-select: none}} {FOLDED_TEXT}</style>"


def prediction_question(prediction: Prediction, key: str | None) -> str:
    """The question with the preset's swap named where it asks for it ({old}, {new}, {swapped})."""
    loaded = preset(key) if key else None
    words = (loaded.swap_words if loaded is not None and loaded.swap_words else ("the fact", "another"))
    swapped = loaded.swap.answers[0] if loaded is not None and loaded.swap is not None else "the swapped answer"
    return prediction.question.format(old=words[0], new=words[1], swapped=swapped)


def handoff_step(page: MethodPage) -> WalkStep:
    """A handoff's own step, from its page entry: its text with the loaded preset's title and lesson,
    and what it points at (its figure in the Layers tab, its column, or the cost plots)."""
    key = DEFAULT_PRESET if page.walkthrough_preset == methods.OPENING_PRESET else page.walkthrough_preset
    text = page.walkthrough
    title = page.handoff.title
    predict, reveal = page.walkthrough_predicts, ""
    if key:
        lesson = preset(key).lesson
        if predict is not None:  # the lesson tells the outcome: it comes with the reveal
            lesson, reveal = "its lesson shows once you have predicted.", lesson
        text = text.replace("{preset}", preset(key).title).replace("{lesson}", lesson)
    if predict is not None:
        predict = dataclasses.replace(predict, question=prediction_question(predict, key))
    if page.walkthrough_shows == "cost":
        return WalkStep(title, text, key, "cost", "kv-plot-latency", predict, reveal)
    if page.figure is not None:
        return WalkStep(title, text, key, "layers", f"kv-plot-{page.name}", predict, reveal)
    return WalkStep(title, text, key, None, f"kv-col-{page.name}", predict, reveal)


def walkthrough_steps() -> list[WalkStep]:
    """An opening, one step per handoff shown at first that tells its part, what it costs, and
    your turn; each title numbered "Step i of n: ..."."""
    first = preset(DEFAULT_PRESET)
    sweeps = methods.with_sweep()
    steps = [
        WalkStep(
            "The puzzle",
            f"We loaded the preset **{first.title}**. A *sharer* model has read a note: *{first.context}* A "
            f"*receiver* model gets only the question *{first.query}* The receiver must answer, so the note has "
            "to travel from one model to the other somehow. Each coloured card is one way to make that trip; "
            "its mark says whether the answer holds the expected one.",
            DEFAULT_PRESET, None, "kv-answers",
        ),
        *[handoff_step(page) for page in methods.columns() if page.handoff.default and page.walkthrough],
        WalkStep(
            "Predict, then reveal: what did the answer read?",
            "We loaded **Locker code** again, in the **What crossed** tab on KVComm's column. Predict first: when "
            "the receiver writes the code's first digit, which tokens of the note will it read most? Decide, then "
            "hover that digit among the answer's tokens: the note's tokens light up by how much that answer token "
            "attended to them, summed over the layers and heads ticked in the grid (*sent layers only* keeps the "
            "layers KVComm sent). The first token of the note, the attention sink, is left out unless you tick it "
            "back. Measured in this preset's run, on this question.",
            "locker", "tokens", "kv-tokens",
        ),
        WalkStep(
            "What it costs",
            "In **Time and bytes**, *What crosses between the models* compares sizes on a log scale: a text "
            "message is a few dozen bytes, a KV cache hundreds of kilobytes. Text is small but slow to write; KV "
            "is big but needs no writing. Nothing here crosses a network: the bytes are counted and KVComm's "
            "transfer is a copy in memory, so which is better on a real link is not measured here. *First token* "
            "is timed from the question to the receiver's first answer token, the sender's work included; "
            "*receiver side* leaves that work out. A precomputed preset's times were taken one handoff at a time on "
            "a warm process (its own cost: *alone*); a live run's are wall clock while its columns shared the CPU, so "
            "compare them within that run only (the plot's title says which it shows).",
            None, "cost", "kv-plot-bytes",
        ),
        WalkStep(
            "Your turn",
            "Press **Run live** to run the ticked handoffs on this machine. Tick more handoffs in the row under "
            "the question, open *Settings* (the panel on the left), change a handoff's options, and run again: "
            "**Compare two** then puts a column beside the run before, or beside its control."
            + (f" Finally, in the **Sweep** tab, press **Run sweep** (*{sweeps[0].sweep.title}*)." if sweeps else ""),
            None, None, "kv-run",
        ),
    ]
    count = len(steps)
    return [dataclasses.replace(step, title=f"Step {i + 1} of {count}: {step.title}") for i, step in enumerate(steps)]


