// One job (GET /v1/jobs/{id}): why it waits, its attempts with placement, SIGTERM and SIGKILL
// times and lost work, its preemptions and preemption cycle, its events, and its logs followed
// live (GET /v1/jobs/{id}/logs with offset). Cancel for its owner or an admin; approve and
// release for an admin.

import { ApiError, Unavailable, api, has } from "../api.js";
import { facts, h, notice, swap, table } from "../dom.js";
import { tierBadge, tierName } from "../palette.js";
import { countdown, dur, when } from "../time.js";
import { PROTECTED_HELP, efficiency, expectedStart, leaseEnd, reasonCell, shownState, stateBadge, tier1From } from "./jobs.js";

const LOG_POLL_MS = 2000;
const LOG_KEEP = 2_000_000; // characters kept in the page

const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"];

function placementText(placement) {
  if (!placement || !placement.length) return "—";
  return placement.map((p) => `${p.node}: GPU ${p.gpus.length ? p.gpus.join(", ") : "none"}`).join("; ");
}

export default {
  mount(root, params, ctx) {
    const id = params[0];
    const base = `/jobs/${encodeURIComponent(id)}`;
    const head = h("div", { class: "view-head" }, h("h1", null, `Job #${id}`));
    const actions = h("div", { class: "actions", "aria-live": "polite" });
    const summary = h("section", { "aria-label": "summary" });
    const attempts = h("section", { "aria-labelledby": "attempts-h" });
    const events = h("section", { "aria-labelledby": "events-h" });
    root.append(
      h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "← Jobs")),
      head,
      actions,
      summary,
      h("h2", { id: "attempts-h" }, "Attempts"),
      attempts,
    );

    // -- logs: built once, kept across refreshes (their scroll position and text stay) --
    const logs = { attempt: null, rank: 0, offset: 0, chosen: false, eof: false, timer: null, scheduled: false, again: false, busy: false, length: 0 };
    const attemptSelect = h("select", { id: "log-attempt" });
    const rankSelect = h("select", { id: "log-rank" });
    const follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
    const pre = h("pre", { class: "log", id: "log-text", tabindex: "0", "aria-label": "log output", "aria-live": "off" });
    const logState = h("p", { class: "help", id: "log-state" });
    const logSection = h(
      "section",
      { "aria-labelledby": "logs-h", class: "logs" },
      h("h2", { id: "logs-h" }, "Logs"),
      h(
        "div",
        { class: "filters" },
        h("label", { for: "log-attempt" }, "Attempt "),
        attemptSelect,
        h("label", { for: "log-rank" }, " Rank "),
        rankSelect,
        h("label", { class: "check" }, follow, " follow"),
      ),
      pre,
      logState,
    );
    const caused = h("section", { "aria-labelledby": "caused-h", id: "caused" });
    const preempted = h("section", { "aria-labelledby": "preempted-h", id: "preempted" });
    root.append(
      logSection,
      h("h2", { id: "preempted-h" }, "Its preemptions"),
      preempted,
      h("h2", { id: "caused-h" }, "Preemptions it caused"),
      caused,
      h("h2", { id: "events-h" }, "Events"),
      events,
    );

    function resetLogs() {
      logs.offset = 0;
      logs.eof = false;
      logs.length = 0;
      pre.textContent = "";
    }
    attemptSelect.addEventListener("change", () => {
      logs.attempt = Number(attemptSelect.value);
      logs.chosen = true;
      resetLogs();
      pollLogs();
    });
    rankSelect.addEventListener("change", () => {
      logs.rank = Number(rankSelect.value);
      resetLogs();
      pollLogs();
    });
    follow.addEventListener("change", () => pollLogs());

    async function pollLogs() {
      clearTimeout(logs.timer);
      logs.scheduled = false;
      if (logs.attempt === null) return;
      if (logs.busy) {
        logs.again = true; // the controls changed during a read: read again after it
        return;
      }
      if (!has("GET", "/v1/jobs/{job_id}/logs")) {
        swap(logState, "Logs are not available on this server.");
        return;
      }
      logs.busy = true;
      const want = { attempt: logs.attempt, rank: logs.rank };
      try {
        // Read until caught up (1 MiB a call), then wait for more.
        for (let i = 0; i < 8; i++) {
          const out = await api(`${base}/logs`, { params: { attempt: want.attempt, rank: want.rank, offset: logs.offset }, template: "/v1/jobs/{job_id}/logs" });
          if (want.attempt !== logs.attempt || want.rank !== logs.rank) {
            logs.again = true; // switched meanwhile: this answer is for the old choice
            break;
          }
          if (out.text) {
            const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
            pre.append(document.createTextNode(out.text));
            logs.length += out.text.length;
            if (logs.length > LOG_KEEP) {
              pre.textContent = pre.textContent.slice(-LOG_KEEP / 2);
              logs.length = pre.textContent.length;
            }
            if (atBottom) pre.scrollTop = pre.scrollHeight;
          }
          logs.offset = out.offset;
          logs.eof = Boolean(out.eof);
          if (!out.text || out.text.length < 1 << 19) break;
        }
        swap(logState, logs.eof ? "End of this attempt's output." : follow.checked ? "Following…" : "Paused.", ` ${logs.offset.toLocaleString()} bytes.`);
      } catch (err) {
        swap(logState, err instanceof Unavailable ? "Logs are not available on this server." : `Logs could not be read: ${err.message}`);
      } finally {
        logs.busy = false;
      }
      if (logs.again) {
        logs.again = false;
        pollLogs();
        return;
      }
      if (follow.checked && !logs.eof && !document.hidden && logs.attempt !== null) {
        logs.scheduled = true;
        logs.timer = setTimeout(pollLogs, LOG_POLL_MS);
      }
    }
    const onVisible = () => {
      if (!document.hidden) pollLogs();
    };
    document.addEventListener("visibilitychange", onVisible);

    function syncLogControls(job) {
      const count = Math.max(job.attempt || 0, (job.attempts || []).length);
      if (attemptSelect.options.length !== count) {
        attemptSelect.replaceChildren(...Array.from({ length: count }, (_, i) => h("option", { value: i + 1 }, `${i + 1}`)));
      }
      if (rankSelect.options.length !== job.replicas) {
        rankSelect.replaceChildren(...Array.from({ length: job.replicas }, (_, i) => h("option", { value: i }, `${i}`)));
        rankSelect.value = String(logs.rank);
      }
      if (!count) {
        swap(logState, "The job has not run yet.");
        return;
      }
      if (job.private) {
        // Another user's job under the server's --private-data jobs: its logs are refused (403).
        swap(logState, "Hidden: another user's logs (the server's --private-data jobs).");
        return;
      }
      const latest = count;
      if (logs.attempt === null || (!logs.chosen && logs.attempt !== latest)) {
        logs.attempt = latest;
        attemptSelect.value = String(logs.attempt);
        resetLogs();
        pollLogs();
        return;
      }
      attemptSelect.value = String(logs.attempt);
      if (!logs.scheduled && !logs.busy && !logs.eof && follow.checked) pollLogs();
    }

    // -- actions --
    let confirming = false;
    let message = null;

    function renderActions(job) {
      const items = [];
      const admin = ctx.me && ctx.me.role === "admin";
      const owner = ctx.me && ctx.me.user && ctx.me.user === job.user;
      const mayCancel = admin || owner;
      if (!TERMINAL.includes(job.state) && mayCancel) {
        if (confirming) {
          items.push(
            h("span", null, `Cancel job #${job.id}? It gets SIGTERM, its grace, then SIGKILL. `),
            h("button", { type: "button", class: "danger", id: "cancel-confirm", dataset: { key: "cancel-confirm" }, onclick: () => act("cancel", "cancelled") }, "Yes, cancel it"),
            h("button", { type: "button", id: "cancel-keep", dataset: { key: "cancel-keep" }, onclick: () => { confirming = false; renderActions(job); } }, "Keep it"),
          );
        } else {
          items.push(h("button", { type: "button", class: "danger", id: "cancel", dataset: { key: "cancel" }, onclick: () => { confirming = true; renderActions(job); document.getElementById("cancel-confirm")?.focus(); } }, "Cancel job…"));
        }
      }
      if (admin && job.state === "AWAITING_APPROVAL") {
        items.push(h("button", { type: "button", id: "approve", dataset: { key: "approve", approve: job.id }, onclick: () => act("approve", "approved") }, "Approve"));
      }
      if (admin && job.held_reason && has("POST", "/v1/jobs/{job_id}/release")) {
        items.push(h("button", { type: "button", id: "release", dataset: { key: "release" }, onclick: () => act("release", "released") }, "Release"));
      }
      swap(actions, items, message);
    }

    async function act(verb, done) {
      confirming = false;
      try {
        const out = await api(`${base}/${verb}`, { method: "POST", template: `/v1/jobs/{job_id}/${verb}` });
        message = h("p", { class: "notice notice-ok", role: "status" }, `Job #${id} ${done}: now ${String(shownState(out)).toLowerCase()}.`);
      } catch (err) {
        const text =
          err instanceof ApiError && err.status === 403
            ? verb === "cancel"
              ? "Only the job's owner or an admin may cancel it."
              : "Only an admin may do that."
            : err.message;
        message = h("p", { class: "notice notice-error", role: "alert" }, `Could not ${verb} job #${id}: ${text}`);
      }
      await ctx.refresh();
    }

    return {
      title: `Job #${id}`,
      destroy() {
        clearTimeout(logs.timer);
        logs.attempt = null;
        document.removeEventListener("visibilitychange", onVisible);
      },
      async update() {
        let job;
        try {
          job = await api(base, { template: "/v1/jobs/{job_id}" });
        } catch (err) {
          swap(summary, notice("error", err instanceof ApiError && err.status === 404 ? `No job #${id}.` : `The job could not be read: ${err.message}`));
          if (err instanceof ApiError && err.status === 404) return;
          throw err;
        }
        swap(head, h("h1", null, `Job #${job.id}`, job.name ? h("span", { class: "muted" }, ` ${job.name}`) : null, " ", stateBadge(shownState(job))));
        renderActions(job);
        const last = job.attempts && job.attempts.length ? job.attempts[job.attempts.length - 1] : null;
        const waiting = ["AWAITING_APPROVAL", "PENDING", "REQUEUED"].includes(job.state);
        swap(
          summary,
          waiting || job.held_reason
            ? h(
                "div",
                { class: "why", dataset: { job: job.id } },
                h("h2", null, "Why it waits"),
                reasonCell(job),
                job.position != null ? h("p", null, `Position ${job.position} in the ranked list.`) : null,
                h("p", null, "Expected start: ", expectedStart(job)),
                job.expected_start && job.expected_start.at != null
                  ? h("p", { class: "muted" }, `An estimate: it assumes ${job.expected_start.assumes}.`)
                  : job.expected_start && job.expected_start.why
                    ? h("p", { class: "muted" }, `No estimate: ${job.expected_start.why}.`)
                    : null,
                job.sort_key ? h("details", null, h("summary", null, "Sort key"), h("pre", { class: "json" }, JSON.stringify(job.sort_key, null, 2))) : null,
              )
            : null,
          last && last.kill_at != null && last.ended_at == null ? h("p", { class: "callout terminating-note" }, "In its grace: ", countdown(last.kill_at)) : null,
          (job.warnings || []).map((w) => h("p", { class: "notice notice-warn", role: "note" }, w)),
          job.preemption_cycle
            ? h("p", { class: "notice notice-warn cycle-warning", role: "note", dataset: { cycle: job.preemption_cycle.kind } }, `Preemption cycle (${job.preemption_cycle.kind.replace("_", " ")}): ${job.preemption_cycle.message}`)
            : null,
          facts([
            ["user", job.user],
            ["queue", job.queue],
            ["tier", h("span", null, tierBadge(job.tier), ` ${tierName(job.tier)}`)],
            ["GPUs", job.replicas > 1 ? `${job.replicas} replicas × ${job.gpus_per_replica} = ${job.gpus}` : String(job.gpus)],
            ["cpu, memory", job.cpu || job.memory ? `${job.cpu} millicores, ${job.memory} MiB per replica` : null],
            ["flavor", job.flavor],
            ["placement", job.placement],
            ["submitted", when(job.submit_at)],
            ["waited", dur(job.wait_s)],
            ["lease", job.preemptible === false ? "not preemptible" : job.lease_s != null ? dur(job.lease_s) : null],
            [
              job.tier > 1 ? h("span", { title: PROTECTED_HELP }, "protected from tiers 2–4 until") : "protected until",
              job.started_at != null && job.preemptible !== false ? leaseEnd(job) : null,
            ],
            ["protected from tier 1 until", tier1From(job)],
            ["η", job.started_at != null ? efficiency(job.efficiency) : null],
            ["grace", job.grace_s != null ? dur(job.grace_s) : null],
            ["time limit", job.time_limit_s != null ? dur(job.time_limit_s) : null],
            ["approved by", job.approved_by],
            ["claim", job.claim ? JSON.stringify(job.claim) : null],
            ["exit code", job.exit_code != null ? String(job.exit_code) : null],
            ["finished", job.finished_at != null ? when(job.finished_at) : null],
            ["held", job.held_reason],
            [
              "command",
              job.private
                ? "hidden (another user's job)"
                : job.command_expired_at != null
                  ? h("span", null, "dropped ", when(job.command_expired_at), " to make room (limits.max_stored_bytes_per_user)")
                  : job.command ? h("code", { class: "command" }, job.command.join(" ")) : null,
              true,
            ],
            ["workdir", job.private ? "hidden (another user's job)" : job.workdir ? h("code", null, job.workdir) : null, true],
          ]),
        );
        swap(
          attempts,
          table(
            [
              { label: "#", class: "num", cell: (a) => String(a.number) },
              { label: "state", cell: (a) => a.state },
              { label: "placement", cell: (a) => placementText(a.placement) },
              { label: "started", cell: (a) => when(a.started_at) },
              { label: "ended", cell: (a) => when(a.ended_at) },
              { label: "SIGTERM", cell: (a) => when(a.sigterm_at) },
              { label: "SIGKILL", cell: (a) => (a.kill_at == null ? "—" : a.ended_at == null ? countdown(a.kill_at) : when(a.kill_at)) },
              { label: "reason", cell: (a) => a.reason ?? "—" },
              { label: "preempted for", cell: (a) => (a.preempted_for ? h("a", { href: `#/jobs/${encodeURIComponent(a.preempted_for)}` }, `#${a.preempted_for}`) : "—") },
              { label: "lost work", class: "num", cell: (a) => (a.lost_work_gpu_s != null ? `${(a.lost_work_gpu_s / 3600).toFixed(3)} GPU-h` : "—") },
              { label: "last checkpoint", cell: (a) => when(a.last_checkpoint_at) },
              { label: "checkpoints", class: "num", cell: (a) => (a.checkpoints != null ? String(a.checkpoints) : "—") },
              { label: "step", class: "num", cell: (a) => (a.progress_step != null ? String(a.progress_step) : "—") },
              { label: "exit codes", cell: (a) => (a.exit_codes ? a.exit_codes.join(", ") : "—") },
              { label: "log dir", cell: (a) => (a.log_dir ? h("code", null, a.log_dir) : "—") },
            ],
            [...(job.attempts || [])].reverse(),
            { rowAttrs: (a) => ({ dataset: { attempt: a.number } }), empty: "No attempt yet." },
          ),
        );
        swap(
          preempted,
          table(
            [
              { label: "attempt", class: "num", cell: (p) => String(p.attempt) },
              { label: "when", cell: (p) => when(p.at) },
              { label: "for", cell: (p) => (p.by ? h("a", { href: `#/jobs/${encodeURIComponent(p.by)}` }, `#${p.by}`) : "—") },
              { label: "its queue", cell: (p) => p.by_queue ?? "—" },
              { label: "its tier", cell: (p) => (p.by_tier != null ? tierBadge(p.by_tier) : "—") },
              { label: "kind", cell: (p) => p.kind },
              { label: "grace used", class: "num", cell: (p) => (p.grace_used_s != null ? dur(p.grace_used_s) : "in its grace") },
              { label: "lost work", class: "num", cell: (p) => (p.lost_work_gpu_hours != null ? `${p.lost_work_gpu_hours.toFixed(3)} GPU-h` : "—") },
              { label: "η", class: "num", cell: (p) => efficiency(p.efficiency) },
            ],
            job.preemptions || [],
            { rowAttrs: (p) => ({ dataset: { attempt: p.attempt, by: p.by ?? "" } }), empty: "None." },
          ),
        );
        swap(
          events,
          table(
            [
              { label: "when", cell: (e) => when(e.at) },
              { label: "from", cell: (e) => (e.from ? stateBadge(e.from) : "—") },
              { label: "to", cell: (e) => stateBadge(e.to) },
              { label: "reason", class: "wide", cell: (e) => e.reason ?? "" },
              { label: "by", cell: (e) => e.actor ?? "" },
            ],
            [...(job.events || [])].reverse(),
            { empty: "No event yet." },
          ),
        );
        syncLogControls(job);
        await renderCaused(job);
      },
    };

    /** The jobs this one preempted (GET /v1/preemptions since its submission, its own rows). */
    async function renderCaused(job) {
      let rows;
      try {
        rows = await api("/preemptions", { params: { since: job.submit_at, limit: 1000 } });
      } catch (err) {
        swap(caused, notice("error", `The preemptions could not be read: ${err.message}`));
        return;
      }
      swap(
        caused,
        table(
          [
            { label: "when", cell: (p) => when(p.at) },
            { label: "victim", cell: (p) => h("a", { href: `#/jobs/${encodeURIComponent(p.victim)}` }, `#${p.victim}`) },
            { label: "queue", cell: (p) => p.victim_queue ?? "—" },
            { label: "tier", cell: (p) => (p.victim_tier != null ? tierBadge(p.victim_tier) : "—") },
            { label: "kind", cell: (p) => p.kind },
            { label: "grace used", class: "num", cell: (p) => (p.grace_used_s != null ? dur(p.grace_used_s) : "in its grace") },
            { label: "lost work", class: "num", cell: (p) => (p.lost_work_gpu_hours != null ? `${p.lost_work_gpu_hours.toFixed(3)} GPU-h` : "—") },
          ],
          rows.filter((p) => p.preemptor === job.id),
          { rowAttrs: (p) => ({ dataset: { victim: p.victim } }), empty: "None." },
        ),
      );
    }
  },
};
