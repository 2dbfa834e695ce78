"""How the page looks: the theme, its CSS, and what goes in the page's head.

Every text is at least 4.5:1 against what it is drawn on (WCAG AA; tests/integration/test_browser.py measures
the rendered page). The Soft theme's blue on pale blue (block labels, 3.0:1), white on its primary
blue (3.7:1) and its subdued slate (2.5:1) are replaced below. Each handoff keeps its registered
hue for marks (card border, bars, lines) and writes its title in an ink shade of that hue
(``kvviz.core.plotkit.ink``), never white on the hue nor dark text on it.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from kvviz.app.compare import COMPARE_CSS
from kvviz.app.tokenview import TOKEN_VIEW_CSS, TOKEN_VIEW_JS

BLUE_TEXT = "#1e40af"  # 8.7:1 on white, 7.2:1 on the label's pale blue
BLUE_FILL = "#1d4ed8"  # white on it: 6.7:1
SUBDUED = "#475569"  # 7.6:1 on white


def theme() -> gr.themes.Base:
    return gr.themes.Soft(primary_hue="blue", neutral_hue="slate").set(
        block_label_text_color=BLUE_TEXT,
        block_label_text_color_dark=BLUE_TEXT,
        block_title_text_color=BLUE_TEXT,
        button_primary_background_fill=BLUE_FILL,
        button_primary_background_fill_hover="#1e3a8a",
        button_primary_text_color="#ffffff",
        checkbox_background_color_selected=BLUE_FILL,
        checkbox_border_color_selected=BLUE_FILL,
        checkbox_label_background_fill_selected=BLUE_FILL,
        checkbox_label_text_color_selected="#ffffff",
        body_text_color_subdued=SUBDUED,
        color_accent=BLUE_FILL,
        color_accent_soft="#dbeafe",
        link_text_color=BLUE_FILL,
        link_text_color_visited=BLUE_FILL,
        layout_gap="6px",  # the first screen at 1280x800 holds the cards, the lesson and the first plot
    )


CSS = """
.gradio-container {max-width: 1400px !important}
/* Gradio clips its container with overflow: hidden, which makes it a scroll container and stops the
   verdict strip from sticking; clip does the same clipping without that */
.gradio-container {overflow: clip !important}
.gradio-container footer, .gradio-container footer * {color: #475569 !important}
#kv-top {align-items: flex-end; gap: 8px; flex-wrap: nowrap}
#kv-heading {gap: 2px !important}
#kv-title h1 {font-size: 20px; margin: 0; line-height: 1.2}
#kv-title {min-width: 0 !important}
#kv-presets {max-width: 360px}  /* the longest preset label, "Capital of Truxbiwaesk (shared question)", fits at 1280 px, clear of the arrow */
#kv-ask {gap: 8px; align-items: stretch}
#kv-runbox {gap: 6px; justify-content: flex-start}
#kv-status {font-size: 13.5px; min-height: 20px}
#kv-status p {margin: 0}
.kv-refused {color: #7f1d1d}
.kv-badge {display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; background: #fef3c7;
  color: #713f12; border: 1px solid #e6cf7d}
#kv-verdict {position: sticky; top: 0; z-index: 30; padding: 0 !important; min-height: 0 !important}
/* the strip and the cards' heads are lines of text: no padding around them */
#kv-verdict > .html-container, #kv-answers [id^=kv-head-] > .html-container {padding: 0 !important}
.kv-verdict {font-size: 14px; padding: 3px 10px; border-radius: 6px; background: #f1f5f9; color: #0f172a;
  border: 1px solid #cbd5e1}
.kv-verdict-rule {color: #334155}
/* the cards: a grid of equal columns at least 168 px wide, so that any number of them wraps into rows
   and no title is cut (tests/integration/test_browser.py measures every title at 6, 11 and 14) */
#kv-answers {display: grid !important; grid-template-columns: repeat(auto-fill, minmax(168px, 1fr)); gap: 8px;
  align-items: stretch}
#kv-answers > .kv-card {background: #ffffff; border-radius: 6px; padding: 0 8px 6px 8px !important; gap: 2px !important;
  box-shadow: 0 1px 2px rgba(0, 0, 0, .15); min-width: 0 !important; width: auto !important; border: 1px solid #e2e8f0}
.kv-card-head {display: flex; justify-content: space-between; align-items: baseline; gap: 2px 4px; flex-wrap: wrap;
  border-top: 5px solid var(--kv-hue); margin: 0 -8px; padding: 4px 8px 0 8px}
.kv-card-head .kv-card-title {color: var(--kv-ink) !important; font-weight: 700; font-size: 13.5px; line-height: 1.25;
  min-width: 0}
.kv-mark {font-size: 12px; font-weight: 700; padding: 0 5px; border-radius: 8px; white-space: nowrap;
  background: #f1f5f9; color: #334155 !important}
.kv-mark-right {background: #dcfce7; color: #14532d !important}
.kv-mark-wrong {background: #fee2e2; color: #7f1d1d !important}
.kv-mark-none, .kv-mark-failed {background: #e5e7eb; color: #374151 !important}
.kv-mark-stopped, .kv-mark-notstarted, .kv-mark-notrun {background: #fef3c7; color: #713f12 !important}
.kv-mark-running, .kv-mark-waiting {background: #dbeafe; color: #1e3a8a !important}
.kv-whatif {font-size: 12px; color: #334155 !important; margin-top: 2px; line-height: 1.45}
.kv-whatif-lead {font-weight: 700; text-transform: uppercase; font-size: 10.5px; letter-spacing: 0.03em; margin-right: 2px}
.kv-whatif-item {white-space: nowrap}
.kv-whatif-mark {padding: 0 4px; border-radius: 6px; font-weight: 700}
.kv-mark-stale {background: #e2e8f0; color: #334155 !important}
/* a card whose answer is to another question: greyed until a run replaces it */
.kv-card:has(.kv-mark-stale) {background: #f1f5f9 !important}
.kv-card:has(.kv-mark-stale) textarea {color: #475569 !important; font-style: italic}
.kv-swap-row, .kv-contra-row {display: flex; flex-wrap: wrap; align-items: baseline; gap: 2px 6px; font-size: 12.5px;
  color: #1f2937 !important; border-top: 1px dashed #cbd5e1; padding-top: 2px; margin-top: 2px}
.kv-swap-answer {overflow-wrap: anywhere; min-width: 0}
.kv-swap, .kv-contra {font-weight: 700; padding: 0 5px; border-radius: 8px; white-space: nowrap}
.kv-swap-followed, .kv-contra-counter {background: #dbeafe; color: #1e3a8a !important}
.kv-swap-kept, .kv-contra-gold {background: #fef3c7; color: #713f12 !important}
.kv-swap-neither, .kv-swap-none, .kv-contra-neither, .kv-contra-both, .kv-contra-none {background: #e5e7eb;
  color: #374151 !important}
.kv-contra-odds {color: #334155; font-variant-numeric: tabular-nums}
.kv-card textarea {font-size: 15px !important; color: #0f172a !important; border: none !important; box-shadow: none !important;
  padding: 2px 0 !important; background: transparent !important}
.kv-card-stats {min-height: 1.3em}
.kv-card-stats p {margin: 0; font-size: 12px; color: #334155 !important; line-height: 1.25}
#kv-lesson {font-size: 14px}
#kv-lesson p {margin: 0}
#kv-lesson-row {align-items: center; gap: 8px}
/* the walk-through is a panel docked at the viewport's foot: its text and Next stay on screen while
   the page scrolls its target into the room above it (walk_target_js) */
#kv-walk {position: fixed; right: 16px; bottom: 16px; width: min(540px, calc(100vw - 32px)); max-height: 44vh;
  overflow-y: auto; z-index: 50; border: 1px solid #cbd5e1; border-left: 5px solid #0072B2; border-radius: 8px;
  padding: 8px 12px !important; background: #f8fafc; box-shadow: 0 6px 24px rgba(15, 23, 42, 0.25)}
#kv-walk-text p {margin: 0 0 4px 0}
/* nothing inside the panel shrinks into its own scroll box: the panel scrolls as one, its buttons stay */
#kv-walk > * {flex-shrink: 0}
#kv-walk-guess {overflow: visible !important}
#kv-walk-buttons {position: sticky; bottom: -8px; background: #f8fafc; padding: 4px 0 2px 0}
#kv-walk-guess .wrap {flex-wrap: nowrap; gap: 8px}
#kv-walk-veil {display: none !important}  /* it holds only a <style>, which applies wherever it is */
.kv-highlight {outline: 3px solid #1d4ed8 !important; outline-offset: 4px; border-radius: 6px;
  transition: outline-color 0.3s}
.kv-details-title {font-weight: 700; color: var(--kv-ink) !important; border-left: 5px solid var(--kv-hue); padding-left: 6px}
.kv-diagram svg {max-width: 100%; height: auto}
/* the JSON view's syntax colours, darkened to >= 4.5:1 on white */
.gradio-container .json-node .punctuation, .gradio-container .punctuation {color: #475569 !important}
.gradio-container .key {color: #9a3412 !important}
.gradio-container .value.string {color: #166534 !important}
.gradio-container .value.number {color: #1e40af !important}
.gradio-container .value.bool, .gradio-container .value.null {color: #86198f !important}
.gradio-container .square-bracket {color: #9f1239 !important}
#kv-columns {align-items: center; gap: 8px}
#kv-handoffs label {padding: 2px 7px !important; font-size: 13.5px}
/* the ask row's labels and the tab bar, compact: the first plot is on a laptop's first screen */
#kv-ask span[data-testid="block-info"] {font-size: 13px !important; padding: 1px 6px !important; margin-bottom: 2px}
#kv-inside [role="tablist"] button {padding-top: 4px !important; padding-bottom: 4px !important}
#kv-inside > .tab-wrapper {margin-bottom: 0 !important}
.kv-chip-group {align-self: center; font-size: 12.5px; font-weight: 700; color: #334155; margin: 0 2px 0 8px;
  text-transform: uppercase; letter-spacing: .04em; cursor: help}
.kv-chip-group:first-child {margin-left: 0}
#kv-swap, #kv-contra {align-items: center; gap: 6px; flex-wrap: nowrap}
:is(#kv-swap, #kv-contra) .kv-swap-label {flex: 0 0 auto !important; min-width: 0 !important; width: auto !important}
:is(#kv-swap, #kv-contra) .kv-swap-label p {margin: 0; font-size: 13.5px; color: #1f2937; white-space: nowrap}
:is(#kv-swap, #kv-contra) :is(textarea, input) {border: 1px solid #94a3b8 !important; border-radius: 6px !important;
  padding: 3px 8px !important}
.kv-setup {font-size: 13.5px; color: #1f2937; margin: 0; line-height: 1.3}
.kv-setup abbr {cursor: help; text-decoration: underline dotted}
@media (max-width: 640px) {
  #kv-verdict {position: static}
  /* the tabs in one row that scrolls sideways, not four rows */
  #kv-inside [role="tablist"] {flex-wrap: nowrap !important; overflow-x: auto !important; overflow-y: hidden}
  #kv-inside [role="tablist"] > * {flex: 0 0 auto !important}  /* sticky, it would cover 13% of a phone's screen over every plot */
  /* the panel holds its whole step without a scroll of its own (a predict step folds its text while
     the choice is due, and after it shows the reveal in its place: steps.prediction_veil_css), full
     width at the foot, so that its buttons, its choices and the target above it can all be reached */
  #kv-walk {left: 0; right: 0; bottom: 0; width: 100vw; max-height: none; overflow: visible; font-size: 13.5px;
    border-radius: 8px 8px 0 0; border-left-width: 1px; border-top: 4px solid #0072B2; padding: 6px 10px !important;
    gap: 4px !important}
  #kv-walk-text p {line-height: 1.35}
  #kv-walk-buttons {position: static; padding: 2px 0 0 0}
  #kv-walk-guess .wrap {gap: 6px}
  #kv-top {flex-wrap: wrap}
  #kv-title {flex: 1 1 100% !important}
  #kv-title h1 {font-size: 18px}
  #kv-columns {order: 1}
  #kv-lesson-row {order: 2}
  #kv-inside {order: 3}
  #kv-presets {max-width: none; flex: 1 1 100% !important}
  /* the longest preset label stays clear of the box's arrow on a 390 px phone */
  #kv-presets .wrap-inner {padding-left: 8px !important}
  #kv-presets input {font-size: 13px !important}
  /* the three page buttons share one row under the preset box */
  #kv-walkthrough, #kv-copy-link, #kv-save-run {min-width: 0 !important; flex: 1 1 0 !important; padding: 4px 6px !important}
  #kv-ask {flex-direction: column}
  #kv-ask > * {min-width: 0 !important; width: 100% !important}
  #kv-runbox {flex-direction: row !important; flex-wrap: nowrap !important; align-items: stretch}
  #kv-runbox > #kv-run {flex: 1 1 auto !important}
  #kv-runbox > #kv-stop {flex: 0 0 96px !important; min-width: 0 !important}
  #kv-swap, #kv-contra {flex-wrap: wrap}
  .kv-when {display: none}
  .kv-setup {font-size: 13px; line-height: 1.35}
  #kv-setup {margin-bottom: -8px}
  #kv-answers {display: flex !important; overflow-x: auto; scroll-snap-type: x mandatory; padding-bottom: 4px}
  #kv-answers > .kv-card {flex: 0 0 78vw !important; scroll-snap-align: start}
  #kv-layer-plots > * {min-width: 0 !important; flex-basis: 100% !important}
  /* plotly's toolbar lies over the titles of a narrow plot, and a tap shows it: on a phone the plots
     go without it (pinch to zoom; the export holds the numbers) */
  .js-plotly-plot .modebar-container {display: none !important}
}
"""


def plot_script_preload() -> str:
    """A ``<link rel="modulepreload">`` for Gradio's plotly chunk, so the browser fetches it with
    the page instead of when the first plot mounts (``scripts/bench_app.py``); empty when this
    Gradio build has no such chunk."""
    frontend = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    chunks = sorted(frontend.glob("PlotlyPlot-*.js"))
    # relative to the page, so that it also works under a root path (a proxy, a Space)
    return "".join(f'<link rel="modulepreload" href="assets/{chunk.name}">' for chunk in chunks[:1])


def launch_kwargs() -> dict:
    """theme, css and head belong to launch() in Gradio 6."""
    return {"theme": theme(), "css": CSS + TOKEN_VIEW_CSS + COMPARE_CSS, "head": plot_script_preload() + TOKEN_VIEW_JS}
