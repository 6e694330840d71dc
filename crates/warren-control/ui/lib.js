// Small helpers of the console: API calls, NDJSON streams, element
// building (text only: nothing from the API is ever parsed as HTML),
// formatting, a timer and a virtualised table (the charts are in
// charts.js).

export class AuthError extends Error {}

// A node whose CPU busy share stays above ALERT_CPU for ALERT_FOR_MS is
// shown in red on the Overview.
export const ALERT_CPU = 0.85;
export const ALERT_FOR_MS = 10_000;

// Every call says it comes from the console (the server refuses a
// cookie-authenticated change without it or a same-origin Origin).
const CONSOLE_HEADERS = { 'X-Warren-Console': '1' };

export async function api(path, { method = 'GET', body, raw = false, signal } = {}) {
  const init = { method, headers: { ...CONSOLE_HEADERS }, credentials: 'same-origin', signal };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) throw new AuthError('not logged in');
  if (!r.ok) {
    let msg = `${r.status}`;
    try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  if (raw) return r;
  if (r.status === 204) return null;
  const text = await r.text();
  return text ? JSON.parse(text) : null;
}

// Reads an NDJSON answer line by line; calls onLine with each parsed object.
export async function ndjson(path, onLine, signal) {
  const r = await api(path, { raw: true, signal });
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    // One pass over the chunk (a replay of the event history can bring
    // thousands of lines at once): cut the rest off once, at the end.
    let start = 0;
    let i;
    while ((i = buf.indexOf('\n', start)) >= 0) {
      const line = buf.slice(start, i);
      start = i + 1;
      if (line.trim()) {
        try { onLine(JSON.parse(line)); } catch (_) { onLine({ raw: line }); }
      }
    }
    buf = buf.slice(start);
  }
}

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'style') el.style.cssText = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function stateBadge(s) { return h('span', { class: `state ${s}` }, s); }

export function fmtBytes(b) {
  if (b === undefined || b === null) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(b >= 10 || i === 0 ? 0 : 1)} ${u[i]}`;
}

export function fmtCpu(m) {
  if (m === undefined || m === null) return '–';
  return m >= 1000 ? `${(m / 1000).toFixed(2)} cores` : `${Math.round(m)}m`;
}

export function fmtTime(t) {
  if (!t) return '';
  const d = new Date(t);
  return isNaN(d) ? t : d.toLocaleTimeString();
}

export function pct(x) { return `${(x * 100).toFixed(0)}%`; }

export const STATES = ['queued', 'creating', 'running', 'paused', 'stopping', 'kept', 'failed', 'lost', 'preempted', 'destroyed'];
export const STATE_COLOR = {
  queued: '#e3b341', creating: '#d29922', running: '#3fb950', paused: '#a371f7', stopping: '#8a95a3',
  kept: '#4fa3ff', failed: '#f85149', lost: '#ff7b72', preempted: '#d29922', destroyed: '#484f58',
};

// A stacked bar of counts by state.
export function stateBar(counts, total) {
  const t = total || Object.values(counts).reduce((a, b) => a + b, 0) || 1;
  return h('div', { class: 'bar' }, STATES.filter((s) => counts[s]).map((s) =>
    h('span', { title: `${s}: ${counts[s]}`, style: `width:${(100 * counts[s]) / t}%;background:${STATE_COLOR[s]}` })));
}

// Runs fn now and then every ms after each run ends; returns a function
// that stops it. stop.now() runs it at once (a run under way is followed
// by one more, never two at a time).
export function every(ms, fn) {
  let t = 0;
  let stopped = false;
  let busy = false;
  let again = false;
  const run = async () => {
    if (busy) { again = true; return; }
    busy = true;
    do {
      again = false;
      try { await fn(); } catch (_) { /* drawn as an error by fn, retried */ }
    } while (again && !stopped);
    busy = false;
    if (!stopped) t = setTimeout(run, ms);
  };
  const stop = () => { stopped = true; clearTimeout(t); };
  stop.now = () => { clearTimeout(t); run(); };
  run();
  return stop;
}

// A table that renders only the rows in view (plus a margin), so ten
// thousand rows cost what forty do. Rows are absolutely positioned inside a
// spacer as tall as all of them.
export class VirtualTable {
  constructor(root, columns, { rowHeight = 26, height = 560, onClick } = {}) {
    this.columns = columns;
    this.rowHeight = rowHeight;
    this.rows = [];
    this.onClick = onClick;
    this.sort = null;
    const grid = columns.map((c) => c.width || '1fr').join(' ');
    this.el = h('div', { class: 'vt', style: `height:${height}px` });
    this.head = h('div', { class: 'head', style: `grid-template-columns:${grid}` },
      columns.map((c) => h('span', { onclick: () => this.sortBy(c), title: c.sort ? 'sort' : '' }, c.title)));
    this.spacer = h('div', { style: 'position:relative' });
    this.el.append(this.head, this.spacer);
    this.grid = grid;
    this.el.addEventListener('scroll', () => this.schedule(), { passive: true });
    root.append(this.el);
    this.frame = 0;
  }

  sortBy(col) {
    if (!col.sort) return;
    this.sort = this.sort && this.sort.col === col ? { col, dir: -this.sort.dir } : { col, dir: -1 };
    this.setRows(this.rows);
  }

  setRows(rows) {
    if (this.sort) {
      const { col, dir } = this.sort;
      rows = rows.slice().sort((a, b) => dir * ((col.sort(a) ?? -1) - (col.sort(b) ?? -1)));
    }
    this.rows = rows;
    this.spacer.style.height = `${rows.length * this.rowHeight}px`;
    this.schedule();
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.render(); });
  }

  render() {
    const top = this.el.scrollTop;
    const view = this.el.clientHeight;
    const first = Math.max(0, Math.floor(top / this.rowHeight) - 10);
    const last = Math.min(this.rows.length, Math.ceil((top + view) / this.rowHeight) + 10);
    const out = [];
    for (let i = first; i < last; i++) {
      const r = this.rows[i];
      const row = h('div', {
        class: 'row', style: `top:${i * this.rowHeight}px;grid-template-columns:${this.grid}`,
        'data-id': r.id, onclick: () => this.onClick && this.onClick(r),
      }, this.columns.map((c) => h('span', {}, c.cell(r))));
      out.push(row);
    }
    this.spacer.replaceChildren(...out);
    // The first paint with rows, for scripts/bench-console.py.
    if (out.length && !window.warrenFirstRows) window.warrenFirstRows = performance.now();
    this.el.dataset.rendered = String(out.length);
    this.el.dataset.total = String(this.rows.length);
  }
}
