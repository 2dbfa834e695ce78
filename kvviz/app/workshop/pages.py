"""The workshop's pages: plain HTML and a little JavaScript over the JSON API (``api``), so that they
load fast on a phone and on a projector. Every text that comes from the server or a person is put
in the page with ``textContent`` (never as HTML). The host board and the learner's page poll the
API every half second, so a prediction shows on the board within a second of being made."""

from __future__ import annotations

import html

STYLE = """
:root { --ink:#1d2433; --muted:#4a5568; --line:#d5dbe5; --right:#17663a; --wrong:#a3261b; --accent:#1f4fa8; }
* { box-sizing: border-box; }
body { margin:0; font:17px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--ink); background:#f6f7fb; }
main { max-width: 760px; margin: 0 auto; padding: 16px; }
main.wide { max-width: 1240px; }
h1 { font-size: 1.5em; margin: 0.2em 0 0.4em; } h2 { font-size: 1.2em; margin: 0.6em 0 0.3em; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 16px; margin:12px 0; }
.muted { color:var(--muted); } .note { background:#eef2fa; border-radius:6px; padding:6px 10px; }
button, input { font: inherit; } input { padding:10px; border:1px solid #8a94a6; border-radius:8px; width:100%; }
button { padding:10px 16px; border-radius:8px; border:1px solid var(--accent); background:var(--accent); color:#fff;
         cursor:pointer; min-height:44px; }
button.plain { background:#fff; color:var(--accent); } button:disabled { opacity:.55; cursor:default; }
.choices { display:grid; gap:8px; } .choices button { text-align:left; }
.row { display:flex; gap:8px; flex-wrap:wrap; align-items:center; }
.error { color:var(--wrong); font-weight:600; } .error:empty { display:none; }
.right { color:var(--right); font-weight:700; } .wrong { color:var(--wrong); font-weight:700; }
.bar { display:flex; align-items:center; gap:8px; margin:4px 0; }
.bar .fill { background:var(--accent); height:1.1em; border-radius:3px; min-width:2px; }
.bar .label { flex: 0 0 40%; } .code { font-family: ui-monospace, monospace; letter-spacing: .12em; }
table { border-collapse: collapse; width:100%; } td, th { text-align:left; padding:6px; border-bottom:1px solid var(--line); }
.grid { display:grid; grid-template-columns: 1fr 1fr; gap: 16px; }
@media (max-width: 700px) { .grid { grid-template-columns: 1fr; } }
body.projector { font-size: 24px; } body.projector main { max-width: none; padding: 24px 48px; }
body.projector .controls, body.projector td.muted { display:none; } body.projector .bar .fill { height: 1.3em; }
body.projector h1 { font-size: 1.6em; }
"""

COMMON_JS = """
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v; else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined)
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}
async function call(method, path, body, headers) {
  const options = {method, headers: {'Content-Type': 'application/json', ...(headers || {})}};
  if (body !== undefined) options.body = JSON.stringify(body);
  const response = await fetch(path, options);
  const data = response.headers.get('content-type', '').includes('json') ? await response.json() : await response.text();
  if (!response.ok) throw new Error((data && data.error) || ('HTTP ' + response.status));
  return data;
}
function bars(tally, labels) {
  const total = Math.max(1, tally.total);
  const keys = Object.keys(labels || {}).length ? Object.keys(labels) : Object.keys(tally.counts);
  for (const key of Object.keys(tally.counts)) if (!keys.includes(key)) keys.push(key);
  return keys.map((key) => {
    const n = tally.counts[key] || 0;
    return el('div', {class: 'bar'}, el('span', {class: 'label'}, (labels && labels[key]) || key),
              el('span', {class: 'fill', style: `width:${Math.round(50 * n / total)}%`}), el('b', {}, n));
  });
}
"""

LANDING_JS = """
$('join').addEventListener('submit', async (event) => {
  event.preventDefault(); $('join-error').textContent = '';
  try {
    const seat = await call('POST', '/workshop/api/join', {code: $('code').value, name: $('name').value});
    localStorage.setItem('kvviz-learner-' + seat.code, JSON.stringify(seat));
    location.href = '/workshop/class/' + seat.code;
  } catch (error) { $('join-error').textContent = error.message; }
});
$('make').addEventListener('click', async () => {
  $('make-error').textContent = '';
  try {
    const made = await call('POST', '/workshop/api/classes', {mode: $('self').checked ? 'self' : 'paced'});
    location.href = made.host_link;
  } catch (error) { $('make-error').textContent = error.message; }
});
"""

LEARNER_JS = """
const CODE = document.body.dataset.code;
const KEY = 'kvviz-learner-' + CODE;
let seat = JSON.parse(localStorage.getItem(KEY) || 'null');
let state = null, current = null, shown = {};
const auth = () => ({'X-Learner-Token': seat.token});

function showJoin() {
  $('join').hidden = false; $('flow').hidden = true;
}
$('join').addEventListener('submit', async (event) => {
  event.preventDefault(); $('error').textContent = '';
  try {
    seat = await call('POST', '/workshop/api/join', {code: CODE, name: $('name').value});
    localStorage.setItem(KEY, JSON.stringify(seat)); $('join').hidden = true; $('flow').hidden = false; poll();
  } catch (error) { $('error').textContent = error.message; }
});

function pick(view) {
  const cards = view.cards;
  if (view.mode === 'paced') {
    const open = cards.filter((c) => view.open.includes(c.key));
    return open.length ? open[open.length - 1] : null;
  }
  if (current && cards.some((c) => c.key === current && !shown[c.key + ':done'])) return cards.find((c) => c.key === current);
  return cards.find((c) => !shown[c.key + ':done']) || null;
}

async function predict(card, value) {
  $('error').textContent = '';
  try { await call('POST', '/workshop/api/predict', {exercise: card.key, value: String(value)}, auth()); await poll(); }
  catch (error) { $('error').textContent = error.message; }
}

function askView(card) {
  const mine = state.mine[card.key];
  const parts = [el('div', {class: 'muted'}, `Exercise ${card.index} of ${state.exercises.length} · ${card.topic}`),
                 el('h2', {}, card.title),
                 el('p', {}, el('b', {}, 'Question: '), card.query),
                 card.note ? el('p', {class: 'note'}, el('b', {}, 'Note (only the sharer reads it): '), card.note) : null,
                 el('p', {}, card.ask)];
  if (mine) {
    parts.push(el('p', {id: 'saved'}, 'Your prediction: ', el('b', {}, labelOf(card, mine.value)),
                  state.revealed.includes(card.key) || state.mode === 'self' ? '' : '. Waiting for the host to reveal the run.'));
  } else if (card.predict === 'choice') {
    parts.push(el('div', {class: 'choices'}, card.choices.map((c) =>
      el('button', {class: 'plain', 'data-value': c.value, onclick: () => predict(card, c.value)}, c.label))));
  } else {
    const input = el('input', {id: 'answer', inputmode: card.predict === 'number' ? 'decimal' : 'text',
                               placeholder: card.predict === 'number' ? 'a number' : 'a word or two', maxlength: '80'});
    parts.push(el('div', {class: 'row'}, input, el('button', {id: 'send', onclick: () => predict(card, input.value)}, 'Predict')));
  }
  return el('div', {class: 'card', id: 'exercise', 'data-key': card.key}, parts);
}

function labelOf(card, value) {
  const found = card.choices.find((c) => c.value === value);
  return found ? found.label : value;
}

async function revealView(card) {
  const data = await call('GET', '/workshop/api/reveal/' + card.key, undefined, auth());
  const mine = data.mine;
  const verdict = mine ? (mine.right ? el('span', {class: 'right', id: 'verdict'}, 'You were right.')
                                     : el('span', {class: 'wrong', id: 'verdict'}, 'Not this time.')) : null;
  const labels = Object.fromEntries(card.choices.map((c) => [c.value, c.label]));
  return el('div', {class: 'card', id: 'reveal'},
    el('p', {}, verdict, ' The run: ', el('b', {}, data.answer)),
    el('table', {}, data.said.map((s) => el('tr', {}, el('td', {}, s.column), el('td', {}, s.answer || '(no answer)'),
      el('td', {class: 'muted'}, s.swapped ? `swapped note: ${s.swapped}` : '')))),
    el('p', {}, data.explain),
    data.lab_link ? el('p', {}, el('a', {href: data.lab_link, target: '_blank', id: 'lab-link'}, 'See the whole run in the lab')) : null,
    el('h2', {}, `The room (${data.room.total})`), bars(data.room, labels),
    state.mode === 'self' ? el('button', {id: 'next', onclick: () => { shown[card.key + ':done'] = true; current = null; poll(); }}, 'Next') : null);
}

function pinnedView() {
  if (!state.pinned.length) return null;
  return el('div', {class: 'card', id: 'pinned'}, el('b', {}, 'Runs from the host: '),
    state.pinned.map((run) => el('span', {}, el('a', {href: '/r/' + run.id, target: '_blank'}, run.title), ' ')));
}

async function poll() {
  if (!seat) return showJoin();
  try { state = await call('GET', '/workshop/api/me', undefined, auth()); }
  catch (error) {
    if (/not joined/.test(error.message)) { localStorage.removeItem(KEY); seat = null; showJoin(); }
    $('error').textContent = error.message; return;
  }
  $('who').textContent = `${state.name} · class ${state.code}`;
  const card = pick(state);
  current = card ? card.key : null;
  const key = (card ? card.key + ':' + JSON.stringify(state.mine[card.key] || null) + ':' + state.revealed.includes(card.key)
               : 'none') + JSON.stringify(state.pinned);
  if (key === shown.last) return;
  shown.last = key;
  const box = $('flow-body');
  if (!card) {
    box.replaceChildren(el('div', {class: 'card muted', id: 'waiting'},
      state.mode === 'paced' ? 'Waiting for the host to open the next exercise.' : 'That was the last exercise. Thank you!'));
    return;
  }
  const parts = [askView(card), pinnedView()];
  const revealed = state.revealed.includes(card.key) || (state.mode === 'self' && state.mine[card.key]);
  if (revealed) parts.push(await revealView(card));
  box.replaceChildren(...parts.filter(Boolean));
}
if (seat) { $('join').hidden = true; $('flow').hidden = false; } else showJoin();
poll(); setInterval(poll, 700);
"""

HOST_JS = """
const CODE = document.body.dataset.code;
const PROJECTOR = document.body.classList.contains('projector');
if (location.hash.length > 1) sessionStorage.setItem('kvviz-host-' + CODE, location.hash.slice(1));
const TOKEN = sessionStorage.getItem('kvviz-host-' + CODE) || '';
let SESSION = sessionStorage.getItem('kvviz-host-session') || Math.random().toString(36).slice(2) + Date.now().toString(36);
sessionStorage.setItem('kvviz-host-session', SESSION);
const auth = () => ({'X-Host-Token': TOKEN, 'X-Host-Session': SESSION});
let board = null;
$('projector').href = '?projector=1#' + TOKEN;  // a tab of its own: it keeps the token after '#' too
$('join-url').textContent = location.host + '/workshop';

async function control(change) {
  $('error').textContent = ''; $('takeover').hidden = true;
  try { await call('POST', `/workshop/api/classes/${CODE}/host`, change, auth()); await poll(); }
  catch (error) { $('error').textContent = error.message; $('takeover').hidden = !/another host page/.test(error.message); }
}
$('takeover').addEventListener('click', () => control({take_over: true}));
$('pin').addEventListener('submit', async (event) => {
  event.preventDefault(); $('error').textContent = '';
  const run = $('pin-id').value.trim().split('/r/').pop();
  try { await call('POST', `/workshop/api/classes/${CODE}/pins`, {run}, auth()); $('pin-id').value = ''; }
  catch (error) { $('error').textContent = error.message; }
});
$('mode').addEventListener('click', () => control({mode: board.mode === 'paced' ? 'self' : 'paced'}));
$('export').addEventListener('click', async () => {
  try {
    const csv = await call('GET', `/workshop/api/classes/${CODE}/export.csv`, undefined, auth());
    const link = el('a', {href: URL.createObjectURL(new Blob([csv], {type: 'text/csv'})), download: `kvviz-class-${CODE}.csv`});
    document.body.append(link); link.click(); link.remove();
  } catch (error) { $('error').textContent = error.message; }
});
$('delete').addEventListener('click', async () => {
  if (!confirm('Delete this class, its learners and all their answers?')) return;
  try { await call('DELETE', `/workshop/api/classes/${CODE}`, undefined, auth()); location.href = '/workshop'; }
  catch (error) { $('error').textContent = error.message; }
});

function exerciseRow(card) {
  const open = board.open.includes(card.key), revealed = board.revealed.includes(card.key);
  const tally = board.exercises_board[card.key];
  return el('tr', {'data-key': card.key}, el('td', {}, `${card.index}. ${card.title}`),
    el('td', {}, `${tally.total} answered`),
    el('td', {class: 'controls'},
      el('button', {class: 'plain', disabled: open || board.mode === 'self' ? 'disabled' : null, 'data-open': card.key,
                    onclick: () => control({open: card.key})}, open ? 'Open' : 'Open it'), ' ',
      el('button', {disabled: revealed ? 'disabled' : null, 'data-reveal': card.key,
                    onclick: () => control({reveal: card.key})}, revealed ? 'Revealed' : 'Reveal')));
}

function focusCard() {
  const cards = board.cards;
  const open = cards.filter((c) => board.open.includes(c.key));
  return open.length ? open[open.length - 1] : cards[0];
}

function focusView(card) {
  const tally = board.exercises_board[card.key], reveal = board.reveals[card.key];
  const labels = Object.fromEntries(card.choices.map((c) => [c.value, c.label]));
  const share = tally.graded ? Math.round(100 * tally.right / tally.graded) + '% right' : '';
  const revealed = board.revealed.includes(card.key);
  return el('div', {class: 'card', id: 'focus', 'data-key': card.key},
    el('div', {class: 'muted'}, `Exercise ${card.index} · ${card.topic}`), el('h2', {}, card.title),
    el('p', {}, card.ask),
    el('div', {class: 'grid'},
      el('div', {}, el('h2', {}, 'The room: ', el('span', {id: 'total'}, tally.total), ' ', el('span', {class: 'muted', id: 'share'}, share)),
         bars(tally, labels)),
      el('div', {}, el('h2', {}, 'What the models did'),
         !PROJECTOR || revealed ? [el('p', {}, 'Answer: ', el('b', {id: 'model-answer'}, reveal.answer)),
           el('table', {}, reveal.said.map((s) => el('tr', {}, el('td', {}, s.column), el('td', {}, s.answer || '(no answer)'),
             el('td', {class: 'muted'}, s.swapped ? `swapped: ${s.swapped}` : '')))),
           revealed ? el('p', {}, reveal.explain) : el('p', {class: 'muted'}, 'Hidden from the room until you reveal.')]
         : el('p', {class: 'muted'}, 'Shown after the reveal.'))));
}

let drawn = '';
async function poll() {
  let fresh;
  try { fresh = await call('GET', `/workshop/api/classes/${CODE}/board`, undefined, auth()); }
  catch (error) { $('error').textContent = error.message; return; }
  const seen = JSON.stringify(fresh);
  board = fresh;
  if (seen === drawn) return;  // redraw only what changed, so that a button is not replaced under a click
  drawn = seen;
  $('mode').textContent = board.mode === 'paced' ? 'Paced by you: switch to self-paced' : 'Self-paced: switch to paced';
  $('names').replaceChildren(...(board.names.length ? board.names.map((n) => el('span', {class: 'note'}, n)) : ['No one yet.']));
  $('count').textContent = board.names.length;
  $('rows').replaceChildren(...board.cards.map(exerciseRow));
  $('focus-box').replaceChildren(focusView(focusCard()));
}
poll(); setInterval(poll, 500);
"""


def _page(title: str, body: str, script: str, body_attrs: str = "") -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body {body_attrs}>{body}<script>{COMMON_JS}{script}</script></body></html>")


def landing() -> str:
    body = """<main><h1>kvviz workshop</h1>
<form class='card' id='join'><h2>Join a class</h2><p class='muted'>The code is on the screen. No account: a name is all.</p>
<p><input id='code' placeholder='class code' autocapitalize='characters' maxlength='12' aria-label='class code'></p>
<p><input id='name' placeholder='your name' maxlength='40' aria-label='your name'></p>
<button type='submit'>Join</button><p class='error' id='join-error'></p></form>
<div class='card'><h2>Host a class</h2><p class='muted'>A class code for the projector and a host link: keep the link,
it is shown once and is the only way to control the class.</p>
<p><label><input type='checkbox' id='self' style='width:auto'> learners go at their own pace</label></p>
<button id='make'>Start a class</button><p class='error' id='make-error'></p></div></main>"""
    return _page("kvviz workshop", body, LANDING_JS)


def learner(code: str) -> str:
    code = "".join(ch for ch in code.upper() if ch.isalnum())[:12]
    body = f"""<main><h1>kvviz workshop <span class='muted code'>{code}</span></h1><p class='muted' id='who'></p>
<form class='card' id='join' hidden><h2>Join class <span class='code'>{code}</span></h2>
<p><input id='name' placeholder='your name' maxlength='40' aria-label='your name'></p><button type='submit'>Join</button></form>
<div id='flow' hidden><div id='flow-body'></div></div><p class='error' id='error'></p></main>"""
    return _page(f"kvviz workshop {code}", body, LEARNER_JS, f"data-code='{code}'")


def host(code: str, projector: bool = False) -> str:
    code = "".join(ch for ch in code.upper() if ch.isalnum())[:12]
    body = f"""<main class='wide'><div class='row' style='justify-content:space-between'>
<h1>Class <span class='code' id='class-code'>{code}</span></h1>
<p>Join at <b id='join-url'>/workshop</b> with code <b class='code'>{code}</b> · <b id='count'>0</b> joined</p></div>
<p class='error' id='error'></p><button id='takeover' hidden>Take over this class here</button>
<div id='focus-box'></div>
<div class='card controls'><div class='row'><button class='plain' id='mode'>…</button>
<button class='plain' id='export'>Export CSV</button><button class='plain' id='delete'>Delete class</button>
<a id='projector' href='?projector=1' target='_blank'>Projector view</a></div>
<form class='row' id='pin'><input id='pin-id' placeholder='a saved run: its id or /r/ link' style='flex:1'>
<button class='plain' type='submit'>Pin to the class</button></form>
<table><tbody id='rows'></tbody></table></div>
<div class='card controls'><h2>Learners</h2><div class='row' id='names'></div></div></main>"""
    attrs = f"data-code='{code}'" + (" class='projector'" if projector else "")
    return _page(f"kvviz class {code}", body, HOST_JS, attrs)
