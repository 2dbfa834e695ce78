"""Going to something: the lesson's "Show me" (its tab, its first plot outlined) and the guided
walk-through (each step loads its preset, opens its tab, scrolls its target into the room above the
docked panel and outlines it; a predict step hides the answers until the learner picks, then the
step's preset's stored run, read once, says which was right).
"""

from __future__ import annotations

import json

import gradio as gr

from kvviz.app.page import spec, steps as walk_steps
from kvviz.app.page.lab import PRIVATE, Lab, resolved
from kvviz.app.page.layout import walk_markdown
from kvviz.app.presets import preset

# Once the element ``target`` is shown (a tab renders it when it opens), scroll it (``scroll(el)``) and
# outline it for two seconds.
SHOW_JS = """
(target, scroll) => {
  let tries = 0;
  const go = () => {
    const el = document.getElementById(target);
    if (!el || !el.offsetParent) { if (tries++ < 30) setTimeout(go, 100); return; }
    scroll(el);
    el.classList.add('kv-highlight');
    setTimeout(() => el.classList.remove('kv-highlight'), 2000);
  };
  setTimeout(go, 50);
}
"""
HIGHLIGHT_JS = f"(target) => ({SHOW_JS})(target, (el) => el.scrollIntoView({{behavior: 'smooth', block: 'center'}}))"


# The first plot drawn in the open tab, once the tab has rendered it.
FIRST_PLOT_JS = f"""() => {{
  let tries = 0;
  const find = () => {{
    const plot = [...document.querySelectorAll('#kv-inside [id^=kv-plot-]')].find(e => e.offsetParent);
    if (!plot) {{ if (tries++ < 30) setTimeout(find, 100); return; }}
    ({HIGHLIGHT_JS})(plot.id);
  }};
  find();
}}"""


# The walk-through's scroll: the target's top just under the sticky verdict strip, so that it sits in
# the room above the docked walk-through panel (theme: #kv-walk) and text, Next and target share a screen.
WALK_SCROLL_JS = """
(el) => {
  document.body.style.paddingBottom = '70vh';  // room to scroll a target near the page's end above the panel
  const strip = document.getElementById('kv-verdict');
  const stuck = strip && getComputedStyle(strip).position === 'sticky' ? strip.getBoundingClientRect().height : 0;
  const panel = document.getElementById('kv-walk');
  const room = window.innerHeight - stuck - (panel ? panel.getBoundingClientRect().height + 24 : 0);
  const r = el.getBoundingClientRect();
  // a target taller than the room starts at its top; a shorter one is centred in the room
  const offset = stuck + 8 + Math.max(0, (room - r.height) / 2);
  window.scrollTo({top: window.scrollY + r.top - offset, behavior: 'instant'});
}
"""
WALK_TARGET_JS = f"(target) => ({SHOW_JS})(target, {WALK_SCROLL_JS})"


def highlight_js(targets: list[str]) -> str:
    """JS that outlines the target of the step shown in the walk-through panel ("Step i of n")."""
    return f"""() => {{
  const text = (document.getElementById('kv-walk-text') || {{}}).innerText || '';
  const step = parseInt((text.match(/Step (\\d+) of/) || [0, 1])[1]) - 1;
  const panel = document.getElementById('kv-walk');
  if (panel) panel.scrollTop = 0;  // a new step is read from its first line
  ({WALK_TARGET_JS})({json.dumps(targets)}[step]);
}}"""


def wire_lesson(lab: Lab) -> None:
    page = lab.page

    def show_lesson(reading, names, view):
        tab = (preset(reading.preset).tab if reading.preset else None) or spec.DEFAULT_TAB
        return lab.tab_view(tab, reading, names or [], view)

    shown = page["lesson_show"].click(resolved(page, show_lesson), inputs=[page["reading"], page["chosen"], page["view"]],
                                      outputs=page.outputs(), api_name="show_lesson", **PRIVATE)
    shown.then(None, js=FIRST_PLOT_JS)
    lab.tab_events.append(shown)  # a live run of a preset's question may lack what its tab shows


def wire_walkthrough(lab: Lab) -> None:
    page, steps = lab.page, lab.steps

    def walk(index, view, reading, names):
        index = max(0, min(len(steps) - 1, int(index or 0)))
        step = steps[index]
        updates = {"walk_step": index, "walk_text": walk_markdown(steps, index), "walk": gr.update(visible=True),
                   **prediction_updates(step)}
        if step.preset:
            updates.update(lab.preset_view(step.preset, view))
            reading, names, view = updates["reading"], updates["chosen"], updates["view"]
        if step.tab:
            updates.update(lab.tab_view(step.tab, reading, names, view))
        return updates

    inputs = [page["walk_step"], page["view"], page["reading"], page["chosen"]]
    moves = (("walk_open", lambda i: 0, "walkthrough_open"), ("walk_next", lambda i: i + 1, "walkthrough_next"),
             ("walk_back", lambda i: i - 1, "walkthrough_back"))
    for role, move, name in moves:
        def handler(index, view, reading, names, move=move):
            return walk(move(int(index or 0)), view, reading, names)

        handler.__name__ = name
        step = page[role].click(resolved(page, handler), inputs=inputs, outputs=page.outputs(), api_name=name, **PRIVATE)
        lab.result_events.append(step)
        lab.tab_events.append(step)
        step.then(
            None, js=highlight_js([step.target for step in steps]))

    def guess(choice, index):
        """The learner's pick on a predict step: the veil goes, the step's preset's stored run says
        which was right (whatever the page shows meanwhile)."""
        step = steps[max(0, min(len(steps) - 1, int(index or 0)))]
        if step.predict is None or choice is None or not step.preset:
            return {}
        right, said = walk_steps.prediction_outcome(step.predict, lab.presets(step.preset)[2])
        choices = walk_steps.PREDICTION_CHOICES
        if right is None:
            verdict = "These results cannot say."
        else:
            verdict = "**Right.**" if choices.index(choice) == right else f"**Not this time:** the answer is {choices[right]}."
        reveal = f"{verdict} In this preset's stored run, {said}" + (f" {step.reveal}" if step.reveal else "")
        return {"walk_reveal": reveal, "walk_veil": walk_steps.REVEALED_CSS}

    page["walk_guess"].input(resolved(page, guess), inputs=[page["walk_guess"], page["walk_step"]],
                             outputs=[page["walk_reveal"], page["walk_veil"], page["status"]], api_name="walkthrough_guess",
                             **PRIVATE)
    page["walk_close"].click(lambda: (gr.update(visible=False), ""), outputs=[page["walk"], page["walk_veil"]],
                             api_name="walkthrough_close", **PRIVATE).then(
        None, js="() => { document.body.style.paddingBottom = ''; }")


def prediction_updates(step: walk_steps.WalkStep) -> dict:
    """A step's prediction widgets: its choices (none picked) and the veil, or both gone."""
    if step.predict is None:
        return {"walk_guess": gr.update(visible=False, value=None), "walk_reveal": "", "walk_veil": ""}
    return {"walk_guess": gr.update(choices=list(walk_steps.PREDICTION_CHOICES), value=None, visible=True,
                                    label=step.predict.question),
            "walk_reveal": "", "walk_veil": walk_steps.prediction_veil_css(step.predict)}
