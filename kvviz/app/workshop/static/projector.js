// The projector (/workshop/projector/CODE): the board in large type, read with the class's read-only
// projector key (no names, no controls); the key leaves the address bar as the host token does.
const CODE = document.body.dataset.code;
const STORE = 'kvviz-projector-' + CODE;
if (location.hash.length > 1) sessionStorage.setItem(STORE, decodeURIComponent(location.hash.slice(1)));
history.replaceState(null, '', location.pathname);
const KEY = sessionStorage.getItem(STORE) || '';
let drawn = '';

async function poll() {
  let board;
  try { board = await call('GET', `/workshop/api/classes/${CODE}/projector`, undefined, {'X-Projector-Key': KEY}); }
  catch (error) { $('error').textContent = error.message; return; }
  $('error').textContent = '';
  const seen = JSON.stringify(board);
  if (seen === drawn) return;
  drawn = seen;
  $('join-slot').replaceChildren(joinView(board));
  $('focus-box').replaceChildren(focusView(board, focusCard(board)));
}
poll(); setInterval(poll, 700);
