// Preemptions: a timeline of who was preempted for whom (GET /v1/preemptions, newest first),
// preemptions per hour and lost GPU-hours per queue, computed here from that list, and the
// lost GPU-hours the history samples record per queue (GET /v1/history).

import { Unavailable, api } from "../api.js";
import { barChart, columnChart, fmtNumber, timeline } from "../charts.js";
import { h, lookBack, notice, span, swap, table, windowButtons } from "../dom.js";
import { TIER_COLOURS, tierBadge } from "../palette.js";
import { abs, countdown, dur, nowS, when } from "../time.js";

const LIMIT = 1000;

function jobRef(id) {
  return id ? h("a", { href: `#/jobs/${encodeURIComponent(id)}` }, `#${id}`) : "—";
}

/** Hour buckets (local clock hours) from t0 to t1 with the count of preemptions in each. */
export function perHour(items, t0, t1) {
  const offset = new Date().getTimezoneOffset() * 60;
  const start = Math.floor((t0 - offset) / 3600) * 3600 + offset;
  const buckets = [];
  for (let t = start; t < t1; t += 3600) buckets.push({ t0: t, t1: t + 3600, value: 0 });
  for (const p of items) {
    const i = Math.floor((p.at - start) / 3600);
    if (i >= 0 && i < buckets.length) buckets[i].value += 1;
  }
  return buckets;
}

/** Lost GPU-hours per victim queue, from the list. */
export function lostPerQueue(items) {
  const out = new Map();
  for (const p of items) out.set(p.victim_queue, (out.get(p.victim_queue) || 0) + Number(p.lost_work_gpu_hours || 0));
  return out;
}

/**
 * A per-interval figure of the history samples (`lost_gpu_hours`, `preemptions`: what
 * happened since the sample before) summed per queue over the window. Where the server thinned
 * a long span's samples, the sum covers the samples it answered.
 */
export function historyPerQueue(samples, field) {
  const out = new Map();
  for (const s of samples) for (const [q, v] of Object.entries(s.queues || {})) {
    if (v[field] == null) continue;
    out.set(q, (out.get(q) || 0) + Number(v[field]));
  }
  return out;
}

export default {
  mount(root, _params, ctx) {
    const state = { windowS: null };
    const buttons = windowButtons(state, () => ctx.refresh());
    const tl = h("section", { "aria-labelledby": "timeline-h", id: "timeline" });
    const rates = h("section", { "aria-label": "preemptions per hour and lost GPU-hours" });
    const list = h("section", { "aria-labelledby": "list-h" });
    root.append(
      h("div", { class: "view-head" }, h("h1", null, "Preemptions"), buttons),
      h("h2", { id: "timeline-h" }, "Timeline"),
      h("p", { class: "help" }, "One lane per victim queue; a bar from SIGTERM to the victim's exit (or its SIGKILL deadline), coloured by the victim's tier; a black tick marks SIGKILL. Reclaims are outlined with dashes."),
      tl,
      rates,
      h("h2", { id: "list-h" }, "Newest first"),
      list,
    );
    return {
      title: "Preemptions",
      async update() {
        const now = nowS();
        const since = Math.floor(now - lookBack(state));
        const [items, history, queues] = await Promise.all([
          api("/preemptions", { params: { since, limit: LIMIT } }).catch((err) => err),
          api("/history", { params: { since, until: Math.ceil(now) } }).catch((err) => err),
          api("/queues").catch(() => []),
        ]);
        const leaves = new Set(queues.filter((q) => q.leaf).map((q) => q.name));
        if (items instanceof Error) {
          const text = items instanceof Unavailable ? "Preemptions are not available on this server (no GET /v1/preemptions)." : `Preemptions could not be read: ${items.message}`;
          swap(tl, notice(items instanceof Unavailable ? "unavailable" : "error", text));
          swap(rates);
          swap(list);
          if (!(items instanceof Unavailable)) throw items;
          return;
        }
        // "all": from the oldest of what the server holds, its first sample or preemption.
        const held = [history instanceof Error || !history.samples || !history.samples.length ? null : history.samples[0].at, items.length ? items[items.length - 1].at : null].filter((t) => t != null);
        const [t0, t1] = span(state, now, held.length ? Math.min(...held) : null);
        const shown = items.filter((p) => p.at >= t0);
        swap(
          tl,
          shown.length
            ? [
                timeline({ items: shown, t0, t1, tierColour: (t) => TIER_COLOURS[t] || "#999999", label: `${shown.length} preemptions since ${abs(t0)}` }),
                items.length >= LIMIT ? notice("info", `Only the newest ${LIMIT} are shown.`) : null,
              ]
            : notice("empty", "No preemption in this window."),
        );
        const lost = lostPerQueue(shown);
        const fromHistory = history instanceof Error || !history.samples ? null : historyPerQueue(history.samples, "lost_gpu_hours");
        // Victims are in leaf queues; a parent's figure in a sample only adds up its leaves'.
        const queuesSeen = [...new Set([...lost.keys(), ...(fromHistory ? fromHistory.keys() : [])])].filter((q) => !leaves.size || leaves.has(q)).sort();
        const hoursFmt = (v) => `${fmtNumber(v)} GPU-h`;
        swap(
          rates,
          h(
            "div",
            { class: "chart-grid" },
            h(
              "figure",
              { class: "chart-card" },
              h("figcaption", null, `Preemptions per hour (${shown.length} in ${dur(t1 - t0)}: ${t1 > t0 ? ((shown.length * 3600) / (t1 - t0)).toFixed(2) : "—"} an hour)`),
              columnChart({ buckets: perHour(shown, t0, t1), label: "preemptions per hour", unit: "preemptions" }),
            ),
            h(
              "figure",
              { class: "chart-card", id: "lost-per-queue" },
              h("figcaption", null, "Lost GPU-hours per queue, from the preemptions listed"),
              queuesSeen.length
                ? barChart({ bars: queuesSeen.map((q) => ({ label: q, value: lost.get(q) || 0, colour: "#56B4E9" })), label: "lost GPU-hours per queue", format: hoursFmt })
                : notice("empty", "Nothing lost."),
              fromHistory
                ? h("p", { class: "help" }, "From the history samples: ", queuesSeen.map((q, i) => [i ? "; " : "", `${q} ${hoursFmt(fromHistory.get(q) || 0)}`]), ".")
                : h("p", { class: "help" }, history instanceof Unavailable ? "History is not available on this server." : "No history samples."),
            ),
          ),
        );
        swap(
          list,
          table(
            [
              { label: "when", cell: (p) => when(p.at) },
              { label: "victim", cell: (p) => [jobRef(p.victim), " ", tierBadge(p.victim_tier), ` ${p.victim_queue}`, p.victim_user ? h("span", { class: "muted" }, ` (${p.victim_user})`) : null] },
              { label: "for", cell: (p) => (p.preemptor ? [jobRef(p.preemptor), " ", tierBadge(p.preemptor_tier), ` ${p.preemptor_queue ?? ""}`] : "—") },
              { label: "kind", cell: (p) => p.kind },
              { label: "reason", class: "wide", cell: (p) => p.reason ?? "" },
              { label: "grace used", cell: (p) => (p.grace_used_s != null ? `${dur(p.grace_used_s)} of ${dur(p.grace_s)}` : p.ended_at == null && p.kill_at != null ? countdown(p.kill_at) : `— of ${dur(p.grace_s)}`) },
              { label: "lost", class: "num", cell: (p) => (p.lost_work_gpu_hours != null ? `${Number(p.lost_work_gpu_hours).toFixed(3)} GPU-h` : "—") },
            ],
            items,
            { rowAttrs: (p) => ({ dataset: { victim: p.victim, preemptor: p.preemptor ?? "" } }), empty: "No preemption in this window." },
          ),
        );
      },
    };
  },
};
