// What every workshop page shares: building elements (text always as text, never as HTML), calling
// the JSON API, the bars of a tally, learners' text isolated in <bdi>.
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'style') Object.assign(node.style, v);  // through the CSSOM: the pages allow no inline style
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined)
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}
const typed = (text) => el('bdi', {}, text);  // what a person typed, in its own direction
async function call(method, path, body, headers) {
  const options = {method, headers: {...(headers || {})}};
  if (body !== undefined) { options.headers['Content-Type'] = 'application/json'; options.body = JSON.stringify(body); }
  const response = await fetch(path, options);
  const data = (response.headers.get('content-type') || '').includes('json') ? await response.json() : await response.text();
  if (!response.ok) throw new Error((data && data.error) || ('HTTP ' + response.status));
  return data;
}
function bars(tally, labels) {
  const total = Math.max(1, tally.total);
  const keys = Object.keys(labels || {}).length ? Object.keys(labels) : Object.keys(tally.counts);
  for (const key of Object.keys(tally.counts)) if (!keys.includes(key)) keys.push(key);
  return keys.map((key) => {
    const n = tally.counts[key] || 0;
    return el('div', {class: 'bar'}, el('span', {class: 'label'}, typed((labels && labels[key]) || key)),
              el('span', {class: 'fill', style: {width: `${Math.round(50 * n / total)}%`}}), el('b', {}, n));
  });
}
