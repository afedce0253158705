// The dashboard's shell: sign-in, hash routes, the navigation, and the refresh loop (every
// 5 s while the tab is visible; the page is never reloaded, only the views' parts are redrawn).

import { ApiError, api, identity, loadSpec, onUnauthorized, signOut, token } from "./api.js";
import { h, swap } from "./dom.js";
import { setTierNames } from "./palette.js";
import { nowS, tick, when } from "./time.js";
import cluster from "./views/cluster.js";
import governance from "./views/governance.js";
import job from "./views/job.js";
import jobs from "./views/jobs.js";
import preemptions from "./views/preemptions.js";
import queues from "./views/queues.js";
import signin from "./views/signin.js";

const REFRESH_MS = 5000;
const NEXT = "warden.next";

const ROUTES = [
  { name: "cluster", pattern: /^\/cluster$/, view: cluster, nav: "Cluster" },
  { name: "queues", pattern: /^\/queues$/, view: queues, nav: "Queues" },
  { name: "jobs", pattern: /^\/jobs$/, view: jobs, nav: "Jobs" },
  { name: "job", pattern: /^\/jobs\/([^/]+)$/, view: job },
  { name: "preemptions", pattern: /^\/preemptions$/, view: preemptions, nav: "Preemptions" },
  { name: "governance", pattern: /^\/governance$/, view: governance, nav: "Governance", admin: true },
  { name: "signin", pattern: /^\/signin$/, view: signin },
];

const main = document.getElementById("view");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const updated = document.getElementById("updated");

let current = null; // {route, instance, key}
let me = null; // {user, role}
let timer = null;
let running = false;
let again = false;
let generation = 0;

function parse() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, "")) || "/cluster";
  for (const route of ROUTES) {
    const m = hash.match(route.pattern);
    if (m) return { route, params: m.slice(1), key: hash };
  }
  return { route: null, params: [], key: hash };
}

function renderChrome() {
  const signedIn = Boolean(token());
  document.body.classList.toggle("signed-out", !signedIn);
  const active = current && current.route ? current.route.name : null;
  swap(
    nav,
    signedIn
      ? h(
          "ul",
          null,
          ROUTES.filter((r) => r.nav && (!r.admin || (me && me.role === "admin"))).map((r) =>
            h(
              "li",
              null,
              h(
                "a",
                {
                  href: `#/${r.name}`,
                  "aria-current": active === r.name || (active === "job" && r.name === "jobs") ? "page" : null,
                  dataset: { key: `nav-${r.name}`, nav: r.name },
                },
                r.nav,
              ),
            ),
          ),
        )
      : null,
  );
  swap(
    who,
    signedIn && me
      ? [
          h("span", { class: ["role", `role-${me.role}`], dataset: { role: me.role } }, me.user ? `${me.user} · ${me.role}` : me.role),
          h("button", { type: "button", class: "link-button", onclick: doSignOut, dataset: { key: "signout" } }, "Sign out"),
        ]
      : null,
  );
}

function doSignOut() {
  signOut();
  me = null;
  location.hash = "#/signin";
}

async function route() {
  const next = parse();
  generation += 1;
  const mine = generation;
  if (current && current.instance && current.instance.destroy) current.instance.destroy();
  current = null;
  clearTimeout(timer);
  if (!token() && (!next.route || next.route.name !== "signin")) {
    sessionStorage.setItem(NEXT, location.hash || "#/cluster");
    location.replace("#/signin");
    return;
  }
  if (token() && !me) {
    try {
      me = await identity();
      setTierNames((await api("/policy")).policy);
    } catch (err) {
      if (!token()) return; // a 401: onUnauthorized has moved to the sign-in page
      me = me || { role: "user", user: null };
    }
    if (mine !== generation) return;
  }
  if (token() && next.route && next.route.name === "signin") {
    location.replace(sessionStorage.getItem(NEXT) || "#/cluster");
    return;
  }
  const ctx = { me, refresh: () => refresh(), signedIn: afterSignIn };
  main.dataset.route = next.route ? next.route.name : "unknown";
  main.dataset.updates = "0";
  current = { ...next, instance: null };
  renderChrome();
  if (!next.route) {
    swap(main, h("h1", null, "Not found"), h("p", null, "No such page. ", h("a", { href: "#/cluster" }, "Go to the cluster.")));
    return;
  }
  if (next.route.admin && (!me || me.role !== "admin")) {
    swap(main, h("h1", null, next.route.nav), h("p", { class: "notice" }, "This page is for admins only."));
    document.title = `${next.route.nav} · warden`;
    return;
  }
  main.replaceChildren();
  current.instance = next.route.view.mount(main, next.params, ctx);
  document.title = `${current.instance.title || next.route.nav || "warden"} · warden`;
  main.focus({ preventScroll: true });
  await refresh();
}

async function afterSignIn() {
  me = null;
  const target = sessionStorage.getItem(NEXT) || "#/cluster";
  sessionStorage.removeItem(NEXT);
  if (location.hash === target) await route();
  else location.hash = target;
}

async function refresh() {
  if (!current || !current.instance || !current.instance.update) return;
  if (running) {
    again = true;
    return;
  }
  running = true;
  clearTimeout(timer);
  const inst = current.instance;
  try {
    await inst.update();
    if (current && current.instance === inst) {
      main.dataset.updates = String(Number(main.dataset.updates || "0") + 1);
      swap(updated, "Updated ", when(nowS()));
    }
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) {
      swap(updated, h("span", { class: "stale", role: "alert" }, `Refresh failed: ${err.message}`));
    }
  } finally {
    running = false;
  }
  if (again) {
    again = false;
    return refresh();
  }
  schedule();
}

function schedule() {
  clearTimeout(timer);
  if (!current || !current.instance || !current.instance.update || current.instance.static) return;
  timer = setTimeout(() => {
    if (document.hidden) return; // resumed by visibilitychange
    refresh();
  }, REFRESH_MS);
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) clearTimeout(timer);
  else refresh();
});

onUnauthorized(() => {
  me = null;
  if (current && current.route && current.route.name !== "signin") sessionStorage.setItem(NEXT, location.hash);
  sessionStorage.setItem("warden.refused", "1");
  location.hash = "#/signin";
});

window.addEventListener("hashchange", route);
// The skip link moves the focus; it must not change the hash, which holds the route.
document.getElementById("skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
setInterval(() => tick(document), 1000);

(async () => {
  await loadSpec();
  await route();
})();
