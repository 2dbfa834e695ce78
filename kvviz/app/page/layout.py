"""The functions that build the page, top to bottom, each storing what it made on the ``Page``
(``kvviz.app.page.named``: the components by name).

First screen at 1280x800: a top bar (title, preset, walk-through), one ask row (question, context,
expected answer, Run and Stop), the columns to run, the status line, the verdict strip (sticky),
one card per ticked column (title, mark, answer, one line of numbers), the lesson, then the tabs
(Layers first). Settings and the pair's facts sit in a sidebar. Every builder takes the ``Page``
and the initial values by role (``kvviz.app.page.views``) and stores what it made on the page.
"""

from __future__ import annotations

import html
import json

import gradio as gr

from kvviz.app import present
from kvviz.app.methods import registry as methods
from kvviz.app.page import spec
from kvviz.app.page.named import Card, Details, Page
from kvviz.app.page.steps import WalkStep
from kvviz.app.page.widgets import PAGE_JS, option_widgets, server_checked_slider
from kvviz.app.presets import PRESETS, SWEEP_ITEMS
from kvviz.core import limits, policy
from kvviz.core.plotkit import ink
from kvviz.handoffs import registry
from kvviz.runtime.models import PAIRS


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
    """The title with the setup in one sentence under it, the preset, and the page's buttons."""
    with gr.Row(elem_id="kv-top"):
        with gr.Column(scale=1, min_width=320, elem_id="kv-heading"):
            gr.Markdown("# kvviz: watch two language models talk", elem_id="kv-title")
            # the chips' headings and hover texts, the inert closed sidebar, the plots' names and every
            # change of the question told to Gradio: PAGE_JS
            # the setup follows the question (``spec.setup_html``)
            page.add("setup", gr.HTML(page.value("setup"), elem_id="kv-setup",
                                      js_on_load=PAGE_JS.replace("DECORATIONS", json.dumps(spec.chip_decorations()))))
        page.add("presets", gr.Dropdown(
            choices=[(p.label, p.key) for p in PRESETS], value=page.value("presets"), label="Preset",
            show_label=False, container=False, scale=0, min_width=355, elem_id="kv-presets"))
        page.add("walk_open", gr.Button("Walk-through", size="sm", scale=0, min_width=105, elem_id="kv-walkthrough"))
        page.add("copy_link", gr.Button("Copy link", size="sm", scale=0, min_width=72, elem_id="kv-copy-link"))
        page.add("link", gr.Textbox("", visible=False, elem_id="kv-link"))  # the page's state as a query string
        page.add("save_run", gr.Button("Save run", size="sm", scale=0, min_width=72, elem_id="kv-save-run"))
        page.add("saved_link", gr.Textbox("", visible=False, elem_id="kv-saved-link"))  # /r/<id> of the saved run


def build_walk(page: Page, steps: list[WalkStep]) -> None:
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


def walk_markdown(steps: list[WalkStep], index: int) -> str:
    step = steps[index]
    return f"**{step.title}.** {step.text}"


def build_ask(page: Page) -> None:
    """Question, context, expected answer, Run and Stop on one row (stacked on a phone)."""
    with gr.Row(elem_id="kv-ask", equal_height=False):
        page.add("query", gr.Textbox(value=page.value("query"), label="Question (both models read it)", lines=1, max_lines=6,
                                     scale=3, elem_id="kv-query"))
        page.add("context", gr.Textbox(
            value=page.value("context"), label="Private note (the receiver never sees it)",
            placeholder="empty: a shared question, both models read only it", lines=1, max_lines=8, scale=4, elem_id="kv-context"))
        # the answer that marks every column: the question's own, so it goes (or comes back) with it
        page.add("expected", gr.Textbox(
            value=page.value("expected"), label="Expected answer", placeholder="e.g. United Kingdom; UK (either counts)",
            lines=1, max_lines=3, scale=2, min_width=150, elem_id="kv-expected"))
        with gr.Column(scale=0, min_width=150, elem_id="kv-runbox"):
            page.add("run_button", gr.Button(spec.RUN_LABEL, variant="primary", elem_id="kv-run"))
            page.add("stop_button", gr.Button("Stop", variant="stop", size="sm", elem_id="kv-stop"))
            # the /run API's trigger: the same run for scripts, with today's inputs and outputs
            page.add("run_api", gr.Button("run", visible=False, elem_id="kv-run-api"))
            # /run's last parameter: whether its JSON holds the per-token attention arrays (~2 MB a run)
            page.add("api_attention", gr.Checkbox(False, visible=False, label="attention"))


def build_columns(page: Page, shown: list[str]) -> None:
    """The columns to run, in their three groups (below the cards on a phone)."""
    with gr.Row(elem_id="kv-columns", equal_height=True):
        page.add("chosen", gr.CheckboxGroup(
            choices=[(registry.get(name).label, name) for name in spec.grouped_columns()], value=shown,
            label="Columns (Run live runs the ticked ones)", show_label=False, scale=5, elem_id="kv-handoffs"))


def build_cards(page: Page, shown: list[str]) -> None:
    """The status line, the verdict strip, one card per column and the lesson."""
    page.add("status", gr.Markdown(page.value("status"), elem_id="kv-status"))
    page.add("verdict", gr.HTML(page.value("verdict"), elem_id="kv-verdict", js_on_load=None))
    with gr.Row(elem_id="kv-answers", equal_height=True):
        for name in spec.column_names():
            with gr.Column(min_width=150, visible=name in shown, elem_id=f"kv-col-{name}", elem_classes=["kv-card"]) as block:
                head = gr.HTML(page.value(f"head:{name}"), elem_id=f"kv-head-{name}", js_on_load=None)
                answer = gr.Textbox(value=page.value(f"answer:{name}"), show_label=False, lines=1, max_lines=5,
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
    shows each card's answer on the swapped note (a preset's stored one, else run live). Under it,
    Insert a contradiction: one sentence that states another value, inserted after the fact's, and
    what it answers; the button runs the ticked columns live on that note."""
    with gr.Row(elem_id="kv-swap", equal_height=True):  # one line: "in the note, replace [ ] by [ ], then ..."
        fields = (("swap_replace", "In the note, replace", "a word of the note"), ("swap_by", "by", "other words"),
                  ("swap_answer", "then the answer is", "empty: the new words"))
        for role, label, hint in fields:
            gr.Markdown(label, elem_classes=["kv-swap-label"])
            page.add(role, gr.Textbox(value=page.value(role, ""), label=label, show_label=False, placeholder=hint, lines=1,
                                      max_lines=1, scale=2, min_width=110, container=False,
                                      elem_id=f"kv-{role.replace('_', '-')}"))
        page.add("swap_button", gr.Button("Swap the fact", size="sm", scale=0, min_width=130, elem_id="kv-swap-button"))
    # the second counterfactual: the fact kept, one sentence after it stating another value
    with gr.Row(elem_id="kv-contra", equal_height=True):
        fields = (("contra_sentence", "Or, after the fact, insert", "one sentence stating another value", 5),
                  ("contra_answer", "which answers", "the other value", 2))
        for role, label, hint, scale in fields:
            gr.Markdown(label, elem_classes=["kv-swap-label"])
            page.add(role, gr.Textbox(value=page.value(role, ""), label=label, show_label=False, placeholder=hint, lines=1,
                                      max_lines=1, scale=scale, min_width=110, container=False,
                                      elem_id=f"kv-{role.replace('_', '-')}"))
        page.add("contra_button", gr.Button("Insert a contradiction", size="sm", scale=0, min_width=170,
                                            elem_id="kv-contra-button"))


def build_tabs(page: Page, shown: list[str], sweep: dict | None) -> None:
    """The tabs below the cards; a tab's children render when it is first opened."""
    with gr.Tabs(selected=spec.DEFAULT_TAB, overflow_behavior="wrap", elem_id="kv-inside") as tabs:
        page.add("tabs", tabs)
        with tab(page, "layers"), gr.Row(elem_id="kv-layer-plots"):  # two a row on a laptop, one on a phone
            for name in spec.layer_figure_names():
                page.figures[name] = gr.Plot(page.value(f"figure:{name}"), show_label=False, visible=name in shown,
                                             min_width=520, elem_id=f"kv-plot-{name}")
        with tab(page, "tokens"):
            recorded_line(page, "tokens")
            page.add("tokens_column", gr.Dropdown(choices=[], value=None, label="Column shown", scale=0, min_width=240,
                                                  elem_id="kv-tokens-column"))
            page.add("tokens", gr.HTML("", elem_id="kv-tokens", js_on_load=None))
        with tab(page, "lens"):
            recorded_line(page, "lens")
            page.figures[spec.LENS_PLOT] = gr.Plot(page.value(f"figure:{spec.LENS_PLOT}"), show_label=False,
                                                   elem_id=f"kv-plot-{spec.LENS_PLOT}")
        with tab(page, "compare"):
            recorded_line(page, "compare")
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


def recorded_line(page: Page, tab_id: str) -> None:
    """The tab's line about what crossed: recording it (when the tab opened on a run without it), or
    that it was recorded then (``kvviz.app.page.recording``); empty otherwise."""
    page.add(f"recorded_{tab_id}", gr.Markdown("", elem_id=f"kv-recorded-{tab_id}", elem_classes=["kv-recorded"]))


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
    (``tabs.tab_updates``): most visits never open it, and it is most of the page's weight.
    Project text only (the descriptors and assets/diagrams), so its HTML is not sanitised."""
    page.add("how", gr.Markdown("", sanitize_html=False, elem_id="kv-how"))
