// The console's shell: login, the hash router, and the live state every
// view shares (one usage poll and one event stream for the whole page,
// whatever the number of sandboxes).

import { api, ndjson, AuthError, ALERT_CPU, ALERT_FOR_MS } from './lib.js';
import * as views from './views.js';

const $ = (id) => document.getElementById(id);


// What the views read: every live sandbox (from GET /v1/usage, refreshed
// every 2 s and at once when the event stream names a sandbox it does not
// know), its CPU rate (from the difference of two polls), the recent
// events, and listeners that redraw on change.
export const live = {
  rows: new Map(),
  time: 0,
  events: [],
  listeners: new Set(),
  eventListeners: new Set(),
  connected: false,
  loaded: false,
  pollTimer: 0,
  refreshSoon: 0,
  abort: null,
  // Where the event stream starts: the first usage answer's event_seq.
  eventSeq: 0,

  // The nodes (GET /v1/nodes every 2 s, whatever the view, so the CPU
  // alert knows the last ALERT_FOR_MS on arrival) and each one's readings.
  nodes: [],
  nodeListeners: new Set(),
  cpuHistory: new Map(),
  nodeTimer: 0,
  // Whether the session is the operator's (GET /v1/whoami); a tenant's
  // sees its own tenant only, without nodes, profiles or images.
  operator: true,

  onChange(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); },
  onNodes(fn) { this.nodeListeners.add(fn); return () => this.nodeListeners.delete(fn); },

  async pollNodes() {
    const nodes = await api('/v1/nodes');
    const now = Date.now();
    for (const n of nodes) {
      const hist = this.cpuHistory.get(n.name) || [];
      hist.push([now, n.load.cpu_busy]);
      while (hist.length && now - hist[0][0] > 5 * 60_000) hist.shift();
      this.cpuHistory.set(n.name, hist);
    }
    this.nodes = nodes;
    for (const fn of this.nodeListeners) fn();
  },

  // A node is hot when every reading of the last ALERT_FOR_MS is above
  // ALERT_CPU, and the readings span that long.
  hot(name) {
    const hist = this.cpuHistory.get(name) || [];
    const now = Date.now();
    const recent = hist.filter(([t]) => now - t <= ALERT_FOR_MS);
    if (!recent.length || now - hist[0][0] < ALERT_FOR_MS * 0.8) return false;
    return recent.every(([, v]) => v > ALERT_CPU);
  },
  onEvent(fn) { this.eventListeners.add(fn); return () => this.eventListeners.delete(fn); },
  emit() { for (const fn of this.listeners) fn(); },

  async poll() {
    const u = await api('/v1/usage');
    const dt = this.time ? u.time_ms - this.time : 0;
    const next = new Map();
    for (const r of u.sandboxes) {
      const old = this.rows.get(r.id);
      if (old && dt > 0 && r.cpu_usage_ns !== undefined && old.cpu_usage_ns !== undefined) {
        r.cpu_millis = Math.max(0, (r.cpu_usage_ns - old.cpu_usage_ns) / (dt * 1000));
      } else if (old) {
        r.cpu_millis = old.cpu_millis;
      }
      next.set(r.id, r);
    }
    // Sandboxes that ended since the last poll stay, with their final
    // state from the event stream, until the next poll drops them.
    for (const [id, old] of this.rows) {
      if (!next.has(id) && old.final && !old.gone) { old.gone = true; next.set(id, old); }
    }
    this.rows = next;
    this.time = u.time_ms;
    if (!this.loaded) this.eventSeq = u.event_seq;
    this.loaded = true;
    this.emit();
  },

  start() {
    if (this.abort) return;
    this.abort = new AbortController();
    const signal = this.abort.signal;
    const tick = async () => {
      try { await this.poll(); } catch (e) { if (e instanceof AuthError) { showLogin(); return; } }
      if (!signal.aborted) this.pollTimer = setTimeout(tick, 2000);
    };
    // The first answer says where the event stream starts: the changes
    // after it, and the last few before it for the Overview; never the
    // whole history.
    (async () => {
      let from = 0;
      try {
        await this.poll();
        from = this.eventSeq;
        const recent = await api(`/v1/events?after=${Math.max(0, from - 50)}&limit=50`);
        this.events.push(...recent.filter((ev) => ev.seq <= from));
      } catch (e) {
        if (e instanceof AuthError) { showLogin(); return; }
      }
      if (signal.aborted) return;
      this.pollTimer = setTimeout(tick, 2000);
      this.follow(signal, from);
    })();
    // Nodes are the operator's: a tenant's console has none to poll.
    const nodeTick = async () => {
      try { await this.pollNodes(); } catch (_) { /* shown as stale; retried */ }
      if (!signal.aborted) this.nodeTimer = setTimeout(nodeTick, 2000);
    };
    if (this.operator) nodeTick();
  },

  stop() {
    if (this.abort) this.abort.abort();
    this.abort = null;
    clearTimeout(this.pollTimer);
    clearTimeout(this.nodeTimer);
    this.cpuHistory = new Map();
    this.rows = new Map();
    this.events = [];
    this.time = 0;
    this.loaded = false;
  },

  async follow(signal, from) {
    let after = from;
    while (!signal.aborted) {
      try {
        this.setConnected(true);
        await ndjson(`/v1/events?follow=true&after=${after}`, (ev) => {
          if (typeof ev.seq === 'number') after = ev.seq;
          this.apply(ev);
        }, signal);
      } catch (e) {
        if (e instanceof AuthError) { showLogin(); return; }
      }
      this.setConnected(false);
      if (!signal.aborted) await new Promise((r) => setTimeout(r, 1000));
    }
  },

  setConnected(on) {
    this.connected = on;
    $('live').classList.toggle('on', on);
  },

  apply(ev) {
    this.events.push(ev);
    if (this.events.length > 200) this.events.splice(0, this.events.length - 200);
    for (const fn of this.eventListeners) fn(ev);
    if (!ev.state) return;
    const r = this.rows.get(ev.sandbox_id);
    const final = ['destroyed', 'failed', 'lost', 'preempted'].includes(ev.state);
    if (r) {
      r.state = ev.state;
      r.reason = ev.reason;
      r.final = final;
    } else if (!final && this.loaded) {
      // A sandbox we have not seen: its labels and sizes come with the
      // next poll, brought forward (once per burst of creates).
      if (!this.refreshSoon) {
        this.refreshSoon = setTimeout(() => { this.refreshSoon = 0; this.poll().catch(() => {}); }, 300);
      }
    }
    this.changed();
  },

  // Redraws at most once a frame, however many events arrive.
  changed() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => { this.frame = 0; this.emit(); });
  },
};

// For scripts/bench-console.py and devtools (it holds no secret: the
// session is an HttpOnly cookie).
window.warrenLive = live;

let current = null;

function showLogin() {
  live.stop();
  if (current && current.stop) current.stop();
  current = null;
  $('top').hidden = true;
  $('view').replaceChildren();
  $('login').hidden = false;
  $('token').focus();
}

async function login(ev) {
  ev.preventDefault();
  const input = $('token');
  $('login-error').textContent = '';
  try {
    await api('/ui/login', { method: 'POST', body: { token: input.value } });
  } catch (e) {
    $('login-error').textContent = e instanceof AuthError ? 'Wrong token.' : e.message;
    return;
  } finally {
    // The token is dropped from the page as soon as it has been sent.
    input.value = '';
  }
  $('login').hidden = true;
  route();
}

async function logout() {
  try { await api('/ui/logout', { method: 'POST' }); } catch (_) { /* the cookie is gone either way */ }
  showLogin();
}

const ROUTES = {
  '': views.overview,
  fleet: views.fleet,
  sandboxes: views.sandboxes,
  sandbox: views.sandbox,
  batches: views.batches,
  batch: views.batches,
  profiles: views.profiles,
  images: views.images,
  nodes: views.nodes,
  tenants: views.tenants,
};

async function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query = ''] = hash.split('?');
  const [name, ...rest] = path.split('/');
  const view = ROUTES[name] || views.overview;
  try {
    // One cheap authenticated call decides between the login and the app,
    // and says whose console it is.
    if (!live.abort) {
      const me = await api('/v1/whoami');
      live.operator = me.role === 'operator';
      $('whoami').textContent = live.operator ? '' : `${me.tenant} (${me.role})`;
      for (const a of document.querySelectorAll('#nav a[data-operator]')) a.hidden = !live.operator;
    }
  } catch (e) {
    if (e instanceof AuthError) { showLogin(); return; }
  }
  $('login').hidden = true;
  $('top').hidden = false;
  live.start();
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.getAttribute('href') === `#/${name}`);
  }
  if (current && current.stop) current.stop();
  const root = $('view');
  root.replaceChildren();
  current = view(root, { args: rest.map(decodeURIComponent), query: new URLSearchParams(query) }, live) || null;
}

$('login-form').addEventListener('submit', login);
$('logout').addEventListener('click', logout);
window.addEventListener('hashchange', route);
route();
