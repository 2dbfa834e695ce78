"""The page's components by name (``Page``) and the functions that build them, top to bottom.

First screen at 1280x800: a top bar (title, preset, walk-through), one ask row (question, context,
expected answer, Run and Stop), the columns to run, the status line, the verdict strip (sticky),
one card per ticked column (title, mark, answer, one line of numbers), the lesson, then the tabs
(Layers first). Settings and the pair's facts sit in a sidebar. Every builder takes the ``Page``
and the initial values by role (``kvviz.app.page.views``) and stores what it made on the page.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from kvviz.app import present
from kvviz.app.methods import registry as methods
from kvviz.app.page import spec
from kvviz.app.page.spec import PageOption
from kvviz.app.presets import PRESETS, SWEEP_ITEMS
from kvviz.core import limits, policy
from kvviz.core.plotkit import ink
from kvviz.handoffs import registry
from kvviz.runtime.models import PAIRS


@dataclass
class Card:
    block: Any  # the card's column (shown when ticked)
    head: Any  # title and mark (HTML)
    answer: Any  # kv-answer-NAME: a read-only textbox, so that streaming is a cheap text update
    stats: Any  # the card's one line


@dataclass
class Details:
    block: Any  # its section in "What each model saw"
    notes: Any
    seen: Any


@dataclass
class Page:
    """Every component the page's events read or write, by name."""

    initial: dict  # initial values by role
    specs: list[PageOption]
    demo: Any = None
    components: dict[str, Any] = field(default_factory=dict)  # role -> component
    cards: dict[str, Card] = field(default_factory=dict)
    details: dict[str, Details] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    tabs: dict[str, Any] = field(default_factory=dict)
    option_inputs: list = field(default_factory=list)

    def __getitem__(self, role: str):
        return self.components[role]

    def add(self, role: str, component):
        self.components[role] = component
        return component

    def value(self, role: str, default=None):
        return self.initial.get(role, default)

    @property
    def settings_inputs(self) -> list:
        return [self["max_new_tokens"], self["sample"], self["temperature"], self["seed"], *self.option_inputs]

    def outputs(self) -> list:
        """Every component an event of the page may update (a handler names the ones it changes)."""
        blocks = [c for card in self.cards.values() for c in (card.block, card.head, card.answer, card.stats)]
        blocks += [c for d in self.details.values() for c in (d.block, d.notes, d.seen)]
        return list(self.components.values()) + blocks + list(self.figures.values())

    def resolve(self, updates: dict) -> dict:
        """``{role: value}`` to ``{component: value}``. Special roles: ``shown`` (the ticked columns:
        their cards, details and figures visible, the others hidden), ``lesson`` (hidden when
        empty), ``run_button`` (True: busy), ``tab`` (select that tab), ``tokens_column`` (the token
        view's picker: choices and value), ``option:I`` (the I-th option widget)."""
        out = {}
        for role, value in updates.items():
            if role == "shown":
                continue  # last: a figure may be drawn and shown in one update
            elif role == "lesson":
                out[self["lesson"]] = value
                out[self["lesson_row"]] = gr.update(visible=bool(value))
            elif role == "run_button":
                out[self["run_button"]] = gr.update(value=spec.BUSY_LABEL if value else spec.RUN_LABEL, interactive=not value)
            elif role.startswith("option:"):
                out[self.option_inputs[int(role.split(":", 1)[1])]] = value
            elif role == "tokens_column":
                out[self["tokens_column"]] = gr.update(choices=value["choices"], value=value["value"])
            elif role == "tab":
                out[self["tabs"]] = gr.Tabs(selected=value)
            elif role in self.components:
                out[self.components[role]] = value
            elif role.startswith("figure:"):
                out[self.figures[role.split(":", 1)[1]]] = value
            elif ":" in role:
                kind, name = role.split(":", 1)
                part = self.cards[name] if kind in ("head", "answer", "stats") else self.details[name]
                out[getattr(part, kind)] = value
        if "shown" in updates:
            for component, visible in self._visibility(updates["shown"]).items():
                drawn = out.get(component)
                out[component] = gr.update(visible=visible) if drawn is None else gr.update(value=drawn, visible=visible)
        return out

    def _visibility(self, names) -> dict:
        """Component -> whether it shows, for the ticked columns ``names``."""
        shown = set(names or [])
        out = {}
        for name, card in self.cards.items():
            out[card.block] = out[self.details[name].block] = name in shown
        for name in spec.layer_figure_names():
            out[self.figures[name]] = name in shown
        return out


# --- the builders -------------------------------------------------------------------------------


def build_sidebar(page: Page, default_pair: str, default_max_new_tokens: int) -> None:
    """Settings and the pair, folded away in a sidebar."""
    public, setting = policy.public_mode(), limits.settings()
    with gr.Sidebar(label="Settings and pair", open=False, elem_id="kv-settings"):
        gr.Markdown("### Settings")
        top = min(spec.MAX_UI_NEW_TOKENS, int(setting["max_new_tokens"].maximum))
        page.add("max_new_tokens", server_checked_slider(1, top, value=min(top, int(default_max_new_tokens)), step=1,
                                                         label="Max new tokens (answer length bound)"))
        page.add("sample", gr.Checkbox(value=False, label="Sample instead of greedy decoding"))
        page.add("temperature", server_checked_slider(setting["temperature"].minimum, setting["temperature"].maximum,
                                                      value=0.7, step=0.05, label="Temperature (when sampling)"))
        page.add("seed", gr.Number(value=0, precision=0, label="Seed (sampling and random choices)"))
        for handoff in registry.all_handoffs():
            own = [option for option in page.specs if option.handoff.name == handoff.name]
            if own:
                gr.Markdown(f"**{handoff.title}**")
                for option in own:
                    page.option_inputs += option_widgets(option)
        gr.Markdown("### The pair")
        page.add("pair", gr.Dropdown(
            choices=list(PAIRS), value=default_pair, label="Model pair (sharer -> receiver)", allow_custom_value=not public,
            info="A registered pair." if public else "A registered pair, or SHARER+RECEIVER with any two model names.",
            elem_id="kv-pair"))
        page.add("facts", gr.Markdown(present.pair_facts_markdown(default_pair), elem_id="kv-facts"))


def build_top(page: Page) -> None:
    with gr.Row(elem_id="kv-top"):
        gr.Markdown("# kvviz: watch two language models talk", elem_id="kv-title")
        page.add("presets", gr.Dropdown(
            choices=[(p.label, p.key) for p in PRESETS], value=page.value("presets"), label="Preset",
            show_label=False, container=False, scale=0, min_width=280, elem_id="kv-presets"))
        page.add("walk_open", gr.Button("Walk-through", size="sm", scale=0, min_width=120, elem_id="kv-walkthrough"))
        page.add("copy_link", gr.Button("Copy link", size="sm", scale=0, min_width=100, elem_id="kv-copy-link"))
        page.add("link", gr.Textbox("", visible=False, elem_id="kv-link"))  # the page's state as a query string
        page.add("save_run", gr.Button("Save run", size="sm", scale=0, min_width=100, elem_id="kv-save-run"))
        page.add("saved_link", gr.Textbox("", visible=False, elem_id="kv-saved-link"))  # /r/<id> of the saved run


def build_walk(page: Page, steps: list[spec.WalkStep]) -> None:
    """The walk-through strip (closed at first): the step's text, Back, Next, Close."""
    with gr.Column(visible=False, elem_id="kv-walk") as strip:
        page.add("walk", strip)
        page.add("walk_text", gr.Markdown(walk_markdown(steps, 0), elem_id="kv-walk-text"))
        # a predict-then-reveal step: the learner picks before the answers show (the veil hides them)
        page.add("walk_guess", gr.Radio(choices=[], value=None, label="Your prediction", visible=False,
                                        elem_id="kv-walk-guess"))
        page.add("walk_reveal", gr.Markdown("", elem_id="kv-walk-reveal"))
        page.add("walk_veil", gr.HTML("", elem_id="kv-walk-veil"))
        with gr.Row(elem_id="kv-walk-buttons"):
            page.add("walk_back", gr.Button("Back", size="sm", scale=0, min_width=90, elem_id="kv-walk-back"))
            page.add("walk_next", gr.Button("Next step", size="sm", variant="primary", scale=0, min_width=110,
                                            elem_id="kv-walk-next"))
            page.add("walk_close", gr.Button("Close", size="sm", scale=0, min_width=90, elem_id="kv-walk-close"))


def walk_markdown(steps: list[spec.WalkStep], index: int) -> str:
    step = steps[index]
    return f"**{step.title}.** {step.text}"


def build_ask(page: Page) -> None:
    """The setup in one sentence; question, context, Run and Stop on one row (stacked on a phone)."""
    # the chips' headings and hover texts, the inert closed sidebar and the plots' names: PAGE_JS
    gr.HTML(spec.setup_html(), elem_id="kv-setup", js_on_load=PAGE_JS.replace("DECORATIONS",
                                                                            json.dumps(spec.chip_decorations())))
    with gr.Row(elem_id="kv-ask", equal_height=False):
        page.add("query", gr.Textbox(value=page.value("query"), label="Question (both models read it)", lines=2, max_lines=6,
                                     scale=3, elem_id="kv-query"))
        page.add("context", gr.Textbox(
            value=page.value("context"), label="Private note (the receiver never sees it)",
            placeholder="empty: a shared question, both models read only it", lines=2, max_lines=8, scale=4, elem_id="kv-context"))
        with gr.Column(scale=0, min_width=150, elem_id="kv-runbox"):
            page.add("run_button", gr.Button(spec.RUN_LABEL, variant="primary", elem_id="kv-run"))
            page.add("stop_button", gr.Button("Stop", variant="stop", size="sm", elem_id="kv-stop"))
            # the /run API's trigger: the same run for scripts, with today's inputs and outputs
            page.add("run_api", gr.Button("run", visible=False, elem_id="kv-run-api"))
            # /run's last parameter: whether its JSON holds the per-token attention arrays (~2 MB a run)
            page.add("api_attention", gr.Checkbox(False, visible=False, label="attention"))


# What the page does in the browser that Gradio's components do not: the column chips get a heading
# before each group's first chip and a hover text each (a CheckboxGroup has no per-choice title),
# again whenever Gradio redraws them; the closed Settings sidebar is inert (its controls, drawn off
# screen, leave the Tab order: Run is a few presses from the top); every plot gets an accessible
# name, its title.
PAGE_JS = """
(() => {  // its own scope: Gradio's js_on_load already names some of its variables
const decorations = DECORATIONS;
const decorate = () => {
  const box = document.querySelector('#kv-handoffs');
  if (!box) return;
  box.querySelectorAll('label').forEach((label) => {
    const found = decorations[label.textContent.trim()];
    if (!found) return;
    label.title = found.hint;
    label.dataset.kvGroup = found.group;
    const before = label.previousElementSibling;
    if (found.heading && !(before && before.classList.contains('kv-chip-group'))) {
      const heading = document.createElement('span');
      heading.className = 'kv-chip-group';
      heading.textContent = found.heading;
      heading.title = found.why;
      label.before(heading);
    }
  });
};
const opts = {childList: true, subtree: true};
const observer = new MutationObserver(() => { observer.disconnect(); decorate(); watchChips(); });
const watchChips = () => { const box = document.querySelector('#kv-handoffs'); if (box) observer.observe(box, opts); };
const start = (tries) => {  // the chips mount after this component: wait for them
  if (!document.querySelector('#kv-handoffs label')) { if (tries > 0) setTimeout(() => start(tries - 1), 100); return; }
  decorate(); watchChips();
};
start(100);
const sidebarInert = () => {
  const sidebar = document.querySelector('#kv-settings');
  const content = sidebar && sidebar.querySelector('.sidebar-content');
  if (content) content.inert = !sidebar.classList.contains('open');
};
const namePlots = () => document.querySelectorAll('[id^=kv-plot-]').forEach((plot) => {
  const title = plot.querySelector('.gtitle');
  const name = title ? title.textContent.trim() : '';
  if (name && plot.getAttribute('aria-label') !== name) { plot.setAttribute('role', 'img'); plot.setAttribute('aria-label', name); }
});
const keep = () => { sidebarInert(); namePlots(); };
keep();
setInterval(keep, 500);  // cheap: a class check and a few title reads
})();
"""


def build_columns(page: Page, shown: list[str]) -> None:
    """The columns to run and the expected answer that marks them (below the cards on a phone)."""
    with gr.Row(elem_id="kv-columns", equal_height=True):
        page.add("chosen", gr.CheckboxGroup(
            choices=[(registry.get(name).label, name) for name in spec.grouped_columns()], value=shown,
            label="Columns (Run live runs the ticked ones)", show_label=False, scale=5, elem_id="kv-handoffs"))
        page.add("expected", gr.Textbox(
            value=page.value("expected"), label="Expected answer", placeholder="e.g. United Kingdom; UK (either counts)",
            lines=1, max_lines=2, scale=1, min_width=190, elem_id="kv-expected"))


def build_cards(page: Page, shown: list[str]) -> None:
    """The status line, the verdict strip, one card per column and the lesson."""
    page.add("status", gr.Markdown(page.value("status"), elem_id="kv-status"))
    page.add("verdict", gr.HTML(page.value("verdict"), elem_id="kv-verdict", js_on_load=None))
    with gr.Row(elem_id="kv-answers", equal_height=True):
        for name in spec.column_names():
            with gr.Column(min_width=150, visible=name in shown, elem_id=f"kv-col-{name}", elem_classes=["kv-card"]) as block:
                head = gr.HTML(page.value(f"head:{name}"), elem_id=f"kv-head-{name}", js_on_load=None)
                answer = gr.Textbox(value=page.value(f"answer:{name}"), show_label=False, lines=2, max_lines=5,
                                    interactive=False, container=False, elem_id=f"kv-answer-{name}")
                stats = gr.Markdown(page.value(f"stats:{name}"), elem_id=f"kv-stats-{name}", elem_classes=["kv-card-stats"])
            page.cards[name] = Card(block, head, answer, stats)
    build_swap(page)
    with gr.Row(elem_id="kv-lesson-row", visible=bool(page.value("lesson"))) as lesson_row:
        page.add("lesson_row", lesson_row)
        page.add("lesson", gr.Markdown(page.value("lesson"), elem_id="kv-lesson"))
        page.add("lesson_show", gr.Button("Show me", size="sm", scale=0, min_width=100, elem_id="kv-lesson-show"))


def build_swap(page: Page) -> None:
    """Swap the fact: a word of the note, what it becomes and what the note then answers; the button
    shows each card's answer on the swapped note (a preset's stored one, else run live)."""
    with gr.Row(elem_id="kv-swap", equal_height=True):  # one line: "in the note, replace [ ] by [ ], then ..."
        fields = (("swap_replace", "In the note, replace", "a word of the note"), ("swap_by", "by", "other words"),
                  ("swap_answer", "then the answer is", "empty: the new words"))
        for role, label, hint in fields:
            gr.Markdown(label, elem_classes=["kv-swap-label"])
            page.add(role, gr.Textbox(value=page.value(role, ""), label=label, show_label=False, placeholder=hint, lines=1,
                                      max_lines=1, scale=2, min_width=110, container=False,
                                      elem_id=f"kv-{role.replace('_', '-')}"))
        page.add("swap_button", gr.Button("Swap the fact", size="sm", scale=0, min_width=130, elem_id="kv-swap-button"))


def build_tabs(page: Page, shown: list[str], sweep: dict | None) -> None:
    """The tabs below the cards; a tab's children render when it is first opened."""
    with gr.Tabs(selected=spec.DEFAULT_TAB, overflow_behavior="wrap", elem_id="kv-inside") as tabs:
        page.add("tabs", tabs)
        with tab(page, "layers"), gr.Row(elem_id="kv-layer-plots"):  # two a row on a laptop, one on a phone
            for name in spec.layer_figure_names():
                page.figures[name] = gr.Plot(page.value(f"figure:{name}"), show_label=False, visible=name in shown,
                                             min_width=520, elem_id=f"kv-plot-{name}")
        with tab(page, "tokens"):
            page.add("tokens_column", gr.Dropdown(choices=[], value=None, label="Column shown", scale=0, min_width=240,
                                                  elem_id="kv-tokens-column"))
            page.add("tokens", gr.HTML("", elem_id="kv-tokens", js_on_load=None))
        with tab(page, "lens"):
            page.figures[spec.LENS_PLOT] = gr.Plot(page.value(f"figure:{spec.LENS_PLOT}"), show_label=False,
                                                   elem_id=f"kv-plot-{spec.LENS_PLOT}")
        with tab(page, "compare"):
            build_compare(page)
        with tab(page, "cost"):
            with gr.Row():
                for name in spec.FIXED_PLOTS:
                    page.figures[name] = gr.Plot(page.value(f"figure:{name}"), show_label=False, elem_id=f"kv-plot-{name}",
                                                 min_width=320)
        with tab(page, "seen"):
            build_details(page, shown)
        with tab(page, "sweep"):
            build_sweep(page, sweep)
        with tab(page, "how"):
            build_how(page)
        with tab(page, "data"):
            page.add("export_button", gr.Button("Export: results (JSON, CSV) and attention (JSON, large)", elem_id="kv-export", size="sm"))
            page.add("export_files", gr.File(label="Downloads", file_count="multiple", interactive=False))
            page.add("table", gr.Dataframe(None, label="One row per handoff", interactive=False, elem_id="kv-results-table"))
            # closed until asked for: drawing the JSON tree (~135 KB for a preset) took the browser 1.5 s
            # of the tab's 2.2 s (measured before: scripts/page_audit.py --data-tab); it is filled when it opens
            with page.add("json_box", gr.Accordion("Structured results (what the run endpoint returns)", open=False,
                                                   elem_id="kv-json-box")):
                page.add("json", gr.JSON(None, show_label=False, elem_id="kv-json"))


def tab(page: Page, tab_id: str):
    title = dict(spec.TABS)[tab_id]
    page.tabs[tab_id] = gr.Tab(title, id=tab_id, elem_id=f"kv-tab-{tab_id}")
    return page.tabs[tab_id]


def build_compare(page: Page) -> None:
    """Two columns of this session's runs side by side (``kvviz.app.compare``): pickers, two shortcuts,
    the diff and its per-layer figure."""
    gr.Markdown("Pick any two columns of this session's last runs (presets and live runs, newest first). "
                "**A's control** puts beside A the column it is measured against in the same run (C2C against its "
                "control fuser, KVComm against KVComm with another context, text against the receiver alone); "
                "**the run before** puts A's column from the previous run (change a setting, run again, compare); "
                "**the swapped note** puts A's answer once the note's fact was changed (*Swap the fact*).",
                elem_id="kv-compare-intro")
    with gr.Row(equal_height=True):
        page.add("compare_a", gr.Dropdown(choices=[], value=None, label="A", scale=3, elem_id="kv-compare-a"))
        page.add("compare_b", gr.Dropdown(choices=[], value=None, label="B", scale=3, elem_id="kv-compare-b"))
        with gr.Column(scale=1, min_width=170):
            page.add("compare_control", gr.Button("B = A's control", size="sm", elem_id="kv-compare-control"))
            page.add("compare_previous", gr.Button("B = A in the run before", size="sm", elem_id="kv-compare-previous"))
            page.add("compare_swapped", gr.Button("B = A with the swapped note", size="sm", elem_id="kv-compare-swapped"))
    page.add("compare_html", gr.HTML(page.value("compare_html", ""), elem_id="kv-compare", js_on_load=None))
    page.add("compare_plot", gr.Plot(None, show_label=False, elem_id="kv-plot-compare"))


def build_details(page: Page, shown: list[str]) -> None:
    """What each model saw, per column: its numbers and notes, then every prompt and message."""
    for name in spec.column_names():
        handoff = registry.get(name)
        with gr.Column(visible=name in shown, elem_id=f"kv-details-{name}") as block:
            gr.HTML(f'<div class="kv-details-title" style="--kv-hue:{handoff.color};--kv-ink:{ink(handoff.color)}">'
                    f"{html.escape(handoff.title)}</div>", js_on_load=None)
            notes = gr.Markdown(page.value(f"notes:{name}"), elem_id=f"kv-notes-{name}")
            seen = gr.Textbox(value=page.value(f"seen:{name}"), show_label=False, lines=5, max_lines=20, interactive=False,
                              elem_id=f"kv-seen-{name}")
        page.details[name] = Details(block, notes, seen)


def build_sweep(page: Page, sweep: dict | None) -> None:
    swept = methods.with_sweep()[0] if methods.with_sweep() else None
    if swept is None:
        gr.Markdown("No handoff declares a sweep.")
        return
    experiment = swept.sweep
    gr.Markdown(f"**{experiment.title}** {experiment.explanation} {len(SWEEP_ITEMS)} questions; {experiment.x_option} "
                f"{', '.join(f'{x:g}' for x in experiment.x_values)}. It takes a while on a CPU; the progress bar tracks it.")
    with gr.Row():
        page.add("sweep_series", gr.CheckboxGroup(choices=list(experiment.series_values), value=list(experiment.series_default),
                                                  label=swept.handoff.option(experiment.series_option).label, scale=3))
        page.add("sweep_tokens", gr.Slider(2, 32, value=12, step=1, label="Max new tokens per answer", scale=2))
        page.add("sweep_button", gr.Button("Run sweep", elem_id="kv-sweep", scale=1))
    page.add("sweep_status", gr.Markdown(
        '<span class="kv-badge">precomputed</span> Sweep computed ahead of time; press **Run sweep** to redo it live.'
        if sweep else "No sweep yet.", elem_id="kv-sweep-status"))
    page.add("sweep_plot", gr.Plot(None, show_label=False, elem_id="kv-plot-sweep"))  # drawn when the tab opens
    page.add("sweep_json", gr.JSON(None, label="Sweep data", visible=False))  # a live sweep's data


def build_how(page: Page) -> None:
    """Every handoff's explanation and diagram in one block, filled when the tab is first opened
    (``views.tab_updates``): most visits never open it, and it is most of the page's weight.
    Project text only (the descriptors and assets/diagrams), so its HTML is not sanitised."""
    page.add("how", gr.Markdown("", sanitize_html=False, elem_id="kv-how"))


# --- widgets ------------------------------------------------------------------------------------


def server_checked_slider(*args, **kwargs) -> gr.Slider:
    """A slider whose value the server checks with ``kvviz.core.limits``, so that an API call out of
    range hears which setting and what is allowed ("KVComm ratio r must be between 0 and 1, got
    1.5"), as the CLI does; Gradio's own check would not name the setting. (Not a subclass: Gradio
    writes a type stub beside the file of every component subclass.)"""
    slider = gr.Slider(*args, **kwargs)
    slider.preprocess = lambda payload: payload
    return slider


def option_widgets(option: PageOption) -> list:
    """The widgets of one option: [auto checkbox,] value."""
    setting = option.option
    widgets = []
    if setting.auto:
        widgets.append(gr.Checkbox(value=True, label=setting.auto, elem_id=f"{option.elem_id}-auto"))
    if setting.kind == "choice":
        widgets.append(gr.Dropdown(choices=list(setting.choices), value=setting.default, label=setting.label,
                                   elem_id=option.elem_id))
    elif setting.kind == "text":
        widgets.append(gr.Textbox(value=setting.default, label=setting.label, elem_id=option.elem_id))
    elif setting.kind in ("float", "int") and None not in setting.bounds():
        low, high = setting.bounds()
        if setting.kind == "int":  # a count: the slider ends where a page needs it to (the server's cap may be lower)
            high = min(spec.MAX_UI_NEW_TOKENS, int(high))
        widgets.append(server_checked_slider(low, high, value=min(setting.default, high),
                                             step=setting.step or (1 if setting.kind == "int" else 0.01),
                                             label=setting.label, elem_id=option.elem_id))
    else:
        widgets.append(gr.Number(value=setting.default, precision=0 if setting.kind == "int" else None,
                                 label=setting.label, elem_id=option.elem_id))
    return widgets
