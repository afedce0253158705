// Cluster: every node and GPU as a grid, grouped by flavor and topology block (GET /v1/nodes).
// A GPU cell is coloured by the tier of the job holding it and labelled with its queue and
// job; a job in its grace shows its SIGKILL deadline counting down; free and down GPUs, and
// those held by work outside warden, look different from each other and from held ones.

import { api } from "../api.js";
import { h, notice, swap } from "../dom.js";
import { tierBadge, tierLegend, tierName } from "../palette.js";
import { countdown } from "../time.js";
import { shownState } from "./jobs.js";

function cellFor(node, gpu, holder, fallbackJob) {
  const down = node.down !== null && node.down !== undefined;
  const data = { node: node.name, gpu };
  if (holder) {
    const terminating = holder.kill_at !== null && holder.kill_at !== undefined;
    const tier = holder.tier ?? "unknown";
    const title =
      `GPU ${gpu} of ${node.name}: job ${holder.job} (${holder.queue ?? "queue unknown"}, tier ${tier}${holder.tier != null ? ` ${tierName(holder.tier)}` : ""}` +
      `${holder.user ? `, ${holder.user}` : ""}), ${shownState(holder)}`;
    return h(
      "li",
      {
        class: ["gpu", "held", `tier-${tier}`, terminating && "terminating", down && "on-down"],
        dataset: { ...data, job: holder.job, queue: holder.queue, tier: holder.tier, state: holder.state },
      },
      h("a", { href: `#/jobs/${encodeURIComponent(holder.job)}`, title, dataset: { key: `gpu-${node.name}-${gpu}` } },
        h("span", { class: "gpu-index" }, `GPU ${gpu}`),
        h("span", { class: "gpu-tier" }, holder.tier != null ? `T${holder.tier}` : "T?"),
        h("span", { class: "gpu-queue" }, holder.queue ?? ""),
        h("span", { class: "gpu-job" }, `#${holder.job}`),
        terminating ? countdown(holder.kill_at) : null,
        terminating && holder.reserved_for ? h("span", { class: "gpu-reserved" }, `reserved for #${holder.reserved_for}`) : null,
      ),
    );
  }
  if (fallbackJob !== undefined) {
    // An older server: the node says which GPUs are used and which jobs run there, not who holds which.
    return h(
      "li",
      { class: ["gpu", "held", "tier-unknown", down && "on-down"], dataset: { ...data, job: fallbackJob || "" } },
      h("span", { class: "gpu-index" }, `GPU ${gpu}`),
      h("span", { class: "gpu-queue" }, "in use"),
      fallbackJob ? h("a", { href: `#/jobs/${encodeURIComponent(fallbackJob)}`, class: "gpu-job" }, `#${fallbackJob}`) : null,
    );
  }
  if (foreignIndices(node).has(gpu)) {
    return h(
      "li",
      { class: ["gpu", "foreign"], dataset: { ...data, free: "foreign" }, title: `GPU ${gpu} of ${node.name}: held by work outside warden` },
      h("span", { class: "gpu-index" }, `GPU ${gpu}`),
      h("span", { class: "gpu-queue" }, "outside warden"),
    );
  }
  if (down) {
    return h(
      "li",
      { class: ["gpu", "down"], dataset: { ...data, free: "down" }, title: `GPU ${gpu} of ${node.name}: node down (${node.down})` },
      h("span", { class: "gpu-index" }, `GPU ${gpu}`),
      h("span", { class: "gpu-queue" }, "down"),
    );
  }
  return h(
    "li",
    { class: ["gpu", "free"], dataset: { ...data, free: "free" }, title: `GPU ${gpu} of ${node.name}: free` },
    h("span", { class: "gpu-index" }, `GPU ${gpu}`),
    h("span", { class: "gpu-queue" }, "free"),
  );
}

// The GPUs of a node held by work that is not warden's, where the executor can tell which
// (Slurm); on Ray only their count is known (`gpus_foreign`, the card's badge).
function foreignIndices(node) {
  return new Set((node.gpu_indices_foreign || []).map(Number));
}

function nodeCard(node) {
  const holders = new Map();
  const hasHolders = Array.isArray(node.holders);
  const gpuless = [];
  for (const holder of node.holders || []) {
    if (holder.gpu === null || holder.gpu === undefined) gpuless.push(holder);
    else holders.set(Number(holder.gpu), holder);
  }
  const used = new Set((node.gpu_indices_used || []).map(Number));
  const onlyJob = (node.jobs || []).length === 1 ? String(node.jobs[0]) : null;
  const cells = [];
  for (let g = 0; g < node.gpus; g++) {
    const holder = holders.get(g);
    const fallback = !hasHolders && used.has(g) ? onlyJob : undefined;
    cells.push(cellFor(node, g, holder, fallback));
  }
  const free = node.gpus_free ?? node.gpus - used.size;
  return h(
    "article",
    { class: ["node", node.down != null && "node-down"], dataset: { node: node.name } },
    h(
      "header",
      null,
      h("h3", null, node.name),
      h(
        "p",
        { class: "node-meta" },
        `${node.gpus} GPU${node.gpus === 1 ? "" : "s"} · ${free} free`,
        node.down != null ? h("span", { class: "badge badge-down" }, `down: ${node.down}`) : null,
        node.gpus_foreign ? h("span", { class: "badge", dataset: { foreign: node.gpus_foreign } }, `${node.gpus_foreign} held outside warden`) : null,
      ),
    ),
    h("ul", { class: "gpus", "aria-label": `GPUs of ${node.name}` }, cells),
    gpuless.length
      ? h(
          "p",
          { class: "node-meta" },
          "Also here, holding no GPU: ",
          gpuless.map((g, i) => [i ? ", " : "", h("a", { href: `#/jobs/${encodeURIComponent(g.job)}`, dataset: { gpuless: g.job } }, `#${g.job}`), g.queue ? ` (${g.queue})` : ""]),
        )
      : null,
  );
}

function summary(nodes) {
  let total = 0;
  let used = 0;
  let down = 0;
  let terminating = 0;
  let foreign = 0;
  const byTier = { 1: 0, 2: 0, 3: 0, 4: 0 };
  for (const n of nodes) {
    total += n.gpus;
    const nUsed = n.gpus_used ?? (n.gpu_indices_used || []).length;
    used += nUsed;
    if (n.down != null) down += n.gpus - nUsed;
    else foreign += n.gpus_foreign || 0;
    for (const holder of n.holders || []) {
      if (holder.gpu === null || holder.gpu === undefined) continue;
      if (holder.tier != null) byTier[holder.tier] = (byTier[holder.tier] || 0) + 1;
      if (holder.kill_at != null) terminating += 1;
    }
  }
  const free = total - used - down - foreign;
  return h(
    "dl",
    { class: "stats" },
    stat("GPUs", total),
    stat("in use", used),
    stat("free", free, "free"),
    stat("down", down, "down"),
    foreign ? stat("outside warden", foreign) : null,
    stat("in grace", terminating),
    Object.entries(byTier).map(([t, n]) => stat(h("span", null, tierBadge(Number(t)), " GPUs"), n)),
  );
}

function stat(label, value, key) {
  return h("div", { dataset: { stat: key || (typeof label === "string" ? label : "") } }, h("dt", null, label), h("dd", null, String(value)));
}

function groupKey(n) {
  return `${n.flavor ?? "default"}\u0000${n.block ?? ""}`;
}

export default {
  mount(root) {
    const head = h("div", { class: "view-head" }, h("h1", null, "Cluster"), tierLegend());
    const key = h(
      "ul",
      { class: "legend", "aria-label": "GPU states" },
      h("li", null, h("span", { class: "swatch gpu-swatch free" }), " free"),
      h("li", null, h("span", { class: "swatch gpu-swatch down" }), " down"),
      h("li", null, h("span", { class: "swatch gpu-swatch foreign" }), " held outside warden"),
      h("li", null, h("span", { class: "swatch gpu-swatch terminating tier-3" }), " in grace (SIGTERM sent; SIGKILL countdown; reserved for its preemptor)"),
    );
    const stats = h("section", { "aria-label": "summary" });
    const grid = h("section", { class: "cluster", "aria-label": "nodes" });
    root.append(head, key, stats, grid);
    return {
      title: "Cluster",
      async update() {
        let nodes;
        try {
          nodes = await api("/nodes");
        } catch (err) {
          swap(grid, notice("error", `The nodes are not available: ${err.message}`));
          throw err;
        }
        swap(stats, summary(nodes));
        const groups = new Map();
        for (const n of [...nodes].sort((a, b) => groupKey(a).localeCompare(groupKey(b)) || a.name.localeCompare(b.name, undefined, { numeric: true }))) {
          const k = groupKey(n);
          if (!groups.has(k)) groups.set(k, []);
          groups.get(k).push(n);
        }
        const sections = [];
        for (const members of groups.values()) {
          const first = members[0];
          const gpus = members.reduce((a, n) => a + n.gpus, 0);
          sections.push(
            h(
              "section",
              { class: "node-group", dataset: { flavor: first.flavor ?? "", block: first.block ?? "" } },
              h(
                "h2",
                null,
                `flavor ${first.flavor ?? "default"}`,
                first.block != null ? ` · block ${first.block}` : " · no block",
                h("span", { class: "muted" }, ` — ${members.length} node${members.length === 1 ? "" : "s"}, ${gpus} GPUs`),
              ),
              h("div", { class: "nodes" }, members.map(nodeCard)),
            ),
          );
        }
        if (!nodes.length) sections.push(notice("empty", "The server has no nodes."));
        if (nodes.length && !nodes.some((n) => Array.isArray(n.holders))) {
          sections.unshift(notice("info", "This server does not say which job holds which GPU (no holders in GET /v1/nodes): cells show use only."));
        }
        swap(grid, sections);
      },
    };
  },
};
