"""What crossed, drawn: the token view (HTML) and the logit-lens figure, from the
``token_attention`` and ``logit_lens`` fields a run records (``kvviz.runtime.crossed``). No Gradio.

The token view of one column: the answer's tokens as chips; hovering one lights the sent tokens up
by its attention on them, summed over the layers and heads ticked in the layer x head grid (the
page's script, ``TOKEN_VIEW_JS``, does the sums in the browser from the data on the view); a click
locks the token. KVComm's sent layers are marked in the grid. A handoff that sent no tokens says so.
"""

from __future__ import annotations

import html
import json
import math

import plotly.graph_objects as go

from kvviz.app.reading import catalog
from kvviz.app.reading.reading import typed
from kvviz.core.plotkit import ink, layout
from kvviz.core.results import HandoffResult

LENS_TITLE = "Logit lens: where in the receiver's depth the first answer token appears"
LENS_HEIGHT = 420
SENT_MARK, SINK_MARK = "\u25b2", "\u2013"  # the grid's marks: a layer KVComm sent, one that kept the sink


def chip_text(token: str) -> str:
    """A token as a chip shows it: spaces and line breaks made visible."""
    shown = token.replace(" ", "\u2423").replace("\n", "\u21b5")
    return html.escape(shown or "\u2205")


def has_view(result: HandoffResult | None) -> bool:
    return bool(result is not None and result.token_attention)


def columns_with_view(results) -> list[str]:
    """The handoffs whose results carry a token view, in the order given."""
    return [result.handoff for result in map(typed, results) if has_view(result)]


def without_arrays(result: dict) -> dict:
    """A result dict with its token_attention arrays (thousands of numbers) replaced by their shape,
    for a JSON viewer, the small export and ``/run`` (unless asked with ``attention=True``); the
    attention export keeps them whole."""
    data = typed(result).token_attention or {}
    if not data.get("attention"):
        return result
    shape = (f"[{len(data['attention'])} answer tokens x {data.get('layers')} layers x {data.get('heads')} heads x "
             f"{len(data.get('sent_tokens') or [])} sent tokens]: in the attention export (kvviz-attention-*.json)")
    return {**result, "token_attention": {**data, "attention": shape, "other": "in the attention export"}}


def payload_without_arrays(payload: dict) -> dict:
    """A payload whose results hold their attention arrays' shapes only (``without_arrays``): the
    Data tab's JSON, the small export and ``/run``'s JSON by default."""
    if "results" not in payload:  # no results (nothing ran yet): nothing to shorten
        return payload
    return {**payload, "results": [without_arrays(r) for r in payload["results"]]}


CHANGE_FULL = 4.0  # nats of change drawn at the full shade
CHANGE_MARKED = 1.0  # nats: a change counted as "changed" in the summary line


def change_shade(change: float) -> str:
    """A chip's background for a change in log-probability: bluish green where this handoff made the
    token likelier than its control did, vermillion where less likely (at most 0.55 of the colour,
    so that the dark text stays readable)."""
    weight = min(1.0, abs(change) / CHANGE_FULL) * 0.55
    rgb = "0, 158, 115" if change >= 0 else "213, 94, 0"
    return f"rgba({rgb}, {weight:.3f})"


def change_row_html(result: HandoffResult) -> str:
    """The answer's tokens coloured by the change in their log-probability against the handoff's
    control (``token_change``); where the control did not run, which column to tick; "" for a
    handoff that has no control."""
    name = result.handoff
    control = catalog.control_of(name)
    change = result.token_change or {}
    if not control:
        users = [catalog.label_of(other) for other in catalog.controlled_by(name)]
        if not users:
            return ""
        return (f'<div class="kv-tv-change-note">This column is the control of {html.escape(", ".join(users))}: '
                "pick one of those to see its answer coloured against this one.</div>")
    label, control_label = catalog.label_of(name), catalog.label_of(control)
    if not change.get("change"):
        return (f'<div class="kv-tv-change-note">Tick <b>{html.escape(control_label)}</b> beside {html.escape(label)} and '
                f"run live to colour {html.escape(label)}'s answer tokens by how much likelier (or less likely) "
                "each one is than under its control.</div>")
    chips = "".join(
        f'<span class="kv-tv-chg" data-i="{i}" data-change="{value:.4f}" style="background:{change_shade(value)}" '
        f'title="{html.escape(change_title(token, own, other, value, control_label))}">{chip_text(token)}</span>'
        for i, (token, own, other, value) in enumerate(zip(change["tokens"], change["logprob"], change["control_logprob"],
                                                           change["change"]))
    )
    values = change["change"]
    marked = sum(1 for value in values if abs(value) >= CHANGE_MARKED)
    top = max(range(len(values)), key=lambda i: abs(values[i]))
    summary = (f"{marked} of {len(values)} tokens changed by {CHANGE_MARKED:g} nat or more against "
               f"{html.escape(control_label)}; the largest: {html.escape(repr(change['tokens'][top]))} "
               f"{values[top]:+.2f} nats. Green: likelier here than under the control; vermillion: less likely "
               f"(full shade at {CHANGE_FULL:g} nats).")
    note = html.escape(change.get("measured_on", ""))
    return (f'<div class="kv-tv-row"><span class="kv-tv-label" title="{note}">vs {html.escape(control_label)}</span>'
            f'{chips}</div><div class="kv-tv-change-note" title="{note}">{summary}</div>')


def change_title(token: str, own: float, other: float, change: float, control_label: str) -> str:
    return (f"{token!r}: log-probability {own:.2f} here, {other:.2f} under {control_label}: {change:+.2f} nats "
            f"(x{math.exp(change):.3g} as likely; here as this answer's decoding chose it, under the control "
            "teacher-forced; this query, in this run)")


def token_view_html(result: HandoffResult | None, run_hint: str = "press Run live to record it") -> str:
    """One column's token view (an empty note when the result has none)."""
    if result is None:
        return '<div class="kv-tv-empty">No result for this column yet.</div>'
    result = typed(result)
    data = result.token_attention or {}
    method = catalog.METHODS.get(result.handoff)
    label = method.label if method else result.handoff
    hue = method.color if method else "#64748b"
    if not data:
        return (f'<div class="kv-tv-empty"><b>{html.escape(label)}</b>: this result does not hold what crossed '
                f"(it was computed without recording it; {html.escape(run_hint)}).</div>")
    answers = data.get("answer_tokens") or []
    captured = int(data.get("captured") or 0)
    chips = "".join(
        f'<span class="kv-tv-ans{"" if i < captured else " kv-tv-off"}" data-i="{i}" tabindex="0" '
        f'title="answer token {i + 1}: {html.escape(repr(token))}">{chip_text(token)}</span>'
        for i, token in enumerate(answers)
    )
    head = (f'<div class="kv-tv-title" style="--kv-ink:{ink(hue)}">{html.escape(label)}: '
            "what each answer token read</div>")
    changes = change_row_html(result)
    if data.get("nothing_sent"):
        return (f'<div class="kv-tv" data-handoff="{html.escape(result.handoff)}">{head}'
                f'<div class="kv-tv-row"><span class="kv-tv-label">answer</span>{chips}</div>{changes}'
                f'<div class="kv-tv-nothing">{html.escape(str(data["nothing_sent"]).capitalize())}.</div></div>')
    layers, heads = int(data["layers"]), int(data["heads"])
    sent_layers = set(data.get("sent_layers") or range(layers))
    sent = "".join(
        f'<span class="kv-tv-sent-tok" data-s="{s}" data-p="{position}" data-mass="0">{chip_text(token)}</span>'
        for s, (position, token) in enumerate(zip(data["sent_positions"], data["sent_tokens"]))
    )
    partial = len(sent_layers) < layers
    # the grid: a column per layer (KVComm's sent ones marked), a row per head
    head_row = "<tr><th>layer</th>" + "".join(
        f'<th class="{"kv-tv-sentlayer" if layer in sent_layers else "kv-tv-sinklayer"}">{layer}</th>'
        for layer in range(layers)) + "</tr>"
    if partial:
        head_row += '<tr><th>sent?</th>' + "".join(
            f'<th class="kv-tv-mark" title="layer {layer}: '
            f'{"the whole context KV was sent" if layer in sent_layers else "only the sink (first token) was sent"}">'
            f'{SENT_MARK if layer in sent_layers else SINK_MARK}</th>' for layer in range(layers)) + "</tr>"
    rows = [f"<tr><th>head {h}</th>" + "".join(
        f'<td class="kv-tv-cell on" data-l="{layer}" data-h="{h}" title="layer {layer}, head {h}: click to include '
        'or leave out"></td>' for layer in range(layers)) + "</tr>" for h in range(heads)]
    picks = ('<button class="kv-tv-pick" data-pick="all">all layers</button>'
             '<button class="kv-tv-pick" data-pick="none">none</button>'
             + ('<button class="kv-tv-pick" data-pick="sent">sent layers only</button>' if partial else ""))
    payload = {"attention": data["attention"], "sent_layers": sorted(sent_layers)}
    hover = html.escape(
        f"{data.get('measured_on', '')}. Hover an answer token: each sent token is shaded by that answer token's "
        "attention on it, summed over the ticked layers and heads (a sum of probabilities; each head's row sums "
        "to 1 over all its keys, the receiver's own included). Click a token to lock it."
    )
    kind = html.escape(str(data.get("sent_kind") or "sent tokens"))
    return (
        f'<div class="kv-tv" data-handoff="{html.escape(result.handoff)}" data-layers="{layers}" '
        f'data-heads="{heads}" data-attention="{html.escape(json.dumps(payload, separators=(",", ":")))}">{head}'
        f'<div class="kv-tv-note" title="{hover}">{hover}</div>'
        f'<div class="kv-tv-row"><span class="kv-tv-label">answer</span>{chips}</div>{changes}'
        f'<div class="kv-tv-row"><span class="kv-tv-label">sent: {kind}</span>{sent}</div>'
        '<div class="kv-tv-controls"><label><input type="checkbox" class="kv-tv-sink" checked> leave out the '
        "first sent token (the attention sink, which every layer keeps and most heads rest on)</label> "
        f'{picks} <span class="kv-tv-readout" aria-live="polite"></span></div>'
        f'<table class="kv-tv-grid">{head_row}{"".join(rows)}</table>'
        "</div>"
    )


def lens_figure(results) -> go.Figure:
    """Every column's logit lens on one figure: the first answer token's probability (solid) and
    the gold answer's first token's (dashed) after each receiver layer."""
    fig = go.Figure()
    drawn = 0
    for result in map(typed, results):
        lens = result.logit_lens or {}
        if not lens.get("layers"):
            continue
        method = catalog.METHODS.get(result.handoff)
        label, color = (method.label, method.color) if method else (result.handoff, "#64748b")
        measured = lens.get("measured_on", "")
        for field, token_field, dash, what in (("answer_probability", "answer_token", "solid", "its first answer token"),
                                               ("gold_probability", "gold_token", "dash", "the gold answer's first token")):
            values = lens.get(field)
            if not values:
                continue
            token = lens.get(token_field) or ""
            hover = [f"{label}, layer {layer}: P({token!r}) = {value:.4f}<br>{what}, probability (0 to 1)<br>{measured}"
                     for layer, value in zip(lens["layers"], values)]
            fig.add_trace(go.Scatter(
                x=lens["layers"], y=values, mode="lines+markers", name=f"{label}: {what} {token!r}",
                line=dict(color=color, dash=dash), hovertext=hover, hoverinfo="text",
                meta={"handoff": result.handoff, "series": field}))
            drawn += 1
    subtitle = ("the receiver's own final norm and output head applied to each layer's output at the prompt's last "
                "position; solid: the answer's first token, dashed: the gold's")
    if not drawn:
        subtitle = "no result holds a logit lens yet: press Run live (it is recorded in the run)"
    fig.update_xaxes(title_text="receiver layer (output of)", dtick=1)
    fig.update_yaxes(title_text="logit lens probability (0 to 1)", range=[0, 1.02])
    return layout(fig, f"{LENS_TITLE}<br><sup>{subtitle}</sup>", height=LENS_HEIGHT,
                  margin=dict(l=60, r=20, t=80, b=120))


TOKEN_VIEW_JS = """
<script>
(() => {
  if (window.kvTokenView) return;
  const view = (el) => el.closest('.kv-tv');
  const data = (v) => { if (!v._kv) v._kv = JSON.parse(v.dataset.attention); return v._kv; };
  function paint(v, i) {
    const sums = [...v.querySelectorAll('.kv-tv-sent-tok')].map(() => 0);
    if (i !== null && data(v).attention[i]) {
      const rows = data(v).attention[i];
      v.querySelectorAll('.kv-tv-cell.on').forEach((c) => {
        const row = rows[+c.dataset.l][+c.dataset.h];
        for (let s = 0; s < sums.length; s++) sums[s] += row[s];
      });
    }
    const sink = v.querySelector('.kv-tv-sink');
    const skip = sink && sink.checked ? 1 : 0;
    const top = Math.max(1e-9, ...sums.slice(skip));
    v.querySelectorAll('.kv-tv-sent-tok').forEach((t, s) => {
      const w = s < skip ? 0 : sums[s] / top;
      t.dataset.mass = sums[s].toFixed(4);
      // at most 0.55 of the blue, so that the dark text stays above 4.5:1 on every shade
      t.style.background = `rgba(0, 90, 181, ${(0.55 * w).toFixed(3)})`;
      t.classList.toggle('kv-tv-lit', i !== null && w >= 0.5);
      t.classList.toggle('kv-tv-skip', s < skip);
      t.title = `attention summed over the ticked layers and heads: ${sums[s].toFixed(4)}`;
    });
    v.querySelectorAll('.kv-tv-ans').forEach((a) => a.classList.toggle('kv-tv-active', +a.dataset.i === i));
    v.dataset.shown = i === null ? '' : String(i);
    const cells = v.querySelectorAll('.kv-tv-cell.on').length;
    const out = v.querySelector('.kv-tv-readout');
    if (out) out.textContent = i === null ? '' :
      `answer token ${i + 1}${v.dataset.locked ? ' (locked)' : ''}: ${cells} layer-head pairs summed`;
  }
  const current = (v) => (v.dataset.shown === '' || v.dataset.shown === undefined ? null : +v.dataset.shown);
  document.addEventListener('mouseover', (e) => {
    const a = e.target.closest && e.target.closest('.kv-tv-ans');
    if (!a || a.classList.contains('kv-tv-off')) return;
    const v = view(a);
    if (!v.dataset.attention || v.dataset.locked) return;
    paint(v, +a.dataset.i);
  });
  document.addEventListener('click', (e) => {
    const a = e.target.closest && e.target.closest('.kv-tv-ans');
    if (a && !a.classList.contains('kv-tv-off') && view(a).dataset.attention) {
      const v = view(a);
      if (v.dataset.locked === a.dataset.i) delete v.dataset.locked; else v.dataset.locked = a.dataset.i;
      paint(v, +a.dataset.i);
      return;
    }
    const c = e.target.closest && e.target.closest('.kv-tv-cell');
    if (c) { c.classList.toggle('on'); paint(view(c), current(view(c))); return; }
    const b = e.target.closest && e.target.closest('.kv-tv-pick');
    if (b) {
      const v = view(b), sent = new Set(data(v).sent_layers);
      v.querySelectorAll('.kv-tv-cell').forEach((cell) => cell.classList.toggle('on',
        b.dataset.pick === 'all' || (b.dataset.pick === 'sent' && sent.has(+cell.dataset.l))));
      paint(v, current(v));
    }
  });
  document.addEventListener('change', (e) => {
    if (e.target.classList && e.target.classList.contains('kv-tv-sink')) paint(view(e.target), current(view(e.target)));
  });
  window.kvTokenView = {paint};
})();
</script>
"""

TOKEN_VIEW_CSS = """
.kv-tv {font-size: 14px; color: #0f172a}
.kv-tv-title {font-weight: 700; color: var(--kv-ink); margin: 4px 0}
.kv-tv-note {font-size: 12.5px; color: #334155; margin-bottom: 6px}
.kv-tv-row {display: flex; flex-wrap: wrap; gap: 3px; align-items: center; margin: 4px 0}
.kv-tv-label {font-size: 12.5px; color: #334155; margin-right: 6px; min-width: 70px}
.kv-tv-ans, .kv-tv-sent-tok {font-family: ui-monospace, monospace; padding: 1px 4px; border-radius: 4px;
  border: 1px solid #cbd5e1; white-space: pre}
.kv-tv-ans {cursor: pointer; background: #f8fafc}
.kv-tv-ans.kv-tv-active {outline: 2px solid #b45309; background: #fef3c7}
.kv-tv-ans.kv-tv-off {cursor: default; color: #475569}
.kv-tv-sent-tok.kv-tv-lit {outline: 2px solid #b45309}
.kv-tv-sent-tok.kv-tv-skip {border-style: dashed; color: #475569}
.kv-tv-nothing {font-style: italic; color: #334155; margin: 6px 0}
.kv-tv-controls {font-size: 12.5px; margin: 6px 0; display: flex; gap: 8px; flex-wrap: wrap; align-items: center}
.kv-tv-pick {font-size: 12px; padding: 0 6px; border: 1px solid #94a3b8; border-radius: 4px; background: #ffffff}
.kv-tv-grid {border-collapse: collapse; font-size: 11px}
.kv-tv-grid th {font-weight: 400; color: #334155; padding: 0 4px; text-align: left; white-space: nowrap}
.kv-tv-cell {width: 22px; height: 14px; border: 1px solid #cbd5e1; cursor: pointer; background: #ffffff}
.kv-tv-cell.on {background: #005ab5}
.kv-tv-sinklayer th {color: #475569}
.kv-tv-mark {font-size: 10.5px}
.kv-tv-empty {color: #334155; font-style: italic}
.kv-tv-chg {font-family: ui-monospace, monospace; padding: 1px 4px; border-radius: 4px; border: 1px solid #cbd5e1;
  white-space: pre; cursor: help}
.kv-tv-change-note {font-size: 12.5px; color: #334155; margin: 2px 0 6px 0}
"""
