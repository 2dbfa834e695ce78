"""What the page shows, read from the registry and the presets: its columns, tabs and figures, the
handoffs' options as widgets, the ``/run`` endpoint's parameters, and the walk-through. No Gradio:
the page is built from these (``kvviz.page.layout``) and tests read them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvviz.handoffs import registry
from kvviz.handoffs.registry import Handoff, Option
from kvviz.plots import layer_figure_handoffs
from kvviz.presets import DEFAULT_PRESET, Preset, preset

MODEL_QUEUE = "models"
MAX_UI_NEW_TOKENS = 256  # the slider's end (the server's cap, kvviz.limits, may be lower)
STREAM_INTERVAL = 0.12  # seconds between streamed updates of one answer
FIXED_PLOTS = ("latency", "bytes")
RUN_LABEL = "Run live"
BUSY_LABEL = "Running…"
EXPECTED_SEPARATOR = ";"

# The tabs below the answers, in order: (id, title). A figure lives in exactly one tab.
TABS = (
    ("layers", "Layers"),
    ("cost", "Time and bytes"),
    ("seen", "What each model saw"),
    ("sweep", "Sweep"),
    ("how", "How it works"),
    ("data", "Data"),
)
DEFAULT_TAB = "layers"


# --- columns and figures ------------------------------------------------------------------------


def column_names() -> list[str]:
    """The page's columns, in order (every page handoff; the default ones are shown at first)."""
    return [handoff.name for handoff in registry.page_handoffs()]


def default_columns() -> list[str]:
    return registry.default_handoffs()


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
    return []


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
                  options: dict[str, dict] | None = None):
    """The form's values as a request (a ValueError says what is wrong in plain words)."""
    return registry.build_request(query, context, max_new_tokens, sample, temperature, seed, options)


def expected_answers(text: str | None) -> list[str]:
    """The expected-answer box as gold answers: alternatives split by ";"."""
    return [part.strip() for part in str(text or "").split(EXPECTED_SEPARATOR) if part.strip()]


def expected_text(answers) -> str:
    return f"{EXPECTED_SEPARATOR} ".join(answers)


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


def handoff_step(handoff: Handoff) -> WalkStep:
    """A handoff's own step, from its descriptor: its text with the loaded preset's title and lesson,
    and what it points at (its figure in the Layers tab, its column, or the cost plots)."""
    key = DEFAULT_PRESET if handoff.walkthrough_preset == registry.OPENING_PRESET else handoff.walkthrough_preset
    text = handoff.walkthrough
    if key:
        text = text.replace("{preset}", preset(key).title).replace("{lesson}", preset(key).lesson)
    if handoff.walkthrough_shows == "cost":
        return WalkStep(handoff.title, text, key, "cost", "kv-plot-latency")
    if handoff.figure is not None:
        return WalkStep(handoff.title, text, key, "layers", f"kv-plot-{handoff.name}")
    return WalkStep(handoff.title, text, key, None, f"kv-col-{handoff.name}")


def walkthrough_steps() -> list[WalkStep]:
    """An opening, one step per handoff shown at first that tells its part, what it costs, and
    your turn; each title numbered "Step i of n: ..."."""
    first = preset(DEFAULT_PRESET)
    sweeps = registry.with_sweep()
    steps = [
        WalkStep(
            "The puzzle",
            f"We loaded the preset **{first.title}**. A *sharer* model has read a note: *{first.context}* A "
            f"*receiver* model gets only the question *{first.query}* The receiver must answer, so the note has "
            "to travel from one model to the other somehow. Each coloured card is one way to make that trip; "
            "its mark says whether the answer holds the expected one.",
            DEFAULT_PRESET, None, "kv-answers",
        ),
        *[handoff_step(h) for h in registry.page_handoffs() if h.page_default and h.walkthrough],
        WalkStep(
            "What it costs",
            "In **Time and bytes**, *What crosses between the models* compares sizes on a log scale: a text "
            "message is a few dozen bytes, a KV cache hundreds of kilobytes. Text is small but slow to write; KV "
            "is big but needs no writing. Nothing here crosses a network: the bytes are counted and KVComm's "
            "transfer is a copy in memory, so which is better on a real link is not measured here. *First token* "
            "is timed from the question to the receiver's first answer token, the sender's work included; "
            "*receiver side* leaves that work out.",
            None, "cost", "kv-plot-bytes",
        ),
        WalkStep(
            "Your turn",
            "Press **Run live** to run the ticked handoffs on this machine. Tick more handoffs in the row under "
            "the question, open *Settings* (the panel on the left), change a handoff's options, and run again."
            + (f" Finally, in the **Sweep** tab, press **Run sweep** (*{sweeps[0].sweep.title}*)." if sweeps else ""),
            None, None, "kv-run",
        ),
    ]
    count = len(steps)
    return [WalkStep(f"Step {i + 1} of {count}: {step.title}", step.text, step.preset, step.tab, step.target)
            for i, step in enumerate(steps)]
