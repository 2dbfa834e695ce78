// The host's page (/workshop/host/CODE): the host token arrives after '#' (the host link) or from
// the page that made the class; it goes to this tab's session storage and leaves the address bar at
// once, so that a projected screen or a shared history never shows it.
const CODE = document.body.dataset.code;
const STORE = 'kvviz-host-' + CODE;
if (location.hash.length > 1) sessionStorage.setItem(STORE, decodeURIComponent(location.hash.slice(1)));
history.replaceState(null, '', location.pathname);
const TOKEN = sessionStorage.getItem(STORE) || '';
let SESSION = sessionStorage.getItem('kvviz-host-session') || Math.random().toString(36).slice(2) + Date.now().toString(36);
sessionStorage.setItem('kvviz-host-session', SESSION);
const auth = () => ({'X-Host-Token': TOKEN, 'X-Host-Session': SESSION});
let board = null, drawn = '', peekUntil = 0;

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
$('copy-link').addEventListener('click', async () => {
  const link = `${location.origin}/workshop/host/${CODE}#${TOKEN}`;
  try { await navigator.clipboard.writeText(link); }
  catch (error) {  // no clipboard API on a plain-http network address: the older way
    const box = el('textarea', {class: 'offscreen'}, link); document.body.append(box); box.select();
    document.execCommand('copy'); box.remove();
  }
  $('copied').textContent = 'Host link copied. Keep it private: it is the only way back to this class.';
});
$('peek').addEventListener('click', () => { peekUntil = Date.now() + 8000; draw(true); setTimeout(() => draw(true), 8100); });

function exerciseRow(card) {
  const open = board.open.includes(card.key), revealed = board.revealed.includes(card.key);
  const answerable = board.mode === 'self' || open;
  return el('tr', {'data-key': card.key}, el('td', {}, `${card.index}. ${card.title}`),
    el('td', {}, `${board.exercises_board[card.key].total} answered`),
    el('td', {},
      el('button', {class: 'plain', disabled: open || board.mode === 'self' ? 'disabled' : null, 'data-open': card.key,
                    onclick: () => control({open: card.key})}, open ? 'Open' : 'Open it'), ' ',
      el('button', {disabled: revealed || !answerable ? 'disabled' : null, 'data-reveal': card.key,
                    title: answerable ? null : 'Open it first', onclick: () => control({reveal: card.key})},
         revealed ? 'Revealed' : 'Reveal')));
}

function draw(force) {
  if (!board) return;
  board.peeking = Date.now() < peekUntil;
  $('mode').textContent = board.mode === 'paced' ? 'Paced by you: switch to self-paced' : 'Self-paced: switch to paced';
  $('names').replaceChildren(...(board.names.length ? board.names.map((n) => el('span', {class: 'note'}, typed(n))) : ['No one yet.']));
  $('rows').replaceChildren(...board.cards.map(exerciseRow));
  $('join-slot').replaceChildren(joinView(board));
  $('focus-box').replaceChildren(focusView(board, focusCard(board)));
  $('peek').disabled = board.revealed.includes(focusCard(board).key);
  $('projector').href = `/workshop/projector/${CODE}#${board.projector_key}`;
}

async function poll() {
  let fresh;
  try { fresh = await call('GET', `/workshop/api/classes/${CODE}/board`, undefined, auth()); }
  catch (error) { $('error').textContent = error.message; return; }
  const seen = JSON.stringify(fresh);
  board = fresh;
  if (seen === drawn) return;  // redraw only what changed, so that a button is not replaced under a click
  drawn = seen;
  draw();
}
if (!TOKEN) $('error').textContent = `This tab holds no host link for class ${CODE}: open the host link you kept.`;
else control({}).then(() => setInterval(poll, 500));
