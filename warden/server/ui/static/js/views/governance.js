// Governance (admins): the jobs awaiting approval with an Approve button
// (POST /v1/jobs/{id}/approve), the policy in force and its versions (GET /v1/policy; the
// versions from the audit log's policy.apply entries), and the audit log (GET /v1/audit).

import { ApiError, api, has } from "../api.js";
import { h, notice, swap, table } from "../dom.js";
import { tierBadge } from "../palette.js";
import { when } from "../time.js";
import { jobLink, jobsPage, shownState } from "./jobs.js";

const PAGE = 100;
const AUDIT = 200;

/** The version a `policy.apply` audit entry made: its target `policy/N` (PUT /v1/policy), or
 * its details' `version` (a policy file given at the server's start); null when it names none. */
function appliedVersion(entry) {
  const m = /^policy\/(\d+)$/.exec(entry.target || "");
  if (m) return Number(m[1]);
  const v = entry.details && entry.details.version;
  return Number.isInteger(v) ? v : null;
}

export default {
  mount(root, _params, ctx) {
    let offset = 0;
    let message = null;
    const inForce = h("p", { class: "callout", id: "policy-in-force" });
    const approvals = h("section", { "aria-labelledby": "approvals-h", id: "approvals" });
    const policy = h("section", { "aria-labelledby": "policy-h", id: "policy" });
    const audit = h("section", { "aria-labelledby": "audit-h", id: "audit" });
    root.append(
      h("div", { class: "view-head" }, h("h1", null, "Governance")),
      inForce,
      h("h2", { id: "approvals-h" }, "Awaiting approval"),
      approvals,
      h("h2", { id: "policy-h" }, "Policy"),
      policy,
      h("h2", { id: "audit-h" }, "Audit log"),
      audit,
    );

    async function approve(id) {
      try {
        const out = await api(`/jobs/${encodeURIComponent(id)}/approve`, { method: "POST", template: "/v1/jobs/{job_id}/approve" });
        message = h("p", { class: "notice notice-ok", role: "status", dataset: { approved: id } }, `Job #${id} approved: now ${String(shownState(out)).toLowerCase()}.`);
      } catch (err) {
        message = h("p", { class: "notice notice-error", role: "alert" }, `Could not approve job #${id}: ${err.message}`);
      }
      await ctx.refresh();
    }

    return {
      title: "Governance",
      async update() {
        const [page, pol, log] = await Promise.all([
          jobsPage(["AWAITING_APPROVAL"], offset, PAGE).catch((err) => err),
          api("/policy").catch((err) => err),
          api("/audit", { params: { limit: AUDIT } }).catch((err) => err),
        ]);
        if (page instanceof Error) swap(approvals, message, notice("error", `The jobs could not be read: ${page.message}`));
        else {
          const total = page.total ?? page.jobs.length;
          swap(
            approvals,
            message,
            table(
              [
                { label: "job", cell: jobLink },
                { label: "user", cell: (j) => j.user },
                { label: "queue", cell: (j) => j.queue },
                { label: "tier", cell: (j) => tierBadge(j.tier) },
                { label: "GPUs", class: "num", cell: (j) => String(j.gpus) },
                { label: "submitted", cell: (j) => when(j.submit_at) },
                {
                  label: "",
                  cell: (j) =>
                    has("POST", "/v1/jobs/{job_id}/approve")
                      ? h("button", { type: "button", class: "approve", dataset: { approve: j.id, key: `approve-${j.id}` }, onclick: () => approve(j.id) }, `Approve #${j.id}`)
                      : "—",
                },
              ],
              page.jobs,
              { rowAttrs: (j) => ({ dataset: { job: j.id } }), empty: "No job awaits approval." },
            ),
            total > PAGE
              ? h(
                  "nav",
                  { class: "pager", "aria-label": "approval pages" },
                  h("button", { type: "button", disabled: offset === 0, dataset: { key: "approvals-prev" }, onclick: () => { offset = Math.max(0, offset - PAGE); ctx.refresh(); } }, "← Previous"),
                  h("span", null, `${offset + 1}–${Math.min(total, offset + PAGE)} of ${total}`),
                  h("button", { type: "button", disabled: offset + PAGE >= total, dataset: { key: "approvals-next" }, onclick: () => { offset += PAGE; ctx.refresh(); } }, "Next →"),
                )
              : null,
          );
        }
        const versions = log instanceof Error ? [] : log.filter((a) => a.action === "policy.apply");
        if (pol instanceof Error) {
          swap(inForce, "The policy in force could not be read.");
          swap(policy, notice("error", `The policy could not be read: ${pol.message}`));
        } else {
          const applied = versions.find((a) => appliedVersion(a) === pol.version);
          inForce.dataset.policyVersion = pol.version;
          swap(
            inForce,
            pol.version
              ? [
                  "Policy ",
                  h("strong", null, `version ${pol.version}`),
                  " is in force",
                  applied ? [", applied ", when(applied.at), ` by ${applied.actor}`] : null,
                  ".",
                ]
              : "The default policy is in force (no version stored).",
          );
          swap(
            policy,
            (pol.warnings || []).map((w) => h("p", { class: "notice notice-warn", role: "note" }, w.message || JSON.stringify(w))),
            versions.length
              ? table(
                  [
                    { label: "version", cell: (a) => String(appliedVersion(a) ?? "—") },
                    { label: "applied", cell: (a) => when(a.at) },
                    { label: "by", cell: (a) => a.actor },
                    { label: "from", cell: (a) => (/^policy\/\d+$/.test(a.target || "") ? "PUT /v1/policy" : h("code", { class: "small" }, a.target || "")) },
                    { label: "", cell: (a) => (appliedVersion(a) === pol.version ? h("strong", { class: "in-force" }, "in force") : "") },
                  ],
                  versions,
                  { caption: "Versions applied (from the audit log)", rowAttrs: (a) => ({ dataset: { version: appliedVersion(a) ?? "" } }) },
                )
              : null,
            h("details", null, h("summary", null, "Source"), h("pre", { class: "json", tabindex: "0" }, pol.source || "(the default policy: no source stored)")),
            h("details", null, h("summary", null, "Resolved, with defaults"), h("pre", { class: "json", tabindex: "0" }, JSON.stringify(pol.policy, null, 2))),
          );
        }
        if (log instanceof Error) {
          swap(audit, notice("error", log instanceof ApiError && log.status === 403 ? "The audit log is for admins only." : `The audit log could not be read: ${log.message}`));
        } else {
          swap(
            audit,
            table(
              [
                { label: "when", cell: (a) => when(a.at) },
                { label: "actor", cell: (a) => a.actor },
                { label: "action", cell: (a) => h("code", null, a.action) },
                { label: "target", cell: (a) => a.target ?? "" },
                { label: "details", class: "wide", cell: (a) => (a.details && Object.keys(a.details).length ? h("code", { class: "small" }, JSON.stringify(a.details)) : "") },
              ],
              log,
              { caption: `The newest ${AUDIT} entries`, rowAttrs: (a) => ({ dataset: { audit: a.id } }) },
            ),
          );
        }
      },
    };
  },
};
