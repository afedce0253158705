// Charts drawn as inline SVG (no library): a line chart over time, horizontal bars, columns
// per time bucket and the preemption timeline. Each is an <svg role="img"> with a label, and
// each mark has a <title>, so a screen reader and a mouse both get the numbers.

import { h, s } from "./dom.js";
import { abs, axisTime, dur } from "./time.js";

/** About `count` round tick values covering [lo, hi]. */
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw) || 10 * mag;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toFixed(10)));
  return out;
}

/** Tick times on round clock boundaries (10 s … 1 week) across [t0, t1]. */
function timeTicks(t0, t1, count = 6) {
  const steps = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  const step = steps.find((st) => (t1 - t0) / st <= count) || steps[steps.length - 1];
  const offset = new Date().getTimezoneOffset() * 60; // round in local time
  const out = [];
  for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1; t += step) out.push(t);
  return out;
}

export function fmtNumber(v) {
  if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(v % 1000 === 0 ? 0 : 1)}k`;
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return v.toFixed(a < 0.1 ? 3 : a < 1 ? 2 : 1);
}

// Charts are drawn in a coordinate space about as wide as they show on a laptop (a card of the
// grid, or the whole page for the timeline), so that their text keeps its size there; they
// scale with their box elsewhere.
const W = 440;
const M = { l: 46, r: 12, t: 22, b: 30 };

function frame(width, height, label) {
  return s(
    "svg",
    { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, preserveAspectRatio: "xMidYMid meet", dataset: { width } },
    s("title", null, label),
  );
}

function yAxis(svg, ticks, y, height, unit) {
  for (const v of ticks) {
    svg.append(
      s("line", { class: "grid", x1: M.l, x2: W - M.r, y1: y(v), y2: y(v) }),
      s("text", { class: "tick", x: M.l - 6, y: y(v) + 4, "text-anchor": "end" }, fmtNumber(v)),
    );
  }
  if (unit) svg.append(s("text", { class: "unit", x: M.l, y: M.t - 10, "text-anchor": "start" }, unit));
  svg.append(s("line", { class: "axis", x1: M.l, x2: M.l, y1: M.t, y2: height - M.b }));
}

function xTimeAxis(svg, t0, t1, x, height) {
  for (const t of timeTicks(t0, t1, 4)) {
    svg.append(
      s("line", { class: "axis", x1: x(t), x2: x(t), y1: height - M.b, y2: height - M.b + 4 }),
      s("text", { class: "tick", x: x(t), y: height - M.b + 16, "text-anchor": x(t) > W - 50 ? "end" : "middle" }, axisTime(t, t1 - t0)),
    );
  }
  svg.append(s("line", { class: "axis", x1: M.l, x2: W - M.r, y1: height - M.b, y2: height - M.b }));
}

/**
 * Lines over time: series [{name, colour, dash, points: [[t, v], …]}], t in Unix seconds.
 * `t0`, `t1` fix the time range; `unit` labels the y axis.
 */
export function lineChart({ series, t0, t1, unit = "", label, height = 220 }) {
  const all = series.flatMap((se) => se.points);
  const lo = t0 ?? Math.min(...all.map((p) => p[0]));
  const hi = t1 ?? Math.max(...all.map((p) => p[0]));
  const vmax = Math.max(0, ...all.map((p) => p[1]));
  const ticks = niceTicks(0, vmax > 0 ? vmax : 1);
  const top = ticks[ticks.length - 1] || 1;
  const x = (t) => M.l + ((t - lo) / (hi - lo || 1)) * (W - M.l - M.r);
  const y = (v) => height - M.b - (v / top) * (height - M.t - M.b);
  const svg = frame(W, height, label);
  svg.dataset.t0 = String(lo);
  svg.dataset.t1 = String(hi);
  yAxis(svg, ticks, y, height, unit);
  xTimeAxis(svg, lo, hi, x, height);
  for (const se of series) {
    if (!se.points.length) continue;
    const d = se.points.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
    const last = se.points[se.points.length - 1];
    svg.append(
      s(
        "path",
        { class: "series", d, stroke: se.colour, "stroke-dasharray": se.dash || null, fill: "none" },
        s("title", null, `${se.name}: ${fmtNumber(last[1])} ${unit} at ${abs(last[0])}`),
      ),
      // The newest point marked, so that a single sample shows too.
      s("circle", { class: "last", cx: x(last[0]).toFixed(1), cy: y(last[1]).toFixed(1), r: 3.5, fill: se.colour }, s("title", null, `${se.name}: ${fmtNumber(last[1])} ${unit} at ${abs(last[0])}`)),
    );
  }
  return svg;
}

/** A legend for a line chart: the line style drawn next to each name. */
export function lineLegend(series) {
  return h(
    "ul",
    { class: "legend" },
    series.map((se) =>
      h(
        "li",
        null,
        s(
          "svg",
          { class: "legend-line", viewBox: "0 0 28 8", width: 28, height: 8, "aria-hidden": "true" },
          s("line", { x1: 1, x2: 27, y1: 4, y2: 4, stroke: se.colour, "stroke-width": 3, "stroke-dasharray": se.dash || null }),
        ),
        ` ${se.name}`,
      ),
    ),
  );
}

/** Horizontal bars: [{label, value, colour, title}]; `format` writes the value. */
export function barChart({ bars, label, format = fmtNumber }) {
  const row = 26;
  const height = 8 + bars.length * row + 8;
  const left = 110;
  const vmax = Math.max(0, ...bars.map((b) => b.value)) || 1;
  const svg = frame(W, height, label);
  bars.forEach((b, i) => {
    const y = 8 + i * row;
    const w = (b.value / vmax) * (W - left - 100);
    svg.append(
      s("text", { class: "bar-label", x: left - 8, y: y + 16, "text-anchor": "end" }, clip(b.label, 16)),
      s("rect", { class: "bar", x: left, y: y + 4, width: Math.max(b.value > 0 ? 2 : 0, w), height: row - 8, fill: b.colour || "#0072B2" }, s("title", null, b.title || `${b.label}: ${format(b.value)}`)),
      s("text", { class: "bar-value", x: left + w + 6, y: y + 16 }, format(b.value)),
    );
  });
  return svg;
}

/** Columns per time bucket: buckets [{t0, t1, value}] (t in Unix seconds). */
export function columnChart({ buckets, label, unit = "" }) {
  const height = 200;
  const lo = buckets.length ? buckets[0].t0 : 0;
  const hi = buckets.length ? buckets[buckets.length - 1].t1 : 1;
  const ticks = niceTicks(0, Math.max(1, ...buckets.map((b) => b.value)), 4);
  const top = ticks[ticks.length - 1] || 1;
  const x = (t) => M.l + ((t - lo) / (hi - lo || 1)) * (W - M.l - M.r);
  const y = (v) => height - M.b - (v / top) * (height - M.t - M.b);
  const svg = frame(W, height, label);
  yAxis(svg, ticks, y, height, unit);
  xTimeAxis(svg, lo, hi, x, height);
  for (const b of buckets) {
    if (!b.value) continue;
    svg.append(
      s(
        "rect",
        { class: "column", x: x(b.t0) + 1, y: y(b.value), width: Math.max(1, x(b.t1) - x(b.t0) - 2), height: y(0) - y(b.value) },
        s("title", null, `${b.value} ${unit} from ${abs(b.t0)}`),
      ),
    );
  }
  return svg;
}

/**
 * The preemption timeline: one lane per victim queue; each preemption a bar from SIGTERM to
 * its end (or SIGKILL deadline, or now), coloured by the victim's tier, its kind by outline,
 * a link to the victim's page.
 */
export function timeline({ items, t0, t1, tierColour, label }) {
  const TW = 1000;
  const lanes = [...new Set(items.map((p) => p.victim_queue))].sort();
  const lane = 30;
  const left = 120;
  const height = M.t + Math.max(1, lanes.length) * lane + M.b;
  const x = (t) => left + ((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0 || 1)) * (TW - left - M.r);
  const svg = frame(TW, height, label);
  lanes.forEach((q, i) => {
    const y = M.t + i * lane;
    svg.append(
      s("line", { class: "grid", x1: left, x2: TW - M.r, y1: y + lane, y2: y + lane }),
      s("text", { class: "bar-label", x: left - 8, y: y + lane / 2 + 4, "text-anchor": "end" }, clip(q, 16)),
    );
  });
  const axisX = (t) => x(t);
  for (const t of timeTicks(t0, t1)) {
    svg.append(s("text", { class: "tick", x: axisX(t), y: height - M.b + 16, "text-anchor": "middle" }, axisTime(t, t1 - t0)));
  }
  svg.append(s("line", { class: "axis", x1: left, x2: TW - M.r, y1: height - M.b, y2: height - M.b }));
  for (const p of items) {
    const y = M.t + lanes.indexOf(p.victim_queue) * lane;
    const end = p.ended_at ?? p.kill_at ?? t1;
    const x0 = x(p.at);
    const width = Math.max(4, x(end) - x0);
    const text =
      `job ${p.victim} (${p.victim_queue}, tier ${p.victim_tier}) preempted ${p.kind === "reclaim" ? "to reclaim quota " : ""}` +
      `for job ${p.preemptor ?? "—"} (${p.preemptor_queue ?? "—"}, tier ${p.preemptor_tier ?? "—"}) at ${abs(p.at)}` +
      (p.grace_used_s != null ? `; used ${dur(p.grace_used_s)} of ${dur(p.grace_s)} grace` : "") +
      (p.lost_work_gpu_hours != null ? `; lost ${Number(p.lost_work_gpu_hours).toFixed(2)} GPU-h` : "");
    svg.append(
      s(
        "a",
        { href: `#/jobs/${encodeURIComponent(p.victim)}`, class: "tl-item", dataset: { victim: p.victim, preemptor: p.preemptor ?? "" }, "aria-label": text },
        s("title", null, text),
        s("rect", {
          class: ["tl-bar", `kind-${String(p.kind).replace(/[^a-z]/gi, "")}`],
          x: x0,
          y: y + 6,
          width,
          height: lane - 12,
          rx: 3,
          fill: tierColour(p.victim_tier),
        }),
        p.kill_at != null && p.kill_at < t1 ? s("line", { class: "tl-kill", x1: x(p.kill_at), x2: x(p.kill_at), y1: y + 3, y2: y + lane - 3 }) : null,
      ),
    );
  }
  return svg;
}

function clip(text, n) {
  const t = String(text ?? "");
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
}
