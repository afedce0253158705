// Jobs: the waiting jobs in rank order with their reason, position and expected start, and
// the running ones with when they may be preempted and their last checkpoint, a page at a time
// (GET /v1/jobs?limit=&offset=, X-Total-Count), so that 5,000 pending jobs stay fast.

import { api } from "../api.js";
import { h, notice, swap, table } from "../dom.js";
import { tierBadge } from "../palette.js";
import { abs, countdown, dur, humanizeMessage, when } from "../time.js";

export const WAITING = ["AWAITING_APPROVAL", "PENDING", "REQUEUED"];
export const HOLDING = ["ADMITTED", "STARTING", "RUNNING", "PREEMPTING"];
const PENDING_PAGE = 100;
const RUNNING_PAGE = 50;

function byRank(a, b) {
  const pa = a.position ?? Number.POSITIVE_INFINITY;
  const pb = b.position ?? Number.POSITIVE_INFINITY;
  if (pa !== pb) return pa - pb;
  return Number(a.id) - Number(b.id);
}

/** One page of jobs in `states`, as the server pages them: {jobs, total}, `total` being how
 * many match (`X-Total-Count`), whatever the page. */
export async function jobsPage(states, offset, limit, extra = {}) {
  const { data, headers } = await api("/jobs", { params: { state: states.join(","), ...extra, limit, offset }, full: true });
  return { jobs: data, total: Number(headers.get("X-Total-Count")) };
}

const TIME_KEYS = /(_at|^eta|^due|^until)$/;

/** A reason's details as short "key value" pairs; Unix times become relative ones. */
export function reasonDetails(details) {
  const items = Object.entries(details || {}).filter(([, v]) => v !== null && v !== undefined && !(Array.isArray(v) && !v.length));
  if (!items.length) return null;
  return h(
    "ul",
    { class: "details" },
    items.map(([k, v]) =>
      h(
        "li",
        null,
        h("span", { class: "k" }, k.replaceAll("_", " ")),
        " ",
        typeof v === "number" && TIME_KEYS.test(k) && v > 1e9 ? when(v) : h("span", { class: "v" }, Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : String(v)),
      ),
    ),
  );
}

export function reasonCell(job) {
  const r = job.reason;
  if (!r) return job.held_reason ? h("span", { class: "reason" }, h("code", null, "Held"), " ", job.held_reason) : "—";
  return h(
    "div",
    { class: "reason", dataset: { code: r.code } },
    h("code", { class: "reason-code" }, r.code),
    " ",
    h("span", { class: "reason-message" }, humanizeMessage(r.message)),
    reasonDetails(r.details),
  );
}

/** When the job is expected to start, as the server's forecast estimates it (with what it
 * assumes in the tooltip), or why nothing bounds it. */
export function expectedStart(job) {
  const e = job.expected_start;
  if (!e) return "—";
  if (e.at == null) return h("span", { class: "expected muted", title: e.why || "nothing bounds it" }, "unknown");
  return h("span", { class: "expected", title: `an estimate: it assumes ${e.assumes}` }, "≈ ", when(e.at));
}

export function jobLink(job) {
  return h(
    "a",
    { href: `#/jobs/${encodeURIComponent(job.id)}`, dataset: { key: `job-${job.id}` } },
    `#${job.id}`,
    job.name ? h("span", { class: "job-name" }, ` ${job.name}`) : null,
  );
}

/** η as a percentage, never below 0 (an older server may send a negative one while the
 * attempt's startup and an assumed save still outweigh its run). */
export function efficiency(value) {
  if (value == null) return "—";
  return h("span", { title: "forward-progress efficiency of this attempt" }, `${Math.round(Math.max(0, value) * 100)} %`);
}

/** Whom the protection `lease_end_at` names guards a running job against: the thrash guard
 * (efficiency floor, preemption budget) never holds back a tier-1 job taking a lower tier. */
export const PROTECTED_HELP =
  "When a job of tiers 2–4 may first preempt it: its lease, stretched by the efficiency floor, " +
  "and its preemption budget. A tier-1 job may preempt a lower tier once its lease alone is over.";

/** When a running job may first be preempted by a job of tiers 2–4 (`lease_end_at`), its title
 * saying that tier 1 is held by its lease alone: "not preemptible" when its tier never is (the
 * API's `preemptible`), "—" while it is in its grace. */
export function leaseEnd(job) {
  if (job.kill_at != null) return "—";
  if (job.preemptible === false) {
    return h("span", { class: "muted", title: `tier ${job.tier} is never preempted (tiers.${job.tier}.preemptible in the policy)` }, "not preemptible");
  }
  const at = when(job.lease_end_at);
  if (job.lease_end_at != null && job.tier > 1) {
    at.title = `protected from tiers 2–4 until ${abs(job.lease_end_at)}; from tier 1 only by its lease`;
  }
  return at;
}

/** When a tier-1 job may first preempt a running job of a lower tier: once its lease alone is
 * over (`started_at` + `lease_s`, which only GET /v1/jobs/{id} gives); null where that does not
 * apply or is not known. */
export function tier1From(job) {
  if (job.kill_at != null || job.preemptible === false || !(job.tier > 1)) return null;
  if (job.started_at == null || job.lease_s == null) return null;
  return when(job.started_at + job.lease_s);
}

/** The state a person reads of a job: the API's `shown_state` (CANCELLING or STOPPING for one
 * being stopped, else its `state`), in every job, holder and action answer the API gives. */
export function shownState(job) {
  return job.shown_state;
}

export function stateBadge(state) {
  return h("span", { class: ["state", `state-${String(state).toLowerCase()}`] }, String(state).replaceAll("_", " ").toLowerCase());
}

function pager(label, offset, size, total, count, onMove) {
  const last = total === null ? offset + count : total;
  const from = count ? offset + 1 : 0;
  const to = offset + count;
  return h(
    "nav",
    { class: "pager", "aria-label": `${label} pages` },
    h("button", { type: "button", disabled: offset === 0, dataset: { key: `${label}-prev` }, onclick: () => onMove(Math.max(0, offset - size)) }, "← Previous"),
    h("span", { class: "pager-range", dataset: { total: total ?? "" } }, total === null ? `${from}–${to}` : `${from.toLocaleString()}–${to.toLocaleString()} of ${total.toLocaleString()}`),
    h(
      "button",
      { type: "button", disabled: to >= last && (total !== null || count < size), dataset: { key: `${label}-next` }, onclick: () => onMove(offset + size) },
      "Next →",
    ),
  );
}

export default {
  mount(root, _params, ctx) {
    let pendingOffset = 0;
    let runningOffset = 0;
    let queue = "";
    const filter = h("select", { id: "jobs-queue", dataset: { key: "jobs-queue" } }, h("option", { value: "" }, "all queues"));
    filter.addEventListener("change", () => {
      queue = filter.value;
      pendingOffset = 0;
      runningOffset = 0;
      ctx.refresh();
    });
    const pending = h("section", { "aria-labelledby": "pending-h", id: "pending" });
    const running = h("section", { "aria-labelledby": "running-h", id: "running" });
    root.append(
      h("div", { class: "view-head" }, h("h1", null, "Jobs"), h("div", { class: "filters" }, h("label", { for: "jobs-queue" }, "Queue "), filter)),
      h("h2", { id: "pending-h" }, "Waiting, in rank order"),
      pending,
      h("h2", { id: "running-h" }, "Running"),
      running,
    );
    let queuesLoaded = false;

    async function loadQueues() {
      if (queuesLoaded) return;
      try {
        const rows = await api("/queues");
        for (const q of rows.filter((r) => r.leaf)) filter.append(h("option", { value: q.name }, q.name));
        queuesLoaded = true;
      } catch {
        // the filter stays "all queues"
      }
    }

    return {
      title: "Jobs",
      async update() {
        await loadQueues();
        const extra = queue ? { queue } : {};
        const [p, r] = await Promise.all([
          jobsPage(WAITING, pendingOffset, PENDING_PAGE, extra).catch((err) => err),
          jobsPage(HOLDING, runningOffset, RUNNING_PAGE, extra).catch((err) => err),
        ]);
        if (p instanceof Error) swap(pending, notice("error", `The waiting jobs are not available: ${p.message}`));
        else {
          const rows = [...p.jobs].sort(byRank);
          swap(
            pending,
            pager("waiting", pendingOffset, PENDING_PAGE, p.total, rows.length, (o) => {
              pendingOffset = o;
              ctx.refresh();
            }),
            table(
              [
                { label: "#", class: "num", cell: (j) => (j.position != null ? String(j.position) : "—") },
                { label: "job", cell: jobLink },
                { label: "user", cell: (j) => j.user },
                { label: "queue", cell: (j) => j.queue },
                { label: "tier", cell: (j) => tierBadge(j.tier) },
                { label: "GPUs", class: "num", cell: (j) => (j.replicas > 1 ? `${j.replicas}×${j.gpus_per_replica}` : String(j.gpus)) },
                { label: "state", cell: (j) => stateBadge(shownState(j)) },
                { label: "waited", class: "num", cell: (j) => dur(j.wait_s) },
                { label: "why it waits", class: "wide", cell: reasonCell },
                { label: "expected start", cell: expectedStart },
              ],
              rows,
              { rowAttrs: (j) => ({ dataset: { job: j.id, state: j.state } }), empty: "No job is waiting." },
            ),
          );
        }
        if (r instanceof Error) swap(running, notice("error", `The running jobs are not available: ${r.message}`));
        else {
          const rows = [...r.jobs].sort((a, b) => Number(a.id) - Number(b.id));
          swap(
            running,
            pager("running", runningOffset, RUNNING_PAGE, r.total, rows.length, (o) => {
              runningOffset = o;
              ctx.refresh();
            }),
            table(
              [
                { label: "job", cell: jobLink },
                { label: "user", cell: (j) => j.user },
                { label: "queue", cell: (j) => j.queue },
                { label: "tier", cell: (j) => tierBadge(j.tier) },
                { label: "GPUs", class: "num", cell: (j) => (j.replicas > 1 ? `${j.replicas}×${j.gpus_per_replica}` : String(j.gpus)) },
                { label: "state", cell: (j) => [stateBadge(shownState(j)), j.kill_at != null ? [" ", countdown(j.kill_at)] : null] },
                { label: "started", cell: (j) => when(j.started_at) },
                { label: h("span", { title: PROTECTED_HELP }, "protected until"), class: "lease-end", cell: leaseEnd },
                { label: "last checkpoint", cell: (j) => when(j.last_checkpoint_at) },
                { label: "η", class: "num eta", cell: (j) => efficiency(j.efficiency) },
              ],
              rows,
              { rowAttrs: (j) => ({ dataset: { job: j.id, state: j.state } }), empty: "No job is running." },
            ),
          );
        }
        if (p instanceof Error) throw p;
        if (r instanceof Error) throw r;
      },
    };
  },
};
