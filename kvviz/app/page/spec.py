"""What the page shows, read from the registry and the presets: its columns, tabs and figures, the
handoffs' options as widgets, the ``/run`` endpoint's parameters, and the walk-through. No Gradio:
the page is built from these (``kvviz.app.page.layout``) and tests read them directly.
"""

from __future__ import annotations

import dataclasses
import html
import os
from dataclasses import dataclass
from urllib.parse import urlencode

from kvviz.app.methods import registry as methods
from kvviz.app.methods.registry import MethodPage, Prediction
from kvviz.app.plots import layer_figure_handoffs
from kvviz.app.present import GLOSSARY, mark_of
from kvviz.app.presets import DEFAULT_PRESET, Preset, preset
from kvviz.data.swaps import Swap, replace_fact
from kvviz.handoffs import registry
from kvviz.handoffs.registry import Handoff, Option

MODEL_QUEUE = "models"
# The live runs (Run live, Swap the fact, /run): Gradio hands up to ``policy.PAGE_RUNS_AT_ONCE`` of them to the
# engine at once, which computes identical ones once and queues the others for the models, telling each its
# place (``kvviz.engine.shared_runs``); the sweep stays in ``MODEL_QUEUE`` and takes the same models' slot.
RUN_QUEUE = "runs"
MAX_UI_NEW_TOKENS = 256  # the slider's end (the server's cap, kvviz.core.limits, may be lower)
# Seconds between a run's streamed updates of its answers (all columns together), on the page and through /run.
# Each update costs the server's event loop, which shares the interpreter with the models (~10 ms for /run's
# 55 outputs; ``python scripts/bench_app.py --update-costs``): four a second still reads as streaming.
STREAM_INTERVAL = 0.25
FIXED_PLOTS = ("latency", "bytes")
LENS_PLOT = "lens"  # the Depth tab's logit lens, over the ticked columns
RUN_LABEL = "Run live"
BUSY_LABEL = "Running…"
EXPECTED_SEPARATOR = ";"

# The tabs below the answers, in order: (id, title). A figure lives in exactly one tab.
TABS = (
    ("layers", "Layers"),
    ("tokens", "What crossed"),
    ("lens", "Depth"),
    ("compare", "Compare two"),
    ("cost", "Time and bytes"),
    ("seen", "What each model saw"),
    ("sweep", "Sweep"),
    ("how", "How it works"),
    ("data", "Data"),
)
DEFAULT_TAB = "layers"


# --- columns and figures ------------------------------------------------------------------------


def column_names() -> list[str]:
    """The page's columns, in order (every handoff with a page entry; the default ones are shown at first)."""
    return methods.column_names()


def default_columns() -> list[str]:
    return methods.default_columns()


# The column chips in three groups, each with what its columns are for (``column_group``).
COLUMN_GROUPS = (
    ("baseline", "Baselines", "what the receiver answers with nothing sent, and with the note in its own prompt"),
    ("method", "Handoffs", "ways for the note to reach the receiver: a text message, a cache, vectors"),
    ("control", "Controls", "a handoff's own machinery with the note's content taken out: what it answers anyway"),
)


def column_group(name: str) -> str:
    """"control" for a column that is another's control (not the receiver alone), "baseline" for
    the receiver alone, Skyline and the sharer alone, else "method"."""
    handoff = registry.get(name)
    if name in {h.control for h in registry.all_handoffs()} - {"receiver", ""}:
        return "control"
    return "baseline" if handoff.role in ("floor", "ceiling") or name == "sharer" else "method"


def grouped_columns() -> list[str]:
    """The page's columns in chip order: baselines, handoffs, controls (page order within each)."""
    order = [group for group, _, _ in COLUMN_GROUPS]
    return sorted(column_names(), key=lambda name: order.index(column_group(name)))


# The first screen's one sentence: who read what and who must answer (its terms in the glossary, on hover).
SETUP_SENTENCE = (
    'The <b>sharer</b> reads the private note; the <b>receiver</b> answers without it. Each column below hands the '
    'note over one way (text, a <abbr title="{kv}">KV cache</abbr>, vectors), beside its control.')


def setup_html() -> str:
    return '<div class="kv-setup">' + SETUP_SENTENCE.format(kv=html.escape(GLOSSARY["KV cache"])) + "</div>"


def chip_decorations() -> dict:
    """Per chip label: its group's heading where a group starts, and its plain-language hover text."""
    out, seen = {}, set()
    headings = {group: (title, why) for group, title, why in COLUMN_GROUPS}
    for name in grouped_columns():
        group, handoff = column_group(name), registry.get(name)
        title, why = headings[group]
        out[handoff.label] = {"group": group, "hint": f"{handoff.title} — {handoff.summary}",
                              "heading": None if group in seen else title, "why": why}
        seen.add(group)
    return out


def preset_columns(picked: Preset) -> list[str]:
    """The columns a preset ticks: its own list, else the page's default ones, in page order."""
    wanted = set(picked.handoffs or default_columns())
    return [name for name in column_names() if name in wanted]


def layer_figure_names() -> list[str]:
    """The page columns that draw their own figure (the Layers tab), in column order."""
    return layer_figure_handoffs(column_names())


def plot_names() -> list[str]:
    """Every run figure, in order: each page handoff's own figure, then latency and bytes."""
    return layer_figure_names() + list(FIXED_PLOTS)


def tab_figures(tab: str, names: list[str]) -> list[str]:
    """The figures a tab shows for the ticked columns ``names``."""
    if tab == "layers":
        return [name for name in layer_figure_names() if name in names]
    if tab == "cost":
        return list(FIXED_PLOTS)
    if tab == "lens":
        return [LENS_PLOT]
    return []


def token_view_column(names: list[str], with_view: list[str], chosen: str | None) -> str | None:
    """The column the token view shows: the chosen one when it has a view and is ticked, else a
    ticked column whose page entry opens the view (``MethodPage.opens_token_view``), else the first
    ticked column with one."""
    candidates = [name for name in names if name in with_view]
    if chosen in candidates:
        return chosen
    opening = [name for name in candidates if (page := methods.page_of(name)) is not None and page.opens_token_view]
    for name in [*opening, *candidates]:
        if name in candidates:
            return name
    return None


# --- the handoffs' options as widgets -----------------------------------------------------------


@dataclass(frozen=True)
class PageOption:
    """One handoff option as page widgets: its value, and a checkbox first when it has "auto"."""

    handoff: Handoff
    option: Option

    @property
    def inputs(self) -> int:
        return 2 if self.option.auto else 1

    @property
    def elem_id(self) -> str:
        return f"kv-opt-{self.handoff.name}-{self.option.name}".replace("_", "-")


def page_options() -> list[PageOption]:
    return [PageOption(h, o) for h in registry.all_handoffs() for o in h.options if o.on_page]


def option_values(specs: list[PageOption], values: list) -> dict[str, dict]:
    """The flat widget values back into {handoff: {option: value}}."""
    out: dict[str, dict] = {}
    position = 0
    for spec in specs:
        if spec.option.auto:
            auto, value = values[position], values[position + 1]
            value = None if auto else value
        else:
            value = values[position]
        position += spec.inputs
        out.setdefault(spec.handoff.name, {})[spec.option.name] = value
    return out


def run_parameter_names(specs: list[PageOption]) -> list[str]:
    """The ``/run`` endpoint's parameters, in order: pair, query, context, max new tokens, sample,
    temperature, seed, then every handoff's page options in registry order, each named by
    ``Option.page_name`` (an option with an "auto" setting takes two: the checkbox, then the
    value), then the handoffs to run."""
    names = ["pair", "query", "context", "max_new_tokens", "sample", "temperature", "seed"]
    for spec in specs:
        base = spec.option.page_name(spec.handoff.name)
        names += [f"{base}_auto", base] if spec.option.auto else [base]
    return names + ["handoffs"]


def build_request(query, context, max_new_tokens=32, sample=False, temperature=0.7, seed=0,
                  options: dict[str, dict] | None = None, inspect: dict | None = None):
    """The form's values as a request (a ValueError says what is wrong in plain words)."""
    return registry.build_request(query, context, max_new_tokens, sample, temperature, seed, options, inspect)


def record_crossed() -> bool:
    """Whether the page's runs record what crossed (``kvviz.runtime.crossed``): yes unless
    ``KVVIZ_RECORD_CROSSED=0`` (``scripts/bench_app.py --crossed both`` times a run each way)."""
    return os.environ.get("KVVIZ_RECORD_CROSSED", "1") != "0"


def expected_answers(text: str | None) -> list[str]:
    """The expected-answer box as gold answers: alternatives split by ";"."""
    return [part.strip() for part in str(text or "").split(EXPECTED_SEPARATOR) if part.strip()]


def expected_text(answers) -> str:
    return f"{EXPECTED_SEPARATOR} ".join(answers)


def swap_from_form(context: str | None, replace: str | None, by: str | None, swapped_answer: str | None) -> Swap:
    """The swapped note the page's swap fields ask for (every ``replace`` in the note becomes
    ``by``; it answers ``swapped_answer``, else ``by``), or a ValueError saying what is missing."""
    if not (context or "").strip():
        raise ValueError("Swap the fact changes the private context, and this question has none: type a note with "
                         "the fact in it first.")
    note = replace_fact(context, replace or "", by or "")
    answers = expected_answers(swapped_answer) or [str(by).strip()]
    return Swap(context=note, answers=tuple(answers), changed=f"{str(replace).strip()} -> {str(by).strip()}")


# --- the walk-through ---------------------------------------------------------------------------


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


# the question says what yes means; the reveal says what the stored run did
PREDICTION_CHOICES = {rule: ("Yes", "No") for rule in ("right", "beats_control", "follows_swap")}


def prediction_choices(prediction: Prediction) -> tuple[str, str]:
    return PREDICTION_CHOICES[prediction.rule]


def prediction_outcome(prediction: Prediction, payload: dict, answers) -> tuple[int | None, str]:
    """Which choice the results in ``payload`` make right (0 yes, 1 no; None when they cannot say:
    a column that did not run) and the sentence that says what they show."""
    results = {r.get("handoff"): r for r in (payload or {}).get("results", [])}
    column = results.get(prediction.column)
    label = registry.label_of(prediction.column)
    if column is None or not column.get("applicable", True):
        return None, f"{label} did not run in these results, so they cannot say."
    said = f"{label} answered *{html.escape(str(column.get('answer', '')).strip())}* ({mark_of(column, answers)})"
    if prediction.rule == "right":
        return (0 if mark_of(column, answers) == "right" else 1), said + "."
    if prediction.rule == "beats_control":
        control = results.get(prediction.control)
        if control is None or not control.get("applicable", True):
            return None, f"{registry.label_of(prediction.control)} did not run in these results, so they cannot say."
        beats = mark_of(column, answers) == "right" and mark_of(control, answers) != "right"
        return (0 if beats else 1), (f"{said}; {registry.label_of(prediction.control)} answered "
                                      f"*{html.escape(str(control.get('answer', '')).strip())}* ({mark_of(control, answers)}).")
    swap = column.get("swap") or {}
    if not swap.get("applicable", False):
        return None, f"{label} has no answer on a swapped note in these results, so they cannot say."
    followed = swap.get("outcome") == "followed"
    changed = html.escape(str(swap.get("changed", "")).replace(" -> ", " swapped for "))
    return (0 if followed else 1), (f"{said}; on the note with {changed} it answered "
                                    f"*{html.escape(str(swap.get('answer', '')).strip())}* "
                                    f"({'followed' if followed else 'did not follow'}).")


def prediction_veil_css(prediction: Prediction | None) -> str:
    """The CSS that hides what would give a prediction away until the learner picks: the column's
    (and its control's) answer, mark, stats, swap and what-if rows, every swap row, the verdict
    strip and the lesson. Empty when there is nothing to hide."""
    if prediction is None:
        return ""
    hidden = ["#kv-verdict", "#kv-lesson-row", ".kv-swap-row"]
    for name in filter(None, (prediction.column, prediction.control)):
        hidden += [f"#kv-answer-{name}", f"#kv-mark-{name}", f"#kv-stats-{name}", f"#kv-whatif-{name}"]
    return f"<style>{', '.join(hidden)} {{filter: blur(7px); pointer-events: none; user-select: none}}</style>"


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
        predict = Prediction(prediction_question(predict, key), predict.column, predict.rule, predict.control)
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


# --- permalinks ------------------------------------------------------------------------------------

# The page's state in a URL's query string: the form's fields by these names, each handoff option as
# "o.HANDOFF.OPTION" (and "o.HANDOFF.OPTION.auto" for its "auto" checkbox). A preset's key names its
# question and precomputed results; "q" and "c" are there only when they differ from the preset's.
LINK_FIELDS = ("pair", "preset", "q", "c", "h", "expected", "max_new_tokens", "sample", "temperature", "seed", "tab",
               "column")


def option_link_names(specs: list[PageOption]) -> list[str]:
    """The link names of the option widgets, in ``Page.option_inputs`` order."""
    names = []
    for option in specs:
        base = f"o.{option.handoff.name}.{option.option.name}"
        names += [f"{base}.auto", base] if option.option.auto else [base]
    return names


def link_text(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def permalink_query(specs: list[PageOption], state: dict) -> str:
    """``state`` (the fields by link name, option values under "options" in widget order) as a
    query string, without the fields a preset already gives."""
    picked = preset(state["preset"]) if state.get("preset") else None
    fields = {name: state.get(name) for name in LINK_FIELDS}
    if picked is not None and (fields.get("q") or "") == picked.query and (fields.get("c") or "") == (picked.context or ""):
        fields.pop("q"), fields.pop("c")
    if picked is not None and fields.get("expected") == expected_text(picked.answers):
        fields.pop("expected")
    fields["h"] = ",".join(state.get("h") or [])
    fields.update(zip(option_link_names(specs), state.get("options") or []))
    return urlencode({name: link_text(value) for name, value in fields.items() if value is not None})


def permalink_state(specs: list[PageOption], params: dict) -> dict:
    """A URL's query parameters back into page values: ``{field: value}`` for the fields given
    (types as the widgets take them; unknown or malformed values are left out), option values as
    ``{"options": {index: value}}``. A ValueError never escapes: a bad link opens the page as usual."""
    out: dict = {}
    for name in ("pair", "q", "c", "expected", "tab", "column"):
        if params.get(name) is not None:
            out[name] = str(params[name])
    if params.get("preset"):
        try:
            out["preset"] = preset(str(params["preset"])).key
        except (KeyError, ValueError):
            pass
    if params.get("h") is not None:
        out["h"] = [name for name in str(params["h"]).split(",") if name in column_names()]
    for name, kind in (("max_new_tokens", int), ("temperature", float), ("seed", int)):
        try:
            out[name] = kind(float(params[name])) if kind is int else kind(params[name])
        except (KeyError, TypeError, ValueError):
            pass
    if params.get("sample") is not None:
        out["sample"] = str(params["sample"]) in ("1", "true", "True")
    options = {}
    for index, (name, option) in enumerate(zip(option_link_names(specs), _widget_options(specs))):
        if name not in params:
            continue
        text = str(params[name])
        try:
            if name.endswith(".auto"):
                options[index] = text in ("1", "true", "True")
            elif option.kind == "int":
                options[index] = int(float(text))
            elif option.kind == "float":
                options[index] = float(text)
            else:
                options[index] = text
        except ValueError:
            continue
    if options:
        out["options"] = options
    return out


def _widget_options(specs: list[PageOption]) -> list[Option]:
    """The option behind each widget, in ``Page.option_inputs`` order."""
    return [option.option for option in specs for _ in range(option.inputs)]
