// /workshop: join a class with its code and a name, or start one. A new class's host token goes
// straight to this tab's session storage: it never shows in the address bar.
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
    sessionStorage.setItem('kvviz-host-' + made.code, made.host_token);
    location.href = '/workshop/host/' + made.code;
  } catch (error) { $('make-error').textContent = error.message; }
});
