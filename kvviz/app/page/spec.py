"""What the page shows, read from the registry and the presets: its columns (in the catalog's page
order, ``kvviz.app.reading.catalog``), tabs and figures, the handoffs' options as widgets, the
``/run`` endpoint's parameters, the expected answer, the swap and the contradiction fields. No Gradio: the page is
built from these (``kvviz.app.page.layout``) and tests read them directly. The walk-through's steps
are ``kvviz.app.page.steps``; the page's state in a link, ``kvviz.app.page.links``.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass

from kvviz.app.methods import registry as methods
from kvviz.app.plots import layer_figure_handoffs
from kvviz.app.present import GLOSSARY
from kvviz.app.presets import DEFAULT_PRESET, Preset  # noqa: F401 (the opening preset, for the page's modules)
from kvviz.app.reading import catalog
from kvviz.data.contradictions import Contradiction, typed_contradiction
from kvviz.data.swaps import Swap, replace_fact, sharer_swap
from kvviz.handoffs import registry
from kvviz.handoffs.registry import Handoff, Option
from kvviz.runtime.adapters import split_name
from kvviz.runtime.crossed import PARTS
from kvviz.runtime.pairs import resolve_pair

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
    return catalog.names()


def default_columns() -> list[str]:
    return catalog.defaults()


# The column chips in three groups (``catalog.GROUPS``), each with what its columns are for.
COLUMN_GROUPS = (
    ("baseline", "Baselines", "what the receiver answers with nothing sent, and with the note in its own prompt"),
    ("method", "Handoffs", "ways for the note to reach the receiver: a text message, a cache, vectors"),
    ("control", "Controls", "a handoff's own machinery with the note's content taken out: what it answers anyway"),
)


def column_group(name: str) -> str:
    """"control" for a column that is another's control (not the receiver alone), "baseline" for
    the receiver alone, Skyline and the sharer alone, else "method" (the catalog's group)."""
    return catalog.METHODS[name].group


def grouped_columns() -> list[str]:
    """The page's columns in chip order: baselines, handoffs, controls (page order within each)."""
    order = [group for group, _, _ in COLUMN_GROUPS]
    return sorted(column_names(), key=lambda name: order.index(column_group(name)))


# The first screen's one sentence: who read what and who must answer (its terms in the glossary, on
# hover). It follows the question asked: a note only the sharer reads, the same question to both, or a
# sharer that learned facts in training (an adapter: ``BASE@ADAPTER``) the receiver never saw.
HANDED_OVER = 'one way (text, a <abbr title="{kv}">KV cache</abbr>, vectors), beside its control.'
SETUP_SENTENCES = {
    "note": 'The <b>sharer</b> reads the private note; the <b>receiver</b> answers without it. Each column below '
            'hands the note over ' + HANDED_OVER,
    "question": 'Both models read the same question; the <b>sharer</b> answers from what it knows, the '
                '<b>receiver</b> from what each column below hands it over ' + HANDED_OVER,
    "studied": 'The <b>sharer</b> learned facts in training (its adapter: <i>{adapter}</i>) that the <b>receiver</b> '
               'never saw; both read the question. Each column below hands what the sharer knows over ' + HANDED_OVER,
}


def setup_kind(context: str | None, pair: str) -> tuple[str, str | None]:
    """Which setup sentence the question asks for, and the sharer's adapter where it has one."""
    if (context or "").strip():
        return "note", None
    try:
        _, adapter = split_name(resolve_pair(pair).sharer)
    except ValueError:  # a pair the page refuses when it runs: it says why then
        return "question", None
    return ("studied", adapter) if adapter else ("question", None)


def setup_html(context: str | None, pair: str) -> str:
    """The setup sentence for a question with ``context`` (any non-empty note) on ``pair``."""
    kind, adapter = setup_kind(context, pair)
    sentence = SETUP_SENTENCES[kind].format(kv=html.escape(GLOSSARY["KV cache"]), adapter=html.escape(adapter or ""))
    return f'<div class="kv-setup">{sentence}</div>'


def chip_decorations() -> dict:
    """Per chip label: its group's heading where a group starts, and its plain-language hover text."""
    out, seen = {}, set()
    headings = {group: (title, why) for group, title, why in COLUMN_GROUPS}
    for name in grouped_columns():
        group, method = column_group(name), catalog.METHODS[name]
        title, why = headings[group]
        out[method.label] = {"group": group, "hint": f"{method.title} — {method.summary}",
                              "heading": None if group in seen else title, "why": why}
        seen.add(group)
    return out


def preset_columns(picked: Preset) -> list[str]:
    """The columns a preset ticks: its own list, else the page's default ones, in page order."""
    return picked.columns


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
    """Whether the page's runs may record what crossed (``kvviz.runtime.crossed``): yes unless
    ``KVVIZ_RECORD_CROSSED=0`` (then no run records anything, and no tab records when it opens)."""
    return os.environ.get("KVVIZ_RECORD_CROSSED", "1") != "0"


# What each tab shows of what crossed (``kvviz.runtime.crossed.PARTS``): What crossed draws the attention
# rows and the scores against the controls (``kvviz.app.tokenview``), Depth the logit lens, Compare two
# all three (``kvviz.app.compare``); the other tabs, the cards and ``/run``'s stats read none. A live run
# records the parts of the tab in view; a tab opened on a live run without its parts records them then
# (``kvviz.app.page.recording``).
TAB_PARTS = {"tokens": ("attention", "scores"), "lens": ("lens",), "compare": PARTS}


def tab_parts(tab: str | None) -> tuple[str, ...]:
    """The parts of what crossed that ``tab`` shows (none for a tab that shows none)."""
    return TAB_PARTS.get(tab or "", ())


def recorded_parts(request: dict | None) -> frozenset:
    """The parts a run recorded, read from its request (``HandoffRequest.inspect``: None recorded
    nothing; an ``inspect`` that names no parts recorded every one)."""
    inspect = (request or {}).get("inspect")
    if inspect is None:
        return frozenset()
    return frozenset(inspect.get("parts") or PARTS)


def request_recording(request: dict, parts) -> dict:
    """A request (as a dict) that says its results hold ``parts`` (``recorded_parts`` reads it back)."""
    if not parts:
        return {**request, "inspect": None}
    return {**request, "inspect": {**(request.get("inspect") or {}), "parts": [part for part in PARTS if part in parts]}}


def inspect_for(gold: str | None, parts) -> dict | None:
    """A request's ``inspect`` that records ``parts`` (None: every part; empty: nothing at all, so
    None), the lens following the gold answer's first token; nothing when ``KVVIZ_RECORD_CROSSED=0``."""
    if not record_crossed() or (parts is not None and not parts):
        return None
    return {"gold": gold} if parts is None else {"gold": gold, "parts": [part for part in PARTS if part in parts]}


def expected_answers(text: str | None) -> list[str]:
    """The expected-answer box as gold answers: alternatives split by ";"."""
    return [part.strip() for part in str(text or "").split(EXPECTED_SEPARATOR) if part.strip()]


def expected_text(answers) -> str:
    return f"{EXPECTED_SEPARATOR} ".join(answers)


def swap_from_form(context: str | None, replace: str | None, by: str | None, swapped_answer: str | None,
                   pair: str | None = None) -> Swap:
    """The swap the page's swap fields ask for: the note with every ``replace`` changed to ``by`` (it
    answers ``swapped_answer``, else ``by``); on a question without a note, on a pair whose sharer has
    an opposite (``PairSpec.opposite``), the same question to that sharer, which answers
    ``swapped_answer``. Else a ValueError saying what is missing."""
    if not (context or "").strip():
        if not opposite_sharer(pair):
            raise ValueError("Swap the fact changes the private context, and this question has none: type a note "
                             "with the fact in it first.")
        answers = expected_answers(swapped_answer)
        if not answers:
            raise ValueError("This question has no note; on this pair the swap is the sharer that learned the opposite "
                             "facts: type what that sharer should answer in \"then the answer is\".")
        return sharer_swap(context, answers)
    note = replace_fact(context, replace or "", by or "")
    answers = expected_answers(swapped_answer) or [str(by).strip()]
    return Swap(context=note, answers=tuple(answers), changed=f"{str(replace).strip()} -> {str(by).strip()}")


def opposite_sharer(pair: str | None) -> str | None:
    """The registered pair whose sharer learned the opposite of ``pair``'s sharer, or None."""
    try:
        return resolve_pair(pair).opposite if pair else None
    except ValueError:
        return None


def contradiction_from_form(context: str | None, expected: str | None, sentence: str | None,
                            counter: str | None) -> Contradiction:
    """The contradicted note the page's contradiction fields ask for (``sentence`` inserted after the
    sentence that states the expected answer; it answers ``counter``, alternatives split by ";"),
    or a ValueError saying what is wrong (``kvviz.data.contradictions.typed_contradiction``)."""
    return typed_contradiction(context, sentence, expected_answers(expected), expected_answers(counter))
