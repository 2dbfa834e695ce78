"""The page's widgets that Gradio's components do not give as they are: a slider the server checks,
a handoff option's widgets, and what the page does in the browser (``PAGE_JS``: the column chips'
headings and hover texts, the closed sidebar kept out of the Tab order, every plot named).
"""

from __future__ import annotations

import gradio as gr

from kvviz.app.page import spec
from kvviz.app.page.spec import PageOption

# What the page does in the browser that Gradio's components do not: the column chips get a heading
# before each group's first chip and a hover text each (a CheckboxGroup has no per-choice title),
# again whenever Gradio redraws them; the closed Settings sidebar is inert (its controls, drawn off
# screen, leave the Tab order: Run is a few presses from the top); every plot gets an accessible
# name, its title; a change of the question, the note or the expected answer that is no keypress
# (paste, cut, drop, Backspace, autofill) reaches Gradio as one.
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
// Gradio's textboxes send their input event on a keypress only: a paste, a cut, a drop, Backspace or
// Delete, an autofill or an undo changes the text without it. Each of those is told to Gradio as a
// keypress, so that the page follows every change of the question, the note and the expected answer.
const FOLLOWED = ['#kv-query', '#kv-context', '#kv-expected'];
if (!window.kvFollowsEveryChange) {  // once per page, however often Gradio mounts this component
  window.kvFollowsEveryChange = true;
  document.addEventListener('input', (event) => {
    const box = event.target;
    if (!box || !box.closest || !FOLLOWED.some((id) => box.closest(id))) return;
    if (event.inputType === 'insertText' || event.inputType === 'insertLineBreak') return;  // its keypress told it
    box.dispatchEvent(new KeyboardEvent('keypress', {key: 'Unidentified', bubbles: true}));
  });
}
const keep = () => { sidebarInert(); namePlots(); };
keep();
setInterval(keep, 500);  // cheap: a class check and a few title reads
})();
"""


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
