// The training dashboard's parts: the Fleet view (GET /v1/fleet: a label's
// values × every state and outcome over a window, with success rate, use
// against request and limit, throttling and totals) and the Overview's
// history (GET /v1/history: node CPU heat with the alert line, the alert
// events, queue length and create latency over time).

import { api, every, h, stateBadge, fmtBytes, fmtCpu, fmtTime, pct, ALERT_CPU } from './lib.js';
import { Chart, Heat, fmtNum, usageBar } from './charts.js';

export const WINDOWS = ['15m', '1h', '6h', '24h'];
// Columns that are a state a sandbox lives in (the others are outcomes):
// only these have live sandboxes to list.
const LIVE = new Set(['queued', 'creating', 'running', 'paused', 'stopping', 'kept']);

const fmtRate = (x) => (x === undefined || x === null ? '–' : pct(x));
const fmtShare = (x) => (x === undefined || x === null ? '–' : `${(x * 100).toFixed(1)}%`);

// One row of the fleet table. `group` is the row's name for tests and the
// drill-down's selector part (null: no drill-down).
function fleetRow(g, columns, name, sel, cls) {
  return h('tr', { 'data-group': name, class: cls },
    h('th', {}, name),
    columns.map((c) => {
      const n = g.counts[c] || 0;
      if (!n) return h('td', { class: 'dim', 'data-col': c }, '·');
      const drill = sel !== null && LIVE.has(c);
      return h('td', {
        class: drill ? 'cell' : '', 'data-col': c, 'data-value': name, 'data-state': c,
        onclick: drill ? () => { location.hash = `#/sandboxes?label=${encodeURIComponent(sel)}&state=${encodeURIComponent(c)}`; } : undefined,
      }, h('div', { class: 'n' }, n));
    }),
    h('td', { 'data-col': 'success', title: `${g.succeeded} of ${g.ended} ended` }, fmtRate(g.success_rate),
      g.ended ? h('div', { class: 'u' }, `${g.succeeded} / ${g.ended}`) : null),
    h('td', { 'data-col': 'cpu' }, g.measured ? usageBar(g.cpu.used_millis, g.cpu.request_millis, g.cpu.limit_millis, fmtCpu) : '–'),
    h('td', { 'data-col': 'memory' }, g.measured ? usageBar(g.memory.used_bytes, g.memory.request_bytes, g.memory.limit_bytes, fmtBytes) : '–'),
    h('td', { 'data-col': 'throttled', title: `${g.cpu_throttled_periods} of ${g.cpu_periods} CFS periods` }, fmtShare(g.throttled)),
    h('td', { 'data-col': 'cost' }, `${g.cpu_seconds.toFixed(1)} / ${g.memory_gb_seconds.toFixed(2)}`));
}

export function fleet(root, { query }, live) {
  let key = query.get('key') || localStorage.getItem('warren.fleet.key') || 'task';
  let since = query.get('since') || localStorage.getItem('warren.fleet.since') || '1h';
  if (!WINDOWS.includes(since)) WINDOWS.push(since);
  const pick = h('select', { id: 'fleet-key' });
  const windowPick = h('select', { id: 'fleet-window' }, WINDOWS.map((w) => h('option', { value: w }, `last ${w}`)));
  const table = h('div', { class: 'panel' });
  const status = h('span', { class: 'dim', id: 'fleet-status' });
  root.append(h('h1', {}, 'Fleet'),
    h('div', { class: 'toolbar' }, 'Label key', pick, 'Window', windowPick, status),
    h('p', { class: 'dim' }, 'Sandboxes not ended, and those that ended in the window, per value: count per state or outcome '
      + '(click a live one to list them), success = succeeded ÷ ended, CPU (mean over each life) and memory (peak) used / request / limit '
      + '(the mark is the request), throttled = share of CFS periods at the limit.'),
    table);
  // The keys the live sandboxes carry, and the one asked for.
  const keys = () => [...new Set([key, 'task', ...[...live.rows.values()].flatMap((r) => Object.keys(r.labels || {}))])].sort();
  const drawKeys = () => {
    const ks = keys();
    if (pick.options.length !== ks.length || [...pick.options].some((o, i) => o.value !== ks[i])) {
      pick.replaceChildren(...ks.map((k) => h('option', { value: k }, k)));
    }
    pick.value = key;
  };
  windowPick.value = since;
  const draw = (f) => {
    const cols = f.columns;
    const sel = (v) => `${f.key}=${v}`;
    table.replaceChildren(h('table', { class: 'plain matrix', id: 'fleet-matrix' },
      h('tr', {}, h('th', {}, f.key), cols.map((c) => h('th', {}, stateBadge(c))),
        ['success', 'CPU used / req / limit', 'memory used / req / limit', 'throttled', 'CPU-s / GB-s'].map((t) => h('th', {}, t))),
      f.groups.map((g) => fleetRow(g, cols, g.value, sel(g.value))),
      f.other ? fleetRow(f.other, cols, '(other values)', null, 'other') : null,
      fleetRow(f.unlabelled, cols, '(unlabelled)', `!${f.key}`, 'unlabelled'),
      fleetRow(f.total, cols, 'total', null, 'total')));
    status.textContent = `since ${fmtTime(f.from)} · ${f.total.sandboxes} sandboxes`;
    table.dataset.loaded = `${f.key}|${f.since}`;
  };
  // A long window changes slowly and costs the control plane more to sum
  // (it reads every record of the window): asked less often.
  let last = 0;
  const load = async () => {
    drawKeys();
    const refresh = since === '15m' || since === '1h' ? 5_000 : since === '6h' ? 15_000 : 30_000;
    if (Date.now() - last < refresh - 100) return;
    last = Date.now();
    try {
      draw(await api(`/v1/fleet?key=${encodeURIComponent(key)}&since=${encodeURIComponent(since)}`));
    } catch (e) {
      status.textContent = e.message;
    }
  };
  const poll = every(5000, load);
  const changed = () => {
    key = pick.value;
    since = windowPick.value;
    localStorage.setItem('warren.fleet.key', key);
    localStorage.setItem('warren.fleet.since', since);
    history.replaceState(null, '', `#/fleet?key=${encodeURIComponent(key)}&since=${encodeURIComponent(since)}`);
    delete table.dataset.loaded;
    last = 0;
    poll.now();
  };
  pick.addEventListener('change', changed);
  windowPick.addEventListener('change', changed);
  const off = live.onChange(drawKeys);
  return { stop() { poll(); off(); } };
}

// The Overview's charts cover the last WINDOW.
const WINDOW = '15m';
const WINDOW_MS = 15 * 60_000;
const PALETTE = ['#4fa3ff', '#3fb950', '#d29922', '#a371f7', '#ff7b72', '#79c0ff', '#e3b341', '#7ee787'];

function alertList(alerts) {
  if (!alerts.length) return h('p', { class: 'dim' }, 'No alerts in the last 15 minutes.');
  return h('table', { class: 'plain', id: 'alert-events' },
    h('tr', {}, h('th', {}, 'time'), h('th', {}, 'alert'), h('th', {}, 'sandbox'), h('th', {}, 'what')),
    alerts.slice(-30).reverse().map((e) => h('tr', { 'data-reason': e.reason },
      h('td', { class: 'dim' }, fmtTime(e.time)),
      h('td', { class: 'flag' }, e.reason),
      h('td', {}, e.sandbox_id ? h('a', { href: `#/sandbox/${encodeURIComponent(e.sandbox_id)}`, class: 'mono' }, e.sandbox_id) : 'node'),
      h('td', {}, e.message))));
}

// The Overview's charts over time, from the control plane's history (the
// operator's: a tenant's console has no nodes or shared queue to show).
export function historyPanels(root, live) {
  if (!live.operator) return { stop() {} };
  const heatCanvas = h('canvas', { class: 'chart heat', id: 'node-heat' });
  const cpuCanvas = h('canvas', { class: 'chart', id: 'node-cpu-chart' });
  const queueCanvas = h('canvas', { class: 'chart', id: 'queue-chart' });
  const latencyCanvas = h('canvas', { class: 'chart', id: 'latency-chart' });
  const alerts = h('div', { class: 'panel', id: 'alerts' });
  root.append(
    h('h2', {}, 'Node CPU, last 15 minutes'),
    h('div', { class: 'panel' }, heatCanvas, cpuCanvas),
    h('h2', {}, 'Alerts'), alerts,
    h('div', { class: 'grid2' },
      h('div', {}, h('h2', {}, 'Queue length'), h('div', { class: 'panel' }, queueCanvas)),
      h('div', {}, h('h2', {}, 'Create latency'), h('div', { class: 'panel' }, latencyCanvas))));
  const heat = new Heat(heatCanvas, { alert: ALERT_CPU });
  const queue = new Chart(queueCanvas, [{ name: 'queued', color: '#e3b341' }]);
  const ms = (v) => `${fmtNum(v)} ms`;
  const latency = new Chart(latencyCanvas, [
    { name: 'p50', color: '#3fb950', fmt: ms },
    { name: 'p99', color: '#f85149', fmt: ms },
  ], { format: ms });
  let cpu = null;
  let cpuNames = '';
  const poll = every(5000, async () => {
    const hist = await api(`/v1/history?since=${WINDOW}`);
    const times = hist.points.map((p) => p.time_ms);
    // The whole window, however little of it has samples yet (the server's
    // clock: its last sample, or now).
    const to = times.length ? times[times.length - 1] : Date.now();
    const span = { from: to - WINDOW_MS, to, step: hist.interval_ms };
    const names = [...new Set(hist.points.flatMap((p) => Object.keys(p.node_cpu)))].sort();
    heat.set(times, names.map((n) => ({ name: n, values: hist.points.map((p) => p.node_cpu[n] ?? null) })), span);
    // One line per node (the first eight) against the alert line.
    const shown = names.slice(0, PALETTE.length);
    if (shown.join(',') !== cpuNames) {
      cpuNames = shown.join(',');
      cpu = new Chart(cpuCanvas, shown.map((n, i) => ({ name: n || '(local)', color: PALETTE[i] })),
        { format: pct, max: 1, lines: [{ value: ALERT_CPU, label: `${pct(ALERT_CPU)} alert` }] });
    }
    cpu.set(times, shown.map((n) => hist.points.map((p) => p.node_cpu[n] ?? null)), span);
    queue.set(times, [hist.points.map((p) => p.queued)], span);
    latency.set(times, [hist.points.map((p) => p.create_p50_ms ?? null), hist.points.map((p) => p.create_p99_ms ?? null)], span);
    alerts.replaceChildren(alertList(hist.alerts));
  });
  return { stop: poll };
}
