// Building the page without parsing markup: every string from the API becomes a text node or an
// attribute value set through the DOM, never markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function apply(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "dataset") for (const [k, v] of Object.entries(value)) { if (v !== null && v !== undefined) el.dataset[k] = String(v); }
    else if (key === "style") for (const [k, v] of Object.entries(value)) el.style.setProperty(k, String(v));
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** An HTML element: h("a", {href: "#/jobs/1"}, "job ", id). Strings become text nodes. */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** An SVG element, the same way. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/**
 * Replace what `container` shows, keeping the keyboard focus where it was: the element that had
 * it carries a data-key, and the new element with the same key gets it back.
 */
export function swap(container, ...children) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.key : undefined;
  container.replaceChildren();
  append(container, children);
  if (key !== undefined) {
    const again = container.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus({ preventScroll: true });
  }
}

/** A small status line: "not available", an error, or nothing. */
export function notice(kind, ...text) {
  return h("p", { class: ["notice", `notice-${kind}`], role: kind === "error" ? "alert" : "status" }, ...text);
}

/** A table from column definitions [{label, cell: row => node|string, class}] and rows;
 * `tableClass` classes the <table>. */
export function table(columns, rows, { caption, rowAttrs, tableClass, empty = "Nothing to show." } = {}) {
  if (!rows.length) return notice("empty", empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: tableClass },
      caption ? h("caption", null, caption) : null,
      h("thead", null, h("tr", null, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label)))),
      h(
        "tbody",
        null,
        rows.map((row) => h("tr", rowAttrs ? rowAttrs(row) : null, columns.map((c) => h("td", { class: c.class }, c.cell(row))))),
      ),
    ),
  );
}

/** A definition list from [term, value, wide?] triples (null values are left out; a wide one takes a whole row). */
export function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs
      .filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v, wide]) => h("div", { class: wide ? "wide" : null }, h("dt", null, k), h("dd", null, v))),
  );
}

/** The time windows of the history views, as a group of toggle buttons. The first, "all",
 * is the span the server has data for, from its first sample up to the longest choice back;
 * the views open on it (`state.windowS` null). A press sets `state.windowS` and calls `onChange`. */
export const WINDOWS = [
  ["all", null],
  ["1 h", 3600],
  ["6 h", 6 * 3600],
  ["24 h", 86400],
  ["7 d", 7 * 86400],
];
const LONGEST_S = WINDOWS[WINDOWS.length - 1][1];

/** How far back a view asks the server for data: the window pressed, else the longest. */
export function lookBack(state) {
  return state.windowS ?? LONGEST_S;
}

/** The span [t0, t1] a view draws at `now`: the window pressed, else from `firstAt` (the
 * oldest time it has data for; null: none) to now, at most the longest window back. */
export function span(state, now, firstAt) {
  if (state.windowS != null) return [now - state.windowS, now];
  if (firstAt == null) return [now - WINDOWS[1][1], now];
  return [Math.max(now - LONGEST_S, Math.min(firstAt, now)), now];
}

export function windowButtons(state, onChange) {
  const key = (seconds) => String(seconds ?? "all");
  const buttons = WINDOWS.map(([label, seconds]) =>
    h(
      "button",
      {
        type: "button",
        "aria-pressed": String(seconds === state.windowS),
        title: seconds === null ? "what the server holds, at most 7 d back" : null,
        dataset: { key: `window-${key(seconds)}`, window: key(seconds) },
        onclick: () => {
          state.windowS = seconds;
          for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.window === key(state.windowS)));
          onChange();
        },
      },
      label,
    ),
  );
  return h("div", { class: "segmented", role: "group", "aria-label": "time window" }, buttons);
}
