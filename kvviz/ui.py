"""The kvviz lab in the browser: Gradio Blocks, layout and event wiring only.

The page runs one query through several handoffs side by side, streams each answer, and plots
what happened inside. Everything about a handoff (its column, colour, explanation, options, plot,
walk-through step, sweep) comes from its descriptor in ``kvviz.handoffs.registry``: this file
names no handoff. Results are shown by ``kvviz.present``, figures drawn by ``kvviz.plots`` and the
handoffs' own figure functions, runs streamed by ``kvviz.stream``, the sweep run by
``kvviz.sweep``.

Serving rules kept here:
* models load once per process (``kvviz.models.load_model`` caches them); per-user data lives only
  in ``gr.State`` and event arguments, never in module globals;
* every model-running event shares one queue (``concurrency_id="models"``), limit
  ``kvviz.policy.model_concurrency()`` (``KVVIZ_CONCURRENCY``; the defaults were measured); the
  queue holds at most ``policy.caps().queue_size`` waiting requests and says so when full;
* in public mode (``kvviz.policy``) the pair box offers registered pairs only and the sliders stop
  at the public caps; every limit is checked again on the server (``kvviz.limits``), so the API
  gets the same refusals as the page;
* every event has an explicit ``api_name`` so scripts can drive the app with ``gradio_client``;
* user text (query, context, answers, prompts) only ever goes into text boxes or escaped
  markdown: it is shown as text, never run as HTML.

The ``/run`` endpoint's inputs: pair, query, context, max new tokens, sample, temperature, seed,
then every handoff's page options in registry order, each named by ``Option.page_name`` (the
text handoff's message bound comes first, as ``message_tokens``; an option with an "auto" setting
takes two inputs: the auto checkbox, then the value), then the handoffs to run.
"""

from __future__ import annotations

import inspect
import tempfile
import time
from pathlib import Path
from dataclasses import dataclass

import gradio as gr

from kvviz import limits, plots, policy, present, zerogpu
from kvviz.handoffs import registry
from kvviz.handoffs.registry import Handoff, Option
from kvviz.models import PAIRS, resolve_pair
from kvviz.presets import DEFAULT_PRESET, PRESETS, SWEEP_ITEMS, load_precomputed, load_precomputed_sweep, preset
from kvviz.stream import default_workers, stream_handoffs
from kvviz.sweep import gpu_sweep, run_sweep

MODEL_QUEUE = "models"
MAX_UI_NEW_TOKENS = 256  # the slider's end (the server's cap, kvviz.limits, may be lower)
STREAM_INTERVAL = 0.12  # seconds between streamed UI updates
FIXED_PLOTS = ("latency", "bytes")

CSS = """
.kv-col-head {border-radius: 8px; padding: 6px 10px; color: #fff; font-weight: 600; margin-bottom: 4px; min-height: 4.9em;
  box-sizing: border-box}
.kv-col-head small {display: block; font-weight: 400; opacity: 0.95; font-size: 0.82em; line-height: 1.25}
.kv-stats {font-size: 0.9em; min-height: 3.2em}
.kv-stats p {margin: 0.15em 0}
.kv-badge {display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 0.8em; background: #fff3cd;
  color: #7a5b00; border: 1px solid #e6cf7d}
.kv-status {font-size: 0.95em}
.kv-diagram svg {max-width: 100%; height: auto}
.kv-walk {border-left: 4px solid #0072B2; padding-left: 12px}
#kv-title h1 {margin-bottom: 0}
"""


# --- what the page shows, from the registry -----------------------------------------------------


def column_names() -> list[str]:
    """The page's columns, in order (every page handoff; the default ones are shown at first)."""
    return [handoff.name for handoff in registry.page_handoffs()]


def default_columns() -> list[str]:
    return registry.default_handoffs()


def plot_names() -> list[str]:
    """The run's figures, in order: each page handoff's own figure, then latency and bytes."""
    return plots.layer_figure_handoffs(column_names()) + list(FIXED_PLOTS)


@dataclass(frozen=True)
class PageOption:
    """One handoff option as page widgets: its value, and a checkbox first when it has "auto"."""

    handoff: Handoff
    option: Option

    @property
    def inputs(self) -> int:
        return 2 if self.option.auto else 1


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
    """The ``/run`` endpoint's parameters, in order (see the module docstring)."""
    names = ["pair", "query", "context", "max_new_tokens", "sample", "temperature", "seed"]
    for spec in specs:
        base = spec.option.page_name(spec.handoff.name)
        names += [f"{base}_auto", base] if spec.option.auto else [base]
    return names + ["handoffs"]


def walkthrough_steps() -> list[tuple[str, str | None, str]]:
    """(title, preset to load or None, text) per step: an opening, one step per handoff shown at
    first that tells its part, what it costs, and your turn."""
    shown = [h for h in registry.page_handoffs() if h.page_default and h.walkthrough]
    sweeps = registry.with_sweep()
    middle = [(h.title, *walkthrough_preset(h)) for h in shown]
    steps = [
        (
            "The puzzle",
            DEFAULT_PRESET,
            f"We loaded the preset **{preset(DEFAULT_PRESET).title}**. A *sharer* model has read a note: "
            f"*{preset(DEFAULT_PRESET).context}* A *receiver* model gets only the question "
            f"*{preset(DEFAULT_PRESET).query}* The receiver must answer, so the note has to travel from one "
            "model to the other somehow. Each coloured column below is one way to make that trip.",
        ),
        *middle,
        (
            "What it costs",
            None,
            "**What crosses between the models** compares sizes on a log scale: a text message is a few dozen "
            "bytes, a KV cache is hundreds of kilobytes. Text is small but slow to write; KV is big but needs no "
            "writing. Nothing here crosses a network: the bytes are counted and KVComm's transfer is a copy in "
            "memory, so which is better on a real link is not measured here. *First token* is timed from the "
            "question to the receiver's first answer token, the sender's work included; *receiver side* leaves "
            "that work out.",
        ),
        (
            "Your turn",
            None,
            "Press **Run** to run the chosen handoffs live on this machine. Tick more handoffs under *Handoffs on "
            "the page*, open *Settings*, change a handoff's options, and run again."
            + (f" Finally press **Run sweep** below: {sweeps[0].sweep.title.lower()}" if sweeps else ""),
        ),
    ]
    return [(f"Step {i + 1} of {len(steps)}: {title}", key, text) for i, (title, key, text) in enumerate(steps)]


def walkthrough_preset(handoff: Handoff) -> tuple[str | None, str]:
    """(the preset a handoff's step loads, its text with that preset's title in place of {preset})."""
    key = DEFAULT_PRESET if handoff.walkthrough_preset == registry.OPENING_PRESET else handoff.walkthrough_preset
    text = handoff.walkthrough.replace("{preset}", preset(key).title) if key else handoff.walkthrough
    return key, text


def walkthrough_markdown(step: int, steps: list[tuple[str, str | None, str]]) -> str:
    title, _, text = steps[step]
    return f"### {title}\n\n{text}"


def build_request(query, context, max_new_tokens=32, sample=False, temperature=0.7, seed=0,
                  options: dict[str, dict] | None = None):
    """The form's values as a request (a ValueError says what is wrong in plain words)."""
    return registry.build_request(query, context, max_new_tokens, sample, temperature, seed, options)


# --- the page -----------------------------------------------------------------------------------


def server_checked_slider(*args, **kwargs) -> gr.Slider:
    """A slider whose value the server checks with ``kvviz.limits``, so that an API call out of
    range hears which setting and what is allowed ("KVComm ratio r must be between 0 and 1, got
    1.5"), as the CLI does; Gradio's own check would not name the setting. (Not a subclass: Gradio
    writes a type stub beside the file of every component subclass.)"""
    slider = gr.Slider(*args, **kwargs)
    slider.preprocess = lambda payload: payload
    return slider


def _option_widget(spec: PageOption):
    """The widgets of one option: [auto checkbox,] value."""
    option, handoff = spec.option, spec.handoff
    elem = f"kv-opt-{handoff.name}-{option.name}".replace("_", "-")
    widgets = []
    if option.auto:
        widgets.append(gr.Checkbox(value=True, label=option.auto, elem_id=f"{elem}-auto"))
    if option.kind == "choice":
        widgets.append(gr.Dropdown(choices=list(option.choices), value=option.default, label=option.label, elem_id=elem))
    elif option.kind == "text":
        widgets.append(gr.Textbox(value=option.default, label=option.label, elem_id=elem))
    elif option.kind in ("float", "int") and None not in option.bounds():
        low, high = option.bounds()
        if option.kind == "int":  # a count: the slider ends where a page needs it to (the server's cap may be lower)
            high = min(MAX_UI_NEW_TOKENS, int(high))
        widgets.append(server_checked_slider(low, high, value=min(option.default, high), step=option.step or (1 if option.kind == "int" else 0.01),
                                             label=option.label, elem_id=elem))
    else:
        widgets.append(gr.Number(value=option.default, precision=0 if option.kind == "int" else None, label=option.label,
                                 elem_id=elem))
    return widgets


def build_demo(
    precomputed: dict | None = None,
    sweep: dict | None = None,
    default_pair: str = "embedded",
    default_max_new_tokens: int = 32,
) -> gr.Blocks:
    """Build the Blocks app. ``precomputed``/``sweep`` default to the files in assets/;
    ``default_max_new_tokens`` sets the slider's start value (tests use a small one)."""
    precomputed = load_precomputed() if precomputed is None else precomputed
    sweep = load_precomputed_sweep() if sweep is None else sweep
    concurrency = policy.model_concurrency()
    workers = default_workers()
    public = policy.public_mode()
    setting = limits.settings()
    pre_presets = precomputed.get("presets", {})
    pre_pair = precomputed.get("pair", default_pair)
    columns, shown_at_first, figure_names = column_names(), default_columns(), plot_names()
    steps = walkthrough_steps()
    specs = page_options()
    swept = registry.with_sweep()[0] if registry.with_sweep() else None

    def view_for_preset(key: str) -> tuple[dict, str]:
        """The payload and status line for a preset's precomputed results (or an empty page)."""
        entry = pre_presets.get(key)
        if not entry:
            return present.payload(default_pair, None, [], True, key), (
                f"No precomputed results for **{present.md(preset(key).title)}**: press **Run** to compute them live."
            )
        results = [dict(r, precomputed=True) for r in entry["results"] if r.get("handoff") in registry.HANDOFFS]
        when = precomputed.get("generated", "")
        status = (
            f'<span class="kv-badge">precomputed</span> Showing results computed ahead of time for '
            f"**{present.md(preset(key).title)}** on the pair *{present.md(pre_pair)}*"
            + (f" ({present.md(when)})" if when else "")
            + ". Press **Run** for a live run on this machine.\n\n"
            + f"*What to look at:* {present.md(preset(key).note)}"
        )
        return present.payload(pre_pair, entry.get("request"), results, True, key), status

    def outputs_for(data: dict, partial: dict | None = None, states: dict | None = None) -> list:
        """Values for the per-column components, the figures and the table, in ``run_outputs`` order."""
        partial, states = partial or {}, states or {}
        by_name = {r["handoff"]: r for r in data.get("results", [])}
        values = []
        for name in columns:
            result = by_name.get(name)
            values.append(present.answer_text(result, partial.get(name)))
            values.append(present.stats_markdown(result, states.get(name, "")))
            values.append(present.seen_text(result))
        figures = plots.all_figures(data.get("results", []), columns)
        values += [figures[name] for name in figure_names]
        values.append(present.results_frame(data))
        return values

    initial_data, initial_status = view_for_preset(DEFAULT_PRESET)
    initial_values = outputs_for(initial_data)
    first = preset(DEFAULT_PRESET)
    n_columns = len(columns)

    with gr.Blocks(title="kvviz: watch two language models talk") as demo:
        results_state = gr.State(initial_data)
        walk_step = gr.State(0)

        gr.Markdown(
            "# kvviz: watch two language models talk\n"
            "One question, several ways for a *sharer* model to help a *receiver* model answer it: "
            + ", ".join(registry.get(name).title for name in shown_at_first)
            + ". Text and C2C go from the pair's sharer to its receiver; KVComm needs a sender of the receiver's "
            "own shape, so its sender is a second copy of the receiver's model. The plots show what was measured "
            "inside.",
            elem_id="kv-title",
        )
        with gr.Accordion("Guided walk-through: new here? start with this", open=False, elem_id="kv-walkthrough"):
            walk_text = gr.Markdown(walkthrough_markdown(0, steps), elem_classes=["kv-walk"])
            with gr.Row():
                walk_back = gr.Button("Back", size="sm", elem_id="kv-walk-back")
                walk_next = gr.Button("Next step", size="sm", variant="primary", elem_id="kv-walk-next")

        with gr.Row():
            with gr.Column(scale=1, min_width=220):
                pair = gr.Dropdown(
                    choices=list(PAIRS),
                    value=default_pair,
                    label="Model pair (sharer -> receiver)",
                    allow_custom_value=not public,
                    info="A registered pair." if public else "A registered pair, or SHARER+RECEIVER with any two model names.",
                    elem_id="kv-pair",
                )
            with gr.Column(scale=3):
                with gr.Accordion("The pair's architecture facts", open=False):
                    facts = gr.Markdown(present.pair_facts_markdown(default_pair), elem_id="kv-facts")

        preset_choice = gr.Radio(
            choices=[(p.label, p.key) for p in PRESETS],
            value=DEFAULT_PRESET,
            label="Presets: one click loads a question (results shown are precomputed until you press Run)",
            elem_id="kv-presets",
        )
        with gr.Row():
            query = gr.Textbox(value=first.query, label="Query (both models see it)", lines=2, max_lines=6, elem_id="kv-query")
            context = gr.Textbox(
                value=first.context or "",
                label="Private context (only the sharer sees it; leave empty for a shared question)",
                lines=2,
                max_lines=8,
                elem_id="kv-context",
            )
        chosen = gr.CheckboxGroup(
            choices=[(registry.get(name).title, name) for name in columns],
            value=shown_at_first,
            label="Handoffs on the page (each one a column; Run runs the ticked ones)",
            elem_id="kv-handoffs",
        )
        with gr.Accordion("Settings", open=False, elem_id="kv-settings"):
            with gr.Row():
                top = min(MAX_UI_NEW_TOKENS, int(setting["max_new_tokens"].maximum))
                max_new_tokens = server_checked_slider(1, top, value=min(top, int(default_max_new_tokens)), step=1,
                                           label="Max new tokens (answer length bound)")
            with gr.Row():
                sample = gr.Checkbox(value=False, label="Sample instead of greedy decoding")
                temperature = server_checked_slider(setting["temperature"].minimum, setting["temperature"].maximum, value=0.7, step=0.05,
                                        label="Temperature (when sampling)")
                seed = gr.Number(value=0, precision=0, label="Seed (sampling and random choices)")
            option_inputs = []
            for handoff in registry.all_handoffs():
                own = [spec for spec in specs if spec.handoff.name == handoff.name]
                if not own:
                    continue
                gr.Markdown(f"**{handoff.title}**")
                with gr.Row():
                    for spec in own:
                        option_inputs += _option_widget(spec)

        with gr.Row():
            run_button = gr.Button("Run the ticked handoffs live", variant="primary", elem_id="kv-run", scale=2)
            stop_button = gr.Button("Stop", variant="stop", elem_id="kv-stop", scale=1)
        status = gr.Markdown(initial_status, elem_id="kv-status", elem_classes=["kv-status"])

        column_outputs: list = []
        column_blocks: list = []
        with gr.Row(equal_height=False):
            for index, name in enumerate(columns):
                with gr.Column(min_width=180, elem_id=f"kv-col-{name}", visible=name in shown_at_first) as block:
                    gr.HTML(present.header_html(name))
                    answer_box = gr.Textbox(value=initial_values[3 * index], label="Answer", lines=3, max_lines=10,
                                            interactive=False, elem_id=f"kv-answer-{name}")
                    stats = gr.Markdown(initial_values[3 * index + 1], elem_id=f"kv-stats-{name}", elem_classes=["kv-stats"])
                    with gr.Accordion("What each model saw", open=False):
                        seen = gr.Textbox(value=initial_values[3 * index + 2], show_label=False, lines=6, max_lines=20,
                                          interactive=False, elem_id=f"kv-seen-{name}")
                    column_outputs += [answer_box, stats, seen]
                column_blocks.append(block)

        gr.Markdown("## Inside the run")
        plot_outputs = {}
        for offset, name in enumerate(figure_names):
            value = initial_values[3 * n_columns + offset]
            if name in FIXED_PLOTS:
                continue
            plot_outputs[name] = gr.Plot(value, label=registry.get(name).title, elem_id=f"kv-plot-{name}",
                                         visible=name in shown_at_first)
        with gr.Row():
            for name in FIXED_PLOTS:
                value = initial_values[3 * n_columns + figure_names.index(name)]
                plot_outputs[name] = gr.Plot(value, label=name.capitalize(), elem_id=f"kv-plot-{name}")

        sweep_event = None
        if swept is not None:
            spec = swept.sweep
            gr.Markdown(
                f"## {spec.title}\n{spec.explanation} {len(SWEEP_ITEMS)} questions; {spec.x_option} "
                f"{', '.join(f'{x:g}' for x in spec.x_values)}. It takes a while on a CPU; the progress bar tracks it."
            )
            with gr.Row():
                sweep_series = gr.CheckboxGroup(choices=list(spec.series_values), value=list(spec.series_default),
                                                label=swept.option(spec.series_option).label, scale=3)
                sweep_tokens = gr.Slider(2, 32, value=12, step=1, label="Max new tokens per answer", scale=2)
                sweep_button = gr.Button("Run sweep", elem_id="kv-sweep", scale=1)
            sweep_status = gr.Markdown(
                ('<span class="kv-badge">precomputed</span> Sweep computed ahead of time; press **Run sweep** to redo it live.')
                if sweep
                else "No sweep yet.",
                elem_id="kv-sweep-status",
            )
            sweep_plot = gr.Plot(plots.sweep_figure(sweep), label="Sweep", elem_id="kv-plot-sweep")
            sweep_json = gr.JSON(sweep or {}, label="Sweep data", visible=False)

        with gr.Tabs():
            with gr.Tab("How it works", elem_id="kv-tab-how"):
                for name in columns:
                    with gr.Accordion(registry.get(name).title, open=False, elem_id=f"kv-how-{name}"):
                        with gr.Row():
                            gr.HTML(present.diagram_html(name))
                            gr.Markdown(present.how_it_works_markdown(name))
            with gr.Tab("Results as data", elem_id="kv-tab-data"):
                export_button = gr.Button("Export JSON and CSV", elem_id="kv-export")
                export_files = gr.File(label="Downloads", file_count="multiple", interactive=False)
                results_table = gr.Dataframe(initial_values[-1], label="One row per handoff", interactive=False,
                                             elem_id="kv-results-table")
                results_json = gr.JSON(initial_data, label="Structured results (what the run endpoint returns)")

        figure_outputs = [plot_outputs[name] for name in figure_names]
        run_outputs = [status, *column_outputs, *figure_outputs, results_table, results_json, results_state]
        answer_boxes, stats_boxes = column_outputs[0::3], column_outputs[1::3]
        settings_inputs = [max_new_tokens, sample, temperature, seed, *option_inputs]

        # --- events ------------------------------------------------------------------------

        def show(names):
            """Show the ticked handoffs' columns and figures, hide the others."""
            names = set(names or [])
            updates = [gr.update(visible=name in names) for name in columns]
            updates += [gr.update(visible=name in names) for name in figure_names if name not in FIXED_PLOTS]
            return updates

        chosen.change(
            show,
            inputs=[chosen],
            outputs=column_blocks + [plot_outputs[name] for name in figure_names if name not in FIXED_PLOTS],
            api_name="show_handoffs",
            show_progress="hidden",
        )

        def load_preset(preset_key):
            """Fill the query and context from a preset and show its precomputed results."""
            try:
                picked = preset(preset_key)
            except ValueError as error:
                raise gr.Error(str(error)) from error
            data, status_text = view_for_preset(preset_key)
            return [picked.query, picked.context or "", status_text, *outputs_for(data), data, data]

        preset_choice.change(
            load_preset,
            inputs=[preset_choice],
            outputs=[query, context, *run_outputs],
            api_name="load_preset",
            show_progress="hidden",
        )

        pair.change(present.pair_facts_markdown, inputs=[pair], outputs=[facts], api_name="pair_facts", show_progress="hidden")

        def run(pair, query, context, *settings):
            """Run the ticked handoffs live and stream the answers; the last update holds the
            structured results (the JSON output: pair, request, one result per handoff)."""
            *values, ticked = settings
            max_new_tokens, sample, temperature, seed = values[:4]
            names = [name for name in columns if name in (ticked or [])]
            try:
                options = option_values(specs, values[4:])
                request = build_request(query, context, max_new_tokens, sample, temperature, seed, options)
                resolve_pair(pair)
                if not names:
                    raise ValueError("Tick at least one handoff to run.")
            except ValueError as error:
                raise gr.Error(str(error)) from error
            pair_name = pair
            results: dict[str, dict] = {}
            partial: dict[str, str] = {}
            states = {name: "waiting" for name in names}
            log = "starting ..."
            last = 0.0
            started = time.perf_counter()
            stopped = ""  # why the run stopped early (the server's time limit), if it did

            def snapshot(final=False):
                """Every output: at the start, when a handoff finishes, and at the end."""
                ordered = [results[name] for name in names if name in results]
                data = present.payload(pair_name, request.to_dict(), ordered, False)
                values = [header(final), *outputs_for(data, partial, states), data, data]
                return dict(zip(run_outputs, values))

            def header(final=False):
                wall = present.format_seconds(time.perf_counter() - started)
                if final and stopped:
                    return f"**{present.md(stopped)}** ({wall}) Every number below was measured in this run."
                if final:
                    side_by_side = (
                        f" The handoffs ran {workers} at a time, so each one's own times include sharing the CPU."
                        if workers > 1 else ""
                    )
                    return (f"**Live run finished** in {wall} (wall time). Every number below was measured in this run."
                            + side_by_side)
                return f"**Live run** ({len(results)} of {len(names)} done, {wall} so far): {present.md(log)}"

            def small(name=None):
                """While a handoff streams, only its answer box, its stats and the status change
                (the browser does not redraw every plot for every token)."""
                update = {status: header()}
                if name is not None:
                    index = columns.index(name)
                    update[answer_boxes[index]] = partial.get(name, "")
                    update[stats_boxes[index]] = present.stats_markdown(None, states.get(name, ""))
                return update

            yield snapshot()
            for kind, name, data in stream_handoffs(pair_name, request, names, workers):
                if kind == "status":
                    log = data
                    yield small()
                elif kind == "start":
                    states[name] = "running"
                    partial[name] = ""
                    log = f"running {registry.title_of(name)} ..."
                    yield small(name)
                elif kind == "token":
                    partial[name] = data
                    if time.perf_counter() - last >= STREAM_INTERVAL:
                        last = time.perf_counter()
                        yield small(name)
                elif kind == "done":
                    results[name] = data
                    partial.pop(name, None)
                    states.pop(name, None)
                    yield snapshot()
                elif kind == "stopped":
                    stopped = data
                elif kind == "error":
                    raise gr.Error(f"The run failed: {data}")
            yield snapshot(final=True)

        run.__signature__ = inspect.Signature(  # the API's parameter names
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in run_parameter_names(specs)]
        )
        run_event = run_button.click(
            run,
            inputs=[pair, query, context, *settings_inputs, chosen],
            outputs=run_outputs,
            api_name="run",
            concurrency_id=MODEL_QUEUE,
            concurrency_limit=concurrency,
            show_progress="minimal",
        )

        if swept is not None:

            def sweep_run(pair, series, max_new_tokens, progress=gr.Progress()):
                """Run the sweep on the built-in set; returns the figure and the data."""
                progress(0.0, desc="Loading models ...")
                try:
                    if zerogpu.available():  # on a Space: inside @spaces.GPU, plain data across, no progress bar
                        data = gpu_sweep(pair, list(series or []), int(max_new_tokens), swept.name)
                    else:
                        data = run_sweep(pair, series, int(max_new_tokens), progress=progress, handoff=swept.name)
                except ValueError as error:
                    raise gr.Error(str(error)) from error
                text = f"**Live sweep finished** in {data['seconds']:.0f} s ({data['n']} questions, {len(data['answers'])} runs)."
                return plots.sweep_figure(data), data, text

            sweep_event = sweep_button.click(
                sweep_run,
                inputs=[pair, sweep_series, sweep_tokens],
                outputs=[sweep_plot, sweep_json, sweep_status],
                api_name="sweep",
                concurrency_id=MODEL_QUEUE,
                concurrency_limit=concurrency,
            )

        stop_button.click(None, None, None, cancels=[e for e in (run_event, sweep_event) if e is not None],
                          api_name="stop", queue=False)

        def export(results):
            """Write the current results as JSON and CSV files to download."""
            try:
                return present.write_exports(results or {}, tempfile.mkdtemp(prefix="kvviz-export-"))
            except OSError as error:  # a full or read-only disk: say so; the results stay on the page
                raise gr.Error(
                    f"Could not write the export files ({error.strerror or error}). The results are still on the "
                    "page: copy them from 'Structured results', or try again when the server has disk space."
                ) from error

        export_button.click(export, inputs=[results_state], outputs=[export_files], api_name="export")

        def walk(step, delta):
            step = max(0, min(len(steps) - 1, int(step) + delta))
            key = steps[step][1]
            return step, walkthrough_markdown(step, steps), (key if key else gr.skip())

        walk_next.click(lambda s: walk(s, 1), inputs=[walk_step], outputs=[walk_step, walk_text, preset_choice],
                        api_name="walkthrough_next", show_progress="hidden")
        walk_back.click(lambda s: walk(s, -1), inputs=[walk_step], outputs=[walk_step, walk_text, preset_choice],
                        api_name="walkthrough_back", show_progress="hidden")

    # light events (presets, facts, export, walk-through) run side by side; model runs share one queue
    demo.queue(max_size=policy.caps().queue_size, default_concurrency_limit=4)
    return demo


THEME_KWARGS = dict(primary_hue="blue", neutral_hue="slate")


def plot_script_preload() -> str:
    """A ``<link rel="modulepreload">`` for Gradio's plotly chunk, so the browser fetches it with
    the page instead of when the first plot mounts (about a second sooner to the first plot,
    ``scripts/bench_app.py``); empty when this Gradio build has no such chunk."""
    frontend = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    chunks = sorted(frontend.glob("PlotlyPlot-*.js"))
    # relative to the page, so that it also works under a root path (a proxy, a Space)
    return "".join(f'<link rel="modulepreload" href="assets/{chunk.name}">' for chunk in chunks[:1])


def launch_kwargs() -> dict:
    """theme, css and head belong to launch() in Gradio 6."""
    return {"theme": gr.themes.Soft(**THEME_KWARGS), "css": CSS, "head": plot_script_preload()}
