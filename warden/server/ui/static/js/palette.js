// Okabe–Ito, the palette colour-blind readers can tell apart; every colour also comes with a
// label or a line style, never alone.

import { h } from "./dom.js";

export const TIER_COLOURS = {
  1: "#D55E00", // vermillion
  2: "#0072B2", // blue
  3: "#009E73", // bluish green
  4: "#E69F00", // orange
};

export const TIER_NAMES = { 1: "production inference", 2: "pre-training", 3: "experimentation", 4: "opportunistic" };

let tierNames = { ...TIER_NAMES };

/** Take the tier names from the policy in force (GET /v1/policy → policy.tiers). */
export function setTierNames(policy) {
  const tiers = policy && policy.tiers;
  if (!tiers) return;
  for (const [n, t] of Object.entries(tiers)) if (t && t.name) tierNames[n] = t.name;
}

export function tierName(tier) {
  return tierNames[tier] || `tier ${tier}`;
}

/** A tier badge: "T1", its colour, its name in the title. */
export function tierBadge(tier) {
  if (tier === null || tier === undefined) return "—";
  return h("span", { class: ["tier", `tier-${tier}`], title: `tier ${tier}: ${tierName(tier)}` }, `T${tier}`);
}

export function tierLegend() {
  return h(
    "ul",
    { class: "legend", "aria-label": "tiers" },
    [1, 2, 3, 4].map((t) => h("li", null, h("span", { class: ["swatch", `tier-${t}`] }, `T${t}`), ` ${tierName(t)}`)),
  );
}
