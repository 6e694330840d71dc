// The console's views. Each takes (root, {args, query}, live), draws into
// root, and returns {stop} to release its timers and streams.

import {
  api, every, ndjson, h, stateBadge, ALERT_CPU, ALERT_FOR_MS, stateBar, fmtBytes, fmtCpu, fmtTime, pct, STATES, VirtualTable,
} from './lib.js';
import { Chart } from './charts.js';
import { historyPanels } from './dashboard.js';

export { fleet } from './dashboard.js';

function countStates(rows) {
  const c = {};
  for (const r of rows) c[r.state] = (c[r.state] || 0) + 1;
  return c;
}

function eventList(events, n = 20) {
  return h('table', { class: 'plain' },
    h('tr', {}, h('th', {}, 'time'), h('th', {}, 'sandbox'), h('th', {}, 'state'), h('th', {}, 'reason')),
    events.slice(-n).reverse().map((e) => h('tr', {},
      h('td', { class: 'dim' }, fmtTime(e.time)),
      h('td', {}, h('a', { href: `#/sandbox/${encodeURIComponent(e.sandbox_id)}`, class: 'mono' }, e.sandbox_id)),
      h('td', {}, e.state ? stateBadge(e.state) : e.type),
      h('td', {}, e.reason, e.message ? h('span', { class: 'dim' }, ` ${e.message}`) : null))));
}

function nodeCards(nodes) {
  return nodes.map((n) => h('div', { class: 'card', 'data-node': n.name },
    h('div', { class: 'label' }, `node ${n.name || '(local)'} · ${n.state}${n.cordoned ? ' · cordoned' : ''}`),
    h('div', { class: 'big' }, pct(n.load.cpu_busy), h('span', { class: 'label' }, ' CPU busy')),
    h('div', {}, `allocated ${fmtCpu(n.allocated.cpu_millis)} / ${fmtCpu(n.allocatable.cpu_millis)}`),
    h('div', {}, `memory ${fmtBytes(n.allocated.memory)} / ${fmtBytes(n.allocatable.memory)}`),
    h('div', {}, `${n.sandboxes} sandboxes · ${n.initializing} creating · ${n.queued} queued`),
    n.load.memory_pressure ? h('div', { class: 'flag' }, 'memory pressure') : null,
    n.load.disk_pressure ? h('div', { class: 'flag' }, 'disk pressure') : null));
}

export function overview(root, _p, live) {
  const alert = h('div');
  const nodesEl = h('div', { class: 'cards' });
  const counts = h('div', { class: 'cards' });
  const events = h('div', { class: 'panel' });
  root.append(h('h1', {}, 'Overview'), alert, h('h2', {}, 'Nodes'), nodesEl,
    h('h2', {}, 'Sandboxes by state'), counts, h('h2', {}, 'Recent events'), events);
  const drawNodes = () => {
    const nodes = live.nodes;
    nodesEl.replaceChildren(...nodeCards(nodes));
    const hotNodes = nodes.filter((n) => live.hot(n.name));
    alert.replaceChildren(...hotNodes.map((n) => h('div', { class: 'alert', role: 'alert', id: 'cpu-alert' },
      `Node ${n.name || '(local)'} has been above ${pct(ALERT_CPU)} CPU for ${ALERT_FOR_MS / 1000} s (now ${pct(n.load.cpu_busy)}).`)));
  };
  drawNodes();
  const stopNodes = live.onNodes(drawNodes);
  const draw = () => {
    const rows = [...live.rows.values()];
    const c = countStates(rows);
    counts.replaceChildren(
      h('div', { class: 'card' }, h('div', { class: 'big', id: 'live-count' }, rows.length), h('div', { class: 'label' }, 'listed'), stateBar(c)),
      ...STATES.filter((s) => c[s]).map((s) => h('a', { class: 'card', href: `#/sandboxes?state=${s}` },
        h('div', { class: 'big' }, c[s]), h('div', { class: 'label' }, s))));
    events.replaceChildren(eventList(live.events));
  };
  draw();
  const off = live.onChange(draw);
  const panels = historyPanels(root, live);
  return { stop() { stopNodes(); off(); panels.stop(); } };
}

// A label selector as the API takes it (k=v, k==v, k!=v, k, !k,
// k in (a,b), k notin (a,b); a comma outside parentheses = and), matched
// here so the table filters without a request per keystroke. A part it
// cannot read matches nothing, as the API would refuse it.
export function parseSelector(text) {
  const parts = [];
  let depth = 0;
  let cur = '';
  for (const c of text) {
    if (c === '(') depth++;
    if (c === ')') depth--;
    if (c === ',' && depth === 0) { parts.push(cur); cur = ''; } else cur += c;
  }
  parts.push(cur);
  const set = (t) => {
    const m = t.trim().match(/^\((.*)\)$/);
    return m ? m[1].split(',').map((v) => v.trim()) : null;
  };
  return parts.map((p) => p.trim()).filter(Boolean).map((t) => {
    let m;
    if ((m = t.match(/^([^!=]+)!=(.*)$/))) return (l) => l[m[1].trim()] !== m[2].trim();
    if ((m = t.match(/^([^!=]+)==?(.*)$/))) return (l) => l[m[1].trim()] === m[2].trim();
    if (t.startsWith('!')) return (l) => !(t.slice(1).trim() in l);
    if ((m = t.match(/^(\S+)\s+(notin|in)\s*(.*)$/))) {
      const vals = set(m[3]);
      if (!vals) return () => false;
      const k = m[1];
      return m[2] === 'in' ? (l) => k in l && vals.includes(l[k]) : (l) => !(k in l) || !vals.includes(l[k]);
    }
    if (/\s/.test(t)) return () => false;
    return (l) => t in l;
  });
}

export function sandboxes(root, { query }, live) {
  const label = h('input', { id: 'filter-label', placeholder: 'label selector, e.g. task=swe,dataset!=v1', size: 40, value: query.get('label') || '' });
  const state = h('select', { id: 'filter-state' }, h('option', { value: '' }, 'any state'), STATES.map((s) => h('option', { value: s }, s)));
  state.value = query.get('state') || '';
  const shown = h('span', { class: 'dim', id: 'shown' });
  const del = h('button', { class: 'danger', id: 'delete-matching', title: 'DELETE /v1/sandboxes?label=…' }, 'Delete matching');
  root.append(h('h1', {}, 'Sandboxes'), h('div', { class: 'toolbar' }, label, state, shown, del));
  const table = new VirtualTable(root, [
    { title: 'id', width: '170px', cell: (r) => h('span', { class: 'mono' }, r.id) },
    { title: 'state', width: '90px', cell: (r) => stateBadge(r.state) },
    { title: 'labels', width: '2fr', cell: (r) => Object.entries(r.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ') },
    { title: 'CPU ↕', width: '130px', sort: (r) => r.cpu_millis, cell: (r) => `${fmtCpu(r.cpu_millis)} / ${fmtCpu(r.cpu_request_millis)}` },
    { title: 'memory ↕', width: '150px', sort: (r) => r.memory_bytes, cell: (r) => `${fmtBytes(r.memory_bytes)} / ${fmtBytes(r.memory_request)}` },
    { title: 'reason', width: '1fr', cell: (r) => r.reason },
    { title: 'created', width: '90px', cell: (r) => fmtTime(r.created_at) },
  ], { height: Math.max(300, window.innerHeight - 170), onClick: (r) => { location.hash = `#/sandbox/${encodeURIComponent(r.id)}`; } });
  table.el.id = 'sandbox-table';
  const draw = () => {
    const sel = parseSelector(label.value);
    const want = state.value;
    const rows = [];
    for (const r of live.rows.values()) {
      if (want && r.state !== want) continue;
      const l = r.labels || {};
      if (sel.every((f) => f(l))) rows.push(r);
    }
    table.setRows(rows);
    shown.textContent = live.loaded ? `${rows.length} of ${live.rows.size}` : 'loading…';
  };
  const refilter = () => {
    const q = new URLSearchParams();
    if (label.value) q.set('label', label.value);
    if (state.value) q.set('state', state.value);
    history.replaceState(null, '', `#/sandboxes${q.toString() ? `?${q}` : ''}`);
    draw();
  };
  label.addEventListener('input', refilter);
  state.addEventListener('change', refilter);
  del.addEventListener('click', async () => {
    if (!label.value.trim()) { alert('Give a label selector first.'); return; }
    if (!confirm(`Delete every live sandbox matching ${label.value}?`)) return;
    try { await api(`/v1/sandboxes?label=${encodeURIComponent(label.value)}`, { method: 'DELETE' }); } catch (e) { alert(e.message); }
  });
  draw();
  const off = live.onChange(draw);
  return { stop: off };
}

function kv(pairs) {
  return h('div', { class: 'kv' }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== '')
    .map(([k, v]) => [h('div', { class: 'k' }, k), h('div', {}, v)]));
}

export function sandbox(root, { args }, live) {
  const id = args[0];
  const ctl = new AbortController();
  const stops = [];
  const head = h('div', { class: 'toolbar' });
  const info = h('div', { class: 'panel' });
  const timeline = h('div', { class: 'panel' });
  const canvas = h('canvas', { class: 'chart', id: 'usage-chart' });
  const lifeCanvas = h('canvas', { class: 'chart', id: 'usage-history' });
  const logs = h('div', { class: 'panel log', id: 'log' });
  const net = h('div', { class: 'panel log', id: 'net' });
  const term = h('div', { id: 'terminal' });
  const termBar = h('div', { class: 'toolbar' });
  // A page the sandbox serves opens on an origin of its own (PORT-ID.host
  // on the ports listener), never beside this console: the API hands out
  // a short-lived link for it.
  const portIn = h('input', { id: 'port', type: 'number', min: '1', max: '65535', value: '8000', style: 'width: 6em' });
  const portBar = h('div', { class: 'toolbar' }, 'Port', portIn, h('button', { id: 'open-port', onclick: async () => {
    const tab = window.open('', '_blank');
    try {
      const link = await api(`${path}/ports/${encodeURIComponent(portIn.value)}`);
      if (tab) { tab.opener = null; tab.location.href = link.url; }
    } catch (e) {
      if (tab) tab.close();
      alert(`Open port: ${e.message}`);
    }
  } }, 'Open'), h('span', { class: 'dim' }, 'the page the sandbox serves on that port, in a new tab on its own origin.'));
  root.append(h('h1', {}, 'Sandbox ', h('span', { class: 'mono' }, id)), head,
    h('div', { class: 'grid2' },
      h('div', {}, h('h2', {}, 'Spec'), info),
      h('div', {}, h('h2', {}, 'CPU and memory, per second'), h('div', { class: 'panel' }, canvas),
        h('h2', {}, 'Over its life (a sample every 15 s, kept after it and its node are gone)'),
        h('div', { class: 'panel' }, lifeCanvas))),
    h('h2', {}, 'Web page'), portBar,
    h('h2', {}, 'Terminal'), termBar, term,
    h('div', { class: 'grid2' },
      h('div', {}, h('h2', {}, 'State timeline'), timeline),
      h('div', {}, h('h2', {}, 'Network decisions'), net)),
    h('h2', {}, 'Log'), logs);
  const chart = new Chart(canvas, [
    { name: 'CPU', color: '#3fb950', fmt: fmtCpu },
    { name: 'memory', color: '#4fa3ff', fmt: fmtBytes, axis: 'right', bytes: true },
  ], { format: fmtCpu });
  const life = new Chart(lifeCanvas, [
    { name: 'CPU', color: '#3fb950', fmt: fmtCpu },
    { name: 'memory', color: '#4fa3ff', fmt: fmtBytes, axis: 'right', bytes: true },
  ], { format: fmtCpu });
  // The usage samples the control plane kept, and an ended sandbox's
  // usage as it ended: CPU is the rate between two (millicores), memory
  // each one's.
  const drawLife = async () => {
    const samples = [];
    await ndjson(`${path}/logs?usage=true`, (l) => { if (l.usage) samples.push(l); }, ctl.signal);
    // Drawn at once when the page opens, maybe before the first refresh.
    const s = current || await api(path, { signal: ctl.signal });
    const ended = s.finished_at && s.usage ? Date.parse(s.finished_at) : NaN;
    if (ended > (samples.length ? samples[samples.length - 1].time_ms : 0)) {
      samples.push({ time_ms: ended, usage: s.usage });
    }
    const cpu = samples.map((x, i) => {
      const prev = samples[i - 1];
      if (!prev || x.time_ms <= prev.time_ms) return null;
      return Math.max(0, (x.usage.cpu_usage_ns - prev.usage.cpu_usage_ns) / ((x.time_ms - prev.time_ms) * 1000));
    });
    life.set(samples.map((x) => x.time_ms), [cpu, samples.map((x) => x.usage.memory_bytes)]);
  };
  let last = null;
  let current = null;
  const act = (label, fn, cls) => h('button', { class: cls, 'data-action': label, onclick: async () => {
    try { await fn(); await refresh(); } catch (e) { alert(`${label}: ${e.message}`); }
  } }, label);
  const path = `/v1/sandboxes/${encodeURIComponent(id)}`;
  const drawHead = (s) => {
    head.replaceChildren(...[stateBadge(s.state), h('span', { class: 'dim', id: 'reason' }, s.reason),
      s.state === 'running' ? act('Pause', () => api(`${path}/pause`, { method: 'POST' })) : null,
      s.state === 'paused' ? act('Resume', () => api(`${path}/resume`, { method: 'POST' })) : null,
      // A kept sandbox's time is its keep_for, which the API does not extend.
      ['running', 'paused'].includes(s.state) ? act('Extend TTL 1h', () => api(`${path}/ttl`, { method: 'POST', body: { ttl: '1h' } })) : null,
      // Keep the scene when it ends (frozen, files and logs readable).
      ['running', 'paused'].includes(s.state) && s.spec && s.spec.reclaim !== 'keep'
        ? act('Keep when it ends', () => api(`${path}/reclaim`, { method: 'POST', body: { reclaim: 'keep', keep_for: '2h' } })) : null,
      ['destroyed', 'failed', 'lost', 'preempted'].includes(s.state) ? null
        : act(s.state === 'kept' ? 'Destroy (end keep)' : 'Destroy', async () => {
          if (confirm(`Destroy ${id}?`)) await api(path, { method: 'DELETE' });
        }, 'danger')].filter(Boolean));
  };
  const drawTimeline = (events) => {
    timeline.replaceChildren(h('table', { class: 'plain', id: 'timeline' }, events.map((e) => h('tr', {},
      h('td', { class: 'dim' }, fmtTime(e.time)), h('td', {}, e.state ? stateBadge(e.state) : e.type),
      h('td', {}, e.reason, e.message ? h('span', { class: 'dim' }, ` ${e.message}`) : null)))));
  };
  const refresh = async () => {
    const s = await api(path);
    current = s;
    drawHead(s);
    const r = s.resources;
    info.replaceChildren(kv([
      ['image', s.spec.image], ['digest', h('span', { class: 'mono' }, s.image_digest.slice(0, 19))], ['node', s.node || '(local)'],
      // The class it runs in (a queued create has none until it is placed).
      ['isolation', s.spec.isolation || (s.state === 'queued' ? "(its node's default)" : 'container')],
      ['labels', Object.entries(s.spec.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')],
      ['cmd', s.spec.cmd ? JSON.stringify(s.spec.cmd) : '(idle)'],
      ['CPU', `request ${fmtCpu(r.cpu_request_millis ?? r.cpu_millis)}, limit ${fmtCpu(r.cpu_millis)}`],
      ['memory', `request ${fmtBytes(r.memory_request ?? r.memory)}, limit ${fmtBytes(r.memory)}`],
      ['reclaim', `${s.spec.reclaim || 'destroy'}${s.spec.keep_for ? ` (keep for ${s.spec.keep_for})` : ''}`],
      ['network', JSON.stringify(s.spec.network)],
      [s.state === 'kept' ? 'kept for' : 'TTL left', s.ttl_remaining_ms !== undefined ? `${Math.round(s.ttl_remaining_ms / 1000)} s more` : null],
      ['exit code', s.exit_code], ['created', s.created_at], ['finished', s.finished_at],
      ['OOM kills', s.usage ? s.usage.oom_kills : null], ['peak memory', s.usage ? fmtBytes(s.usage.memory_peak_bytes) : null],
    ]));
    drawTimeline(s.events || []);
    const u = s.usage;
    const now = performance.now();
    if (u) {
      const cpu = last && now > last.t ? (u.cpu_usage_ns - last.ns) / ((now - last.t) * 1000) : 0;
      chart.push(Math.max(0, cpu), u.memory_bytes);
      last = { t: now, ns: u.cpu_usage_ns };
    } else {
      chart.push(0, 0);
    }
  };
  stops.push(every(1000, refresh));
  stops.push(every(15000, drawLife));
  // The log: every line as it comes; `"kind":"net"` lines are the
  // network's decisions and go to their own panel.
  ndjson(`${path}/logs?follow=true`, (line) => {
    const text = line.raw || (line.text !== undefined
      ? `${fmtTime(line.time)} ${line.kind || ''}${line.exec_id ? ` ${line.exec_id}` : ''} ${line.text}`
      : JSON.stringify(line));
    const target = line.kind === 'net' ? net : logs;
    const stick = target.scrollTop + target.clientHeight >= target.scrollHeight - 4;
    target.append(h('div', {}, text));
    while (target.childNodes.length > 2000) target.firstChild.remove();
    if (stick) target.scrollTop = target.scrollHeight;
  }, ctl.signal).catch(() => {});
  let session = null;
  const openBtn = h('button', { id: 'open-terminal', onclick: () => {
    if (session) session.close();
    session = openTerminal(term, id, current);
    openBtn.textContent = 'Reconnect';
  } }, 'Open terminal');
  termBar.append(openBtn, h('span', { class: 'dim' }, 'sh in the sandbox, over the exec WebSocket (tty, resize).'));
  const offEv = live.onEvent((ev) => { if (ev.sandbox_id === id) refresh().catch(() => {}); });
  return { stop() { ctl.abort(); stops.forEach((s) => s()); offEv(); if (session) session.close(); } };
}

// xterm.js on the exec WebSocket: the first message is the ExecRequest,
// then binary frames are keystrokes one way and output the other, text
// frames carry resizes and the exec's own events (docs/api.md).
function openTerminal(el, id, s) {
  el.replaceChildren();
  const term = new window.Terminal({ fontSize: 13, cursorBlink: true, convertEol: false, theme: { background: '#000000' } });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const ws = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${encodeURIComponent(id)}/exec/ws`);
  ws.binaryType = 'arraybuffer';
  const enc = new TextEncoder();
  window.__warrenTerm = term;
  ws.addEventListener('open', () => {
    const env = { TERM: 'xterm-256color' };
    ws.send(JSON.stringify({ cmd: ['sh'], tty: true, stdin_open: true, rows: term.rows, cols: term.cols, env }));
    term.focus();
  });
  ws.addEventListener('message', (m) => {
    if (typeof m.data === 'string') {
      let ev;
      try { ev = JSON.parse(m.data); } catch (_) { return; }
      if (ev.type === 'exit') term.write(`\r\n[exited with ${ev.code}]\r\n`);
      else if (ev.type === 'stderr' && ev.data) term.write(Uint8Array.from(atob(ev.data), (c) => c.charCodeAt(0)));
      else if (ev.type === 'error') term.write(`\r\n[${ev.message}]\r\n`);
      else if (ev.error) term.write(`\r\n[${ev.error.message}]\r\n`);
    } else {
      term.write(new Uint8Array(m.data));
    }
  });
  ws.addEventListener('close', (e) => { term.write(`\r\n[connection closed${e.code && e.code !== 1000 ? ` (${e.code})` : ''}]\r\n`); });
  const onData = term.onData((d) => { if (ws.readyState === 1) ws.send(enc.encode(d)); });
  const onResize = term.onResize(({ rows, cols }) => {
    if (ws.readyState === 1) ws.send(JSON.stringify({ resize: { rows, cols } }));
  });
  const observer = new ResizeObserver(() => { try { fit.fit(); } catch (_) { /* detached */ } });
  observer.observe(el);
  return {
    close() { observer.disconnect(); onData.dispose(); onResize.dispose(); ws.close(); term.dispose(); },
  };
}

export function batches(root, { args }, _live) {
  const list = h('div');
  root.append(h('h1', {}, 'Batches'), list);
  const one = args[0];
  const stop = every(2000, async () => {
    const all = one ? [await api(`/v1/batches/${encodeURIComponent(one)}`)] : await api('/v1/batches');
    list.replaceChildren(...all.map((b) => {
      const done = ['destroyed', 'failed', 'lost', 'preempted', 'kept'].reduce((a, s) => a + (b.states[s] || 0), 0);
      return h('div', { class: 'panel', style: 'margin-bottom:12px', 'data-batch': b.id },
        h('div', { class: 'toolbar' },
          h('a', { href: `#/batch/${encodeURIComponent(b.id)}`, class: 'mono' }, b.id),
          h('span', {}, Object.entries(b.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')),
          h('span', { class: 'dim' }, `${b.submitted}/${b.count} submitted · ${done} finished · created ${fmtTime(b.created_at)}`),
          h('a', { href: `#/sandboxes?label=${encodeURIComponent(`warren.dev/batch=${b.id}`)}` }, 'sandboxes')),
        stateBar(b.states, b.count),
        h('div', { class: 'toolbar', style: 'margin-top:6px' },
          Object.entries(b.states).map(([s, n]) => h('span', {}, stateBadge(s), ` ${n}`))),
        // Totals over every member, ended ones as they ended: what the
        // batch cost, in the units a cluster bills.
        h('div', { class: 'cost', 'data-cost': b.id },
          h('span', { class: 'card', 'data-total': 'succeeded' }, h('div', { class: 'big' }, b.succeeded),
            h('div', { class: 'label' }, `succeeded of ${done} ended (${b.failures.length} failed)`)),
          h('span', { class: 'card', 'data-total': 'cpu_seconds' }, h('div', { class: 'big' }, b.cost.cpu_seconds.toFixed(2)),
            h('div', { class: 'label' }, 'CPU-seconds')),
          h('span', { class: 'card', 'data-total': 'memory_gb_seconds' }, h('div', { class: 'big' }, b.cost.memory_gb_seconds.toFixed(3)),
            h('div', { class: 'label' }, 'GB-seconds of memory')),
          h('span', { class: 'card', 'data-total': 'gpu_seconds' }, h('div', { class: 'big' }, b.cost.gpu_seconds.toFixed(1)),
            h('div', { class: 'label' }, 'GPU-seconds')),
          h('span', { class: 'card' }, h('div', { class: 'big' }, fmtBytes(b.usage.memory_peak_bytes)),
            h('div', { class: 'label' }, 'peak memory, summed'))),
        b.failures.length ? h('table', { class: 'plain' },
          h('tr', {}, h('th', {}, 'failed sandbox'), h('th', {}, 'state'), h('th', {}, 'reason'), h('th', {}, 'exit')),
          b.failures.slice(0, 50).map((f) => h('tr', {},
            h('td', {}, h('a', { href: `#/sandbox/${encodeURIComponent(f.sandbox_id)}`, class: 'mono' }, f.sandbox_id)),
            h('td', {}, stateBadge(f.state)), h('td', {}, f.reason), h('td', {}, f.exit_code ?? '')))) : null);
    }));
    if (!all.length) list.replaceChildren(h('p', { class: 'dim' }, 'No batches.'));
  });
  return { stop };
}

export function profiles(root) {
  const list = h('div', { class: 'panel' });
  root.append(h('h1', {}, 'Profiles'), h('p', { class: 'dim' }, 'What each profile started from, what it has learned, and whether growth hit its cap.'), list);
  const draw = async () => {
    const ps = await api('/v1/profiles');
    list.replaceChildren(ps.length ? h('table', { class: 'plain' },
      h('tr', {}, ['profile', 'original CPU', 'learned CPU', 'original memory', 'learned memory', 'runs', 'flag', ''].map((t) => h('th', {}, t))),
      ps.map((p) => h('tr', { 'data-profile': p.name },
        h('td', {}, p.name), h('td', {}, fmtCpu(p.original.cpu_millis)), h('td', {}, fmtCpu(p.current.cpu_millis)),
        h('td', {}, fmtBytes(p.original.memory)), h('td', {}, fmtBytes(p.current.memory)), h('td', {}, p.runs),
        h('td', { class: 'flag' }, p.anomalous ? `anomalous: ${p.anomaly}` : ''),
        h('td', {}, h('button', { onclick: async () => {
          if (!confirm(`Reset profile ${p.name} to its original request?`)) return;
          try { await api(`/v1/profiles/${encodeURIComponent(p.name)}/reset`, { method: 'POST' }); } catch (e) { alert(e.message); }
          draw();
        } }, 'Reset'))))) : h('p', { class: 'dim' }, 'No profiles yet.'));
  };
  const stop = every(5000, draw);
  return { stop };
}

// One tenant's use of one resource against its quota: a bar where it has
// a quota, the figure alone where it has none.
function quotaCell(used, quota, fmt) {
  if (quota === undefined || quota === null) return h('td', {}, `${fmt(used)} / -`);
  const f = quota > 0 ? Math.min(used / quota, 1) : 1;
  return h('td', {},
    h('div', { class: 'bar', title: `${fmt(used)} of ${fmt(quota)}` },
      h('span', { style: `width:${(f * 100).toFixed(1)}%;background:${f >= 1 ? '#f85149' : '#3fb950'}` })),
    h('span', { class: 'dim' }, `${fmt(used)} / ${fmt(quota)}`));
}

export function tenants(root) {
  const list = h('div', { class: 'panel' });
  root.append(h('h1', {}, 'Tenants'),
    h('p', { class: 'dim' }, "What each tenant's live sandboxes request against its quota, its weight in the fair share, and its queue."),
    list);
  const draw = async () => {
    const ts = await api('/v1/tenants');
    const count = (n) => String(n);
    list.replaceChildren(h('table', { class: 'plain' },
      h('tr', {}, ['tenant', 'weight', 'priority', 'CPU', 'memory', 'GPUs', 'sandboxes', 'queued'].map((t) => h('th', {}, t))),
      ts.map((t) => {
        const q = t.quota || {};
        return h('tr', { 'data-tenant': t.name },
          h('td', {}, t.name), h('td', {}, t.weight), h('td', {}, t.priority),
          quotaCell(t.usage.cpu_millis, q.cpu === undefined ? undefined : q.cpu * 1000, fmtCpu),
          quotaCell(t.usage.memory, q.memory, fmtBytes),
          quotaCell(t.usage.gpus, q.gpus, count),
          quotaCell(t.usage.sandboxes, q.sandboxes, count),
          h('td', { class: t.queued ? 'flag' : '' }, t.queued));
      })));
  };
  const stop = every(5000, draw);
  return { stop };
}

export function images(root, _p, live) {
  const list = h('div', { class: 'panel' });
  const ref = h('input', { placeholder: 'registry/repo:tag', size: 40, id: 'prewarm-ref' });
  const msg = h('span', { class: 'dim' });
  // A tenant sees its own images and the shared ones; prewarming every
  // node is the operator's.
  const prewarm = live.operator ? h('div', { class: 'toolbar' }, 'Prewarm on every node:', ref, h('button', { onclick: async () => {
    msg.textContent = 'pulling…';
    try { await api('/v1/images/prewarm', { method: 'POST', body: { reference: ref.value } }); msg.textContent = 'done'; } catch (e) { msg.textContent = e.message; }
    draw();
  } }, 'Prewarm'), msg) : '';
  root.append(h('h1', {}, 'Images'), prewarm, list);
  const draw = async () => {
    const imgs = await api('/v1/images');
    const users = {};
    for (const r of live.rows.values()) users[r.image] = (users[r.image] || 0) + 1;
    list.replaceChildren(h('table', { class: 'plain' },
      h('tr', {}, ['name', 'digest', 'size', 'live sandboxes', ''].map((t) => h('th', {}, t))),
      imgs.map((i) => {
        const names = i.names || (i.name ? [i.name] : []);
        const digest = i.digest || i.manifest_digest || '';
        const n = names.reduce((a, nm) => a + (users[nm] || 0), 0) + (users[digest] || 0);
        return h('tr', {},
          h('td', {}, names.join(', ')), h('td', { class: 'mono' }, digest.slice(0, 19)),
          h('td', {}, fmtBytes(i.size ?? i.size_bytes)),
          h('td', {}, n ? h('a', { href: '#/sandboxes' }, n) : '0'),
          h('td', {}, names[0] && live.operator ? h('button', { onclick: () => { ref.value = names[0]; } }, 'use') : null));
      })));
  };
  const stop = every(5000, draw);
  return { stop };
}

export function nodes(root, _p, live) {
  const cards = h('div', { class: 'cards' });
  const table = h('div', { class: 'panel' });
  root.append(h('h1', {}, 'Nodes'), cards, h('h2', {}, 'Details'), table);
  const draw = () => {
    const ns = live.nodes;
    cards.replaceChildren(...nodeCards(ns));
    table.replaceChildren(h('table', { class: 'plain' },
      h('tr', {}, ['name', 'state', 'labels', 'isolation', 'url', 'last seen'].map((t) => h('th', {}, t))),
      ns.map((n) => h('tr', {}, h('td', {}, n.name), h('td', {}, n.state + (n.cordoned ? ' (cordoned)' : '')),
        h('td', {}, Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')),
        h('td', {}, (n.isolation || ['container']).join(', ')),
        h('td', {}, n.url || '(in process)'), h('td', {}, `${n.last_seen_ms} ms ago`)))));
  };
  draw();
  const stop = live.onNodes(draw);
  return { stop };
}
