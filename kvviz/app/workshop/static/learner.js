// A learner's page (/workshop/class/CODE): join, then the exercise the host opened (or the next one,
// self-paced): predict once, then after the reveal the run, the explanation and the room's counts.
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
  const mine = state.mine[card.key], revealed = state.revealed.includes(card.key);
  const parts = [el('div', {class: 'muted'}, `Exercise ${card.index} of ${state.exercises.length} · ${card.topic}`),
                 el('h2', {}, card.title),
                 el('p', {}, el('b', {}, 'Question: '), card.query),
                 card.note ? el('p', {class: 'note'}, el('b', {}, 'Note (only the sharer reads it): '), card.note) : null,
                 el('p', {}, card.ask)];
  if (mine) {
    parts.push(el('p', {id: 'saved'}, 'Your prediction: ', el('b', {}, typed(labelOf(card, mine.value))),
                  revealed || state.mode === 'self' ? '' : '. Waiting for the host to reveal the run.'));
  } else if (revealed) {
    parts.push(el('p', {class: 'muted', id: 'closed'}, 'Predictions are closed: the host has revealed the run.'));
  } else if (card.predict === 'choice') {
    parts.push(el('div', {class: 'choices'}, card.choices.map((c) =>
      el('button', {class: 'plain', 'data-value': c.value, onclick: () => predict(card, c.value)}, c.label))));
  } else {
    const input = el('input', {id: 'answer', inputmode: card.predict === 'number' ? 'decimal' : 'text',
                               placeholder: card.predict === 'number' ? 'a number' : 'a word or two',
                               maxlength: document.body.dataset.maxValue});
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
    state.pinned.map((run) => el('span', {}, el('a', {href: '/r/' + run.id, target: '_blank'}, typed(run.title)), ' ')));
}

async function poll() {
  if (!seat) return showJoin();
  try { state = await call('GET', '/workshop/api/me', undefined, auth()); }
  catch (error) {
    if (/not joined/.test(error.message)) { localStorage.removeItem(KEY); seat = null; showJoin(); }
    $('error').textContent = error.message; return;
  }
  $('who').replaceChildren(typed(state.name), ` · class ${state.code}`);
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
