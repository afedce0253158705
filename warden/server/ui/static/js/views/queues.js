// Queues: the queue tree with quota, use and fair share (GET /v1/queues), and over a chosen
// window the delivered vs owed GPU-hours of each queue, its waits and the least-served
// queue's maximum wait (GET /v1/history samples).

import { Unavailable, api } from "../api.js";
import { h, lookBack, notice, span, swap, table, windowButtons } from "../dom.js";
import { lineChart, lineLegend } from "../charts.js";
import { dur, nowS, when } from "../time.js";


const DELIVERED = { colour: "#0072B2", dash: null };
const OWED = { colour: "#D55E00", dash: "6 4" };

function depthOf(rows) {
  const parent = new Map(rows.map((r) => [r.name, r.parent]));
  const depth = new Map();
  const d = (name) => {
    if (depth.has(name)) return depth.get(name);
    const p = parent.get(name);
    const v = p === null || p === undefined || !parent.has(p) ? 0 : d(p) + 1;
    depth.set(name, v);
    return v;
  };
  for (const r of rows) d(r.name);
  return depth;
}

/** The tree in depth-first order, children by name. */
function treeOrder(rows) {
  const children = new Map();
  const names = new Set(rows.map((r) => r.name));
  for (const r of rows) {
    const p = r.parent !== null && names.has(r.parent) ? r.parent : null;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(r);
  }
  const out = [];
  const walk = (p) => {
    for (const r of (children.get(p) || []).sort((a, b) => a.name.localeCompare(b.name))) {
      out.push(r);
      walk(r.name);
    }
  };
  walk(null);
  return out;
}

function quota(q, key) {
  const v = q[key];
  if (v === null || v === undefined) return key === "nominal" ? "—" : "unlimited";
  if (typeof v !== "object") return String(v);
  const parts = Object.entries(v).map(([res, n]) => `${n} ${res}`);
  return parts.length ? parts.join(", ") : key === "nominal" ? "—" : "unlimited";
}

function useBar(q) {
  const nominal = q.nominal && q.nominal.gpu;
  const used = q.gpus_in_use;
  if (!nominal) return String(used);
  const pct = Math.min(100, (used / nominal) * 100);
  return h(
    "span",
    { class: "use", title: `${used} of a nominal ${nominal} GPUs${used > nominal ? " (borrowing)" : ""}` },
    h("span", { class: "use-bar", "aria-hidden": "true" }, h("span", { class: ["use-fill", used > nominal && "over"], style: { width: `${pct}%` } })),
    ` ${used} / ${nominal}`,
  );
}

function hours(v) {
  if (v === null || v === undefined) return "—";
  const n = Number(v);
  return n.toFixed(n === 0 ? 0 : n < 0.1 ? 3 : n < 10 ? 2 : 1);
}

export default {
  mount(root, _params, ctx) {
    const state = { windowS: null };
    const buttons = windowButtons(state, () => ctx.refresh());
    const tree = h("section", { "aria-label": "queue tree" });
    const waits = h("section", { "aria-labelledby": "waits-h" });
    const charts = h("section", { "aria-labelledby": "history-h" });
    root.append(
      h("div", { class: "view-head" }, h("h1", null, "Queues")),
      tree,
      h("div", { class: "view-head" }, h("h2", { id: "history-h" }, "Delivered vs owed GPU-hours"), buttons),
      charts,
      h("h2", { id: "waits-h" }, "Waits (latest sample)"),
      waits,
    );
    const instance = {
      title: "Queues",
      async update() {
        const rows = await api("/queues").catch((err) => err);
        if (rows instanceof Error) {
          swap(tree, notice("error", `The queues are not available: ${rows.message}`));
          throw rows;
        }
        const until = nowS();
        const history = await api("/history", { params: { since: Math.floor(until - lookBack(state)), until: Math.ceil(until) } }).catch((err) => err);
        const latest = history instanceof Error || !history.samples || !history.samples.length ? null : history.samples[history.samples.length - 1];
        renderTree(rows, latest);
        renderHistory(rows, history, until);
        renderWaits(rows, history, latest);
      },
    };

    function renderTree(rows, latest) {
      const depth = depthOf(rows);
      const ordered = treeOrder(rows);
      swap(
        tree,
        table(
          [
            { label: "queue", cell: (q) => h("span", { class: "tree-name", style: { "padding-left": `${depth.get(q.name) * 1.25}rem` } }, q.leaf ? "" : "▸ ", q.name) },
            { label: "weight", class: "num", cell: (q) => String(q.weight) },
            { label: "nominal", cell: (q) => quota(q, "nominal") },
            { label: "borrow limit", cell: (q) => quota(q, "borrowing_limit") },
            { label: "lend limit", cell: (q) => quota(q, "lending_limit") },
            { label: "GPUs used / nominal", cell: useBar },
            { label: "borrowed", class: "num", cell: (q) => (latest && latest.queues && latest.queues[q.name] ? String(latest.queues[q.name].borrowed_gpus ?? "—") : "—") },
            { label: "pending", class: "num", cell: (q) => String(q.pending_jobs) },
            { label: "fair share", class: "num", cell: (q) => Number(q.fair_share_usage).toFixed(3) },
            { label: "fair-share position", class: "num", cell: (q) => (q.fair_share_position != null ? String(q.fair_share_position) : "—") },
            { label: "delivered GPU-h", class: "num", cell: (q) => hours(q.delivered_gpu_hours) },
            { label: "owed GPU-h", class: "num", cell: (q) => hours(q.owed_gpu_hours) },
            {
              label: "deliv. / owed",
              class: "num",
              cell: (q) => (q.owed_gpu_hours > 0 ? `${Math.round((q.delivered_gpu_hours / q.owed_gpu_hours) * 100)} %` : "—"),
            },
          ],
          ordered,
          {
            rowAttrs: (q) => ({ dataset: { queue: q.name, leaf: String(q.leaf) } }),
            tableClass: "queue-tree",
            caption: "The queue tree: quota, use now, fair share; GPU-hours since the first submission (charged tiers)",
          },
        ),
      );
    }

    function renderHistory(rows, history, until) {
      if (history instanceof Unavailable) {
        swap(charts, notice("unavailable", "History is not available on this server (no GET /v1/history)."));
        return;
      }
      if (history instanceof Error) {
        swap(charts, notice("error", `History could not be read: ${history.message}`));
        return;
      }
      const samples = history.samples || [];
      if (!samples.length) {
        swap(charts, notice("empty", "No history samples in this window yet."));
        return;
      }
      const names = rows.filter((q) => q.leaf).map((q) => q.name);
      for (const s of samples) for (const name of Object.keys(s.queues || {})) if (!names.includes(name)) names.push(name);
      const legend = lineLegend([
        { name: "delivered GPU-hours", ...DELIVERED },
        { name: "owed GPU-hours", ...OWED },
      ]);
      const [t0] = span(state, until, samples[0].at);
      const cards = names.map((name) => {
        const points = (field) => samples.filter((s) => s.queues && s.queues[name] && s.queues[name][field] != null).map((s) => [s.at, Number(s.queues[name][field])]);
        const series = [
          { name: "delivered", ...DELIVERED, points: points("delivered_gpu_hours") },
          { name: "owed", ...OWED, points: points("owed_gpu_hours") },
        ];
        return h(
          "figure",
          { class: "chart-card", dataset: { queue: name } },
          h("figcaption", null, name),
          lineChart({ series, t0, t1: until, unit: "GPU-h", label: `${name}: delivered vs owed GPU-hours`, height: 180 }),
        );
      });
      const cluster = samples.filter((s) => s.cluster);
      const clusterCard = cluster.length
        ? h(
            "figure",
            { class: "chart-card" },
            h("figcaption", null, "cluster: GPUs in use, down, and pending jobs"),
            lineChart({
              series: [
                { name: "GPUs", colour: "#000000", dash: "2 3", points: cluster.map((s) => [s.at, s.cluster.gpus]) },
                { name: "GPUs in use", colour: "#009E73", points: cluster.map((s) => [s.at, s.cluster.gpus_used]) },
                { name: "GPUs down", colour: "#CC79A7", dash: "4 2", points: cluster.map((s) => [s.at, s.cluster.gpus_down]) },
                { name: "pending jobs", colour: "#E69F00", dash: "8 3", points: cluster.map((s) => [s.at, s.cluster.pending_jobs]) },
              ],
              t0,
              t1: until,
              label: "cluster GPUs and pending jobs",
              height: 180,
            }),
            lineLegend([
              { name: "GPUs", colour: "#000000", dash: "2 3" },
              { name: "in use", colour: "#009E73" },
              { name: "down", colour: "#CC79A7", dash: "4 2" },
              { name: "pending jobs", colour: "#E69F00", dash: "8 3" },
            ]),
          )
        : null;
      swap(charts, legend, h("div", { class: "chart-grid" }, cards, clusterCard), h("p", { class: "help" }, `${samples.length} sample${samples.length === 1 ? "" : "s"}, one every ${dur(history.interval_s)}.`));
    }

    function renderWaits(rows, history, latest) {
      if (history instanceof Error) {
        swap(waits, notice("unavailable", history instanceof Unavailable ? "Waits come from the history, which is not available on this server." : `History could not be read: ${history.message}`));
        return;
      }
      if (!latest) {
        swap(waits, notice("empty", "No sample yet."));
        return;
      }
      const entries = Object.entries(latest.queues || {});
      // Leaves only: a parent's longest wait is one of its leaves'.
      const leaves = new Set(rows.filter((q) => q.leaf).map((q) => q.name));
      let worst = null;
      for (const [name, q] of entries) {
        if (leaves.size && !leaves.has(name)) continue;
        if (q.max_wait_s > 0 && (!worst || q.max_wait_s > worst[1].max_wait_s)) worst = [name, q];
      }
      swap(
        waits,
        h(
          "p",
          { class: "callout", dataset: { leastServed: worst ? worst[0] : "" } },
          worst
            ? ["Least-served queue: ", h("strong", null, worst[0]), `, whose longest wait is ${dur(worst[1].max_wait_s)}`, " (sample ", when(latest.at), ")."]
            : ["Least-served queue: none, no job was waiting at the latest sample (", when(latest.at), ")."],
        ),
        table(
          [
            { label: "queue", cell: ([name]) => name },
            { label: "pending jobs", class: "num", cell: ([, q]) => String(q.pending_jobs ?? "—") },
            { label: "p50 wait", class: "num", cell: ([, q]) => dur(q.p50_wait_s) },
            { label: "p95 wait", class: "num", cell: ([, q]) => dur(q.p95_wait_s) },
            { label: "max wait", class: "num", cell: ([, q]) => dur(q.max_wait_s) },
            { label: "starving", class: "num", cell: ([, q]) => String(q.starving_jobs ?? "—") },
            { label: "GPUs in use", class: "num", cell: ([, q]) => String(q.gpus_in_use ?? "—") },
            { label: "preemptions", class: "num", cell: ([, q]) => String(q.preemptions ?? "—") },
            { label: "lost GPU-h", class: "num", cell: ([, q]) => hours(q.lost_gpu_hours) },
          ],
          entries.sort((a, b) => a[0].localeCompare(b[0])),
          { rowAttrs: ([name]) => ({ dataset: { waitQueue: name } }) },
        ),
      );
    }

    return instance;
  },
};
