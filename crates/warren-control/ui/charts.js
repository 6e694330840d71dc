// The console's charts, drawn on a <canvas> by the console itself: a line
// chart with value and time axes, a heat map of one row per node, and the
// used / request / limit bar. Every label is drawn as canvas text (nothing
// from the API is ever parsed as HTML); each chart also says what it drew
// in data-* attributes, for tests and people with devtools.

import { h } from './lib.js';

// A "nice" round top for an axis: 1, 2 or 5 times a power of ten, at or
// above the largest value (and above zero, so an empty chart has an axis).
export function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((t) => t >= v * 0.999);
}

// The same for bytes: a power of two, so its quarters are round too.
export function niceBytes(v) {
  return v > 0 ? 2 ** Math.ceil(Math.log2(v)) : 1024;
}

function fmtClock(ms) {
  const d = new Date(ms);
  return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}:${String(d.getSeconds()).padStart(2, '0')}`;
}

// Sizes the canvas's backing store to its CSS box and hands back a 2-D
// context in CSS pixels.
function surface(c) {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth, hgt = c.clientHeight;
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(hgt * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(hgt * dpr);
  }
  const g = c.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, hgt);
  g.font = '11px sans-serif';
  return { g, w, hgt };
}

const GRID = '#2a323c';
const TEXT = '#8a95a3';
const PAD = { left: 58, right: 58, top: 8, bottom: 18 };

// A line chart with a value axis on each side (series name their axis:
// 'left', the default, or 'right', each with its own unit and scale, in
// powers of two for a series marked `bytes`) and a time axis. Points are either pushed one at a time, `step` ms apart
// (push), or given whole with their times (set). `lines` are horizontal
// reference lines on the left axis, e.g. an alert threshold.
// An axis value: as many decimals as a small scale needs, none for a large.
export function fmtNum(v) {
  return Math.abs(v) >= 10 || Number.isInteger(v) ? v.toFixed(0) : String(+v.toFixed(2));
}

export class Chart {
  constructor(canvas, series, { points = 120, step = 1000, format = fmtNum, lines = [], max } = {}) {
    this.canvas = canvas;
    this.series = series.map((s) => ({ axis: 'left', ...s, values: [] }));
    this.points = points;
    this.step = step;
    this.format = format;
    this.lines = lines;
    this.max = max;
    this.times = null;
    this.draws = 0;
  }

  // One more value per series, `step` after the last.
  push(...values) {
    values.forEach((v, i) => {
      const s = this.series[i];
      s.values.push(v);
      if (s.values.length > this.points) s.values.shift();
    });
    this.draw();
  }

  // Every point at once: `times` (Unix ms) and, per series, its values
  // (null where a point has none); `span` ({from, to}, Unix ms) is the
  // stretch of time the axis shows (default: the first to the last point).
  set(times, valuesBySeries, span) {
    this.times = times;
    this.span = span;
    this.series.forEach((s, i) => { s.values = valuesBySeries[i] || []; });
    this.draw();
  }

  scale(axis) {
    const on = this.series.filter((s) => s.axis === axis);
    if (!on.length) return null;
    const seen = on.flatMap((s) => s.values).filter((v) => typeof v === 'number');
    const lines = axis === 'left' ? this.lines.map((l) => l.value) : [];
    const nice = on[0].bytes ? niceBytes : niceMax;
    const top = axis === 'left' && this.max !== undefined ? this.max : nice(Math.max(0, ...seen, ...lines));
    return { top, fmt: on[0].fmt || this.format };
  }

  draw() {
    const { g, w, hgt } = surface(this.canvas);
    const left = this.scale('left');
    const right = this.scale('right');
    const x0 = PAD.left, x1 = w - (right ? PAD.right : 12), y0 = PAD.top, y1 = hgt - PAD.bottom;
    const n = this.times ? this.times.length : this.points;
    const span = this.times && (this.span || (n ? { from: this.times[0], to: this.times[n - 1] } : null));
    const xOfTime = (t) => (span.to > span.from ? x0 + ((x1 - x0) * (t - span.from)) / (span.to - span.from) : x1);
    const xAt = (i) => {
      if (span) return xOfTime(this.times[i]);
      return n <= 1 ? x1 : x0 + ((x1 - x0) * i) / (n - 1);
    };
    const yAt = (v, sc) => y1 - ((y1 - y0) * Math.min(v, sc.top)) / sc.top;
    const labels = { left: [], right: [], x: [] };
    // Value axes: four steps of each scale, labelled on its side.
    g.lineWidth = 1;
    for (let k = 0; k <= 4; k++) {
      const y = y1 - ((y1 - y0) * k) / 4;
      g.strokeStyle = GRID;
      g.beginPath(); g.moveTo(x0, y); g.lineTo(x1, y); g.stroke();
      g.fillStyle = TEXT;
      if (left) {
        const t = left.fmt((left.top * k) / 4);
        labels.left.push(t);
        g.textAlign = 'right'; g.fillText(t, x0 - 4, y + 4);
      }
      if (right) {
        const t = right.fmt((right.top * k) / 4);
        labels.right.push(t);
        g.textAlign = 'left'; g.fillText(t, x1 + 4, y + 4);
      }
    }
    // Time axis: the first, middle and last point's time (clock time for
    // timed points, "N s ago" for pushed ones).
    g.textAlign = 'center';
    const tick = (t, x) => {
      labels.x.push(t);
      g.fillStyle = TEXT;
      g.fillText(t, Math.min(Math.max(x, x0 + 20), x1 - 20), hgt - 4);
    };
    if (span) {
      for (const t of [span.from, (span.from + span.to) / 2, span.to]) tick(fmtClock(t), xOfTime(t));
    } else if (!this.times) {
      for (const i of [0, Math.floor((n - 1) / 2), n - 1]) {
        const ago = ((n - 1 - i) * this.step) / 1000;
        tick(ago ? `-${ago >= 60 ? `${+(ago / 60).toFixed(1)} min` : `${ago} s`}` : 'now', xAt(i));
      }
    }
    g.textAlign = 'left';
    // Reference lines, dashed, with their label.
    for (const l of this.lines) {
      if (!left) break;
      const y = yAt(l.value, left);
      g.strokeStyle = l.color || '#f85149';
      g.setLineDash([5, 4]);
      g.beginPath(); g.moveTo(x0, y); g.lineTo(x1, y); g.stroke();
      g.setLineDash([]);
      g.fillStyle = l.color || '#f85149';
      g.fillText(l.label || left.fmt(l.value), x1 - 70, y - 3);
    }
    // The series; a gap where a point has no value.
    this.series.forEach((s, idx) => {
      const sc = s.axis === 'right' ? right : left;
      const off = this.times ? 0 : this.points - s.values.length;
      g.strokeStyle = s.color;
      g.lineWidth = 1.5;
      g.beginPath();
      let pen = false;
      s.values.forEach((v, i) => {
        if (typeof v !== 'number') { pen = false; return; }
        const x = xAt(i + off), y = yAt(v, sc);
        if (pen) g.lineTo(x, y); else g.moveTo(x, y);
        pen = true;
      });
      g.stroke();
      // Sparse points (a history just started) as dots, so one shows.
      const points = s.values.filter((v) => typeof v === 'number').length;
      if (points <= 60) {
        g.fillStyle = s.color;
        s.values.forEach((v, i) => {
          if (typeof v !== 'number') return;
          g.beginPath(); g.arc(xAt(i + off), yAt(v, sc), 2, 0, 2 * Math.PI); g.fill();
        });
      }
      const last = [...s.values].reverse().find((v) => typeof v === 'number');
      g.fillStyle = s.color;
      g.fillText(`${s.name}: ${last === undefined ? '–' : (s.fmt || this.format)(last)}`, x0 + 6, y0 + 12 + 14 * idx);
    });
    this.draws++;
    const c = this.canvas;
    c.dataset.draws = String(this.draws);
    c.dataset.last = this.series.map((s) => {
      const v = [...s.values].reverse().find((x) => typeof x === 'number');
      return v === undefined ? '' : v;
    }).join(',');
    c.dataset.axis = JSON.stringify(labels);
  }
}

// CPU busy share to a colour: green when idle, through amber, to red at
// and above the alert line.
function heatColour(v, alert) {
  if (typeof v !== 'number') return '#1d2530';
  if (v >= alert) return '#f85149';
  const f = Math.min(1, v / alert);
  const hue = 130 - 95 * f;
  return `hsl(${hue}, 60%, ${22 + 20 * f}%)`;
}

// A heat map: one row per node, one column per sample, each cell the
// node's CPU busy share; cells at or above `alert` are red, and the scale
// under it marks the alert line.
export class Heat {
  constructor(canvas, { alert = 0.85 } = {}) {
    this.canvas = canvas;
    this.alert = alert;
    this.draws = 0;
  }

  // times: Unix ms per sample; rows: [{name, values}] (share 0..1 or
  // null); span: {from, to, step} (Unix ms, and the time between samples):
  // the stretch of time the row shows, each sample a cell `step` wide
  // ending at its time.
  set(times, rows, span) {
    const c = this.canvas;
    const rowH = 18;
    const legend = 22;
    c.style.height = `${Math.max(1, rows.length) * rowH + PAD.bottom + legend + 4}px`;
    const { g, w, hgt } = surface(c);
    const x0 = 110, x1 = w - 12;
    const xOfTime = (t) => x0 + ((x1 - x0) * (t - span.from)) / Math.max(1, span.to - span.from);
    const cw = Math.max(1, ((x1 - x0) * span.step) / Math.max(1, span.to - span.from));
    let hot = 0;
    rows.forEach((r, ri) => {
      const y = ri * rowH + 2;
      g.fillStyle = TEXT;
      g.textAlign = 'right';
      g.fillText(r.name || '(local)', x0 - 6, y + 12);
      g.fillStyle = '#1d2530';
      g.fillRect(x0, y, x1 - x0, rowH - 3);
      r.values.forEach((v, i) => {
        g.fillStyle = heatColour(v, this.alert);
        const x = Math.max(x0, xOfTime(times[i]) - cw);
        g.fillRect(x, y, Math.max(1, xOfTime(times[i]) - x - 0.5), rowH - 3);
        if (typeof v === 'number' && v >= this.alert) hot++;
      });
    });
    const ty = rows.length * rowH + 14;
    const labels = [];
    g.textAlign = 'center';
    for (const at of [span.from, (span.from + span.to) / 2, span.to]) {
      const t = fmtClock(at);
      labels.push(t);
      g.fillStyle = TEXT;
      g.fillText(t, Math.min(Math.max(xOfTime(at), x0 + 20), x1 - 20), ty);
    }
    // The scale: 0 to 100 %, with the alert line marked on it.
    const ly = hgt - legend + 4, lw = Math.min(300, x1 - x0);
    for (let i = 0; i < lw; i++) {
      g.fillStyle = heatColour(i / lw, this.alert);
      g.fillRect(x0 + i, ly, 1, 8);
    }
    const ax = x0 + lw * this.alert;
    g.strokeStyle = '#ffffff';
    g.beginPath(); g.moveTo(ax, ly - 3); g.lineTo(ax, ly + 11); g.stroke();
    g.fillStyle = TEXT;
    g.textAlign = 'left';
    g.fillText('0%', x0 - 20, ly + 8);
    g.fillText('100%', x0 + lw + 4, ly + 8);
    g.fillText(`${Math.round(this.alert * 100)}% alert line`, ax + 6, ly + 18);
    this.draws++;
    c.dataset.draws = String(this.draws);
    c.dataset.rows = rows.map((r) => r.name).join(',');
    c.dataset.hot = String(hot);
    c.dataset.axis = JSON.stringify({ x: labels });
  }
}

// Used against request and limit as a bar: the bar's length is the limit
// (or the use, if above), the fill is the use (amber above the request,
// red at the limit), a mark at the request; the figures beside it.
export function usageBar(used, request, limit, fmt) {
  const full = Math.max(limit, used, request, 1e-9);
  const pc = (v) => `${((100 * v) / full).toFixed(1)}%`;
  const colour = used >= limit * 0.95 && limit > 0 ? '#f85149' : used > request ? '#d29922' : '#3fb950';
  return h('div', { class: 'ubar', 'data-used': used, 'data-request': request, 'data-limit': limit },
    h('div', { class: 'track', title: `used ${fmt(used)} · request ${fmt(request)} · limit ${fmt(limit)}` },
      h('span', { class: 'fill', style: `width:${pc(used)};background:${colour}` }),
      h('span', { class: 'req', style: `left:${pc(request)}` })),
    h('div', { class: 'u' }, `${fmt(used)} / ${fmt(request)} / ${fmt(limit)}`));
}
