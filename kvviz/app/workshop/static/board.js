// The class board, drawn the same on the host's page and on the projector: the exercise in focus,
// the room's counts, what the models did (after the reveal; the host may peek on its own screen),
// and where phones join, with its QR code.
function focusCard(board) {
  const open = board.cards.filter((c) => board.open.includes(c.key));
  return open.length ? open[open.length - 1] : board.cards[0];
}

function modelsView(board, card, peeking) {
  const reveal = board.reveals[card.key], revealed = board.revealed.includes(card.key);
  if (!reveal || !(revealed || peeking)) {
    return el('p', {class: 'hidden-answer', id: 'model-hidden'}, 'Hidden until the reveal.');
  }
  return [el('p', {}, 'Answer: ', el('b', {id: 'model-answer'}, reveal.answer)),
    el('table', {}, reveal.said.map((s) => el('tr', {}, el('td', {}, s.column), el('td', {}, s.answer || '(no answer)'),
      el('td', {class: 'muted'}, s.swapped ? `swapped: ${s.swapped}` : '')))),
    revealed ? el('p', {}, reveal.explain) : el('p', {class: 'muted'}, 'Only on this screen: the room does not see it until you reveal.')];
}

function focusView(board, card, extra) {
  const tally = board.exercises_board[card.key];
  const labels = Object.fromEntries(card.choices.map((c) => [c.value, c.label]));
  const share = tally.graded ? Math.round(100 * tally.right / tally.graded) + '% right' : '';
  return el('div', {class: 'card', id: 'focus', 'data-key': card.key},
    el('div', {class: 'muted'}, `Exercise ${card.index} · ${card.topic}`), el('h2', {}, card.title),
    el('p', {}, card.ask),
    el('div', {class: 'grid'},
      el('div', {}, el('h2', {}, 'The room: ', el('span', {id: 'total'}, tally.total), ' ', el('span', {class: 'muted', id: 'share'}, share)),
         bars(tally, labels)),
      el('div', {}, el('h2', {}, 'What the models did', extra || null), modelsView(board, card, board.peeking))));
}

function joinView(board) {
  const join = board.join;
  return el('div', {class: 'join', id: 'join-box'},
    el('img', {id: 'join-qr', src: `/workshop/join/${board.code}.svg`, alt: `QR code: ${join.url}`}),
    el('div', {}, el('div', {class: 'muted'}, 'Join on your phone at'), el('div', {class: 'address', id: 'join-url'}, join.shown),
       el('div', {}, 'with code ', el('b', {class: 'code'}, board.code), ' · ', el('b', {id: 'count'}, board.joined), ' joined'),
       el('p', {class: 'warning', id: 'join-warning'}, join.warning || '')));
}
