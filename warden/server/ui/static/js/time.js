// Times in the viewer's time zone and locale, with relative ages ("3 min ago", "in 2 min").
// The API gives Unix seconds from the server's clock; the page corrects for a skewed browser
// clock with the server's Date header (second resolution: only skews above 2 s count).

import { h } from "./dom.js";

let skewMs = 0;

export function noteServerDate(header) {
  if (!header) return;
  const server = Date.parse(header);
  if (Number.isNaN(server)) return;
  const skew = server - Date.now();
  skewMs = Math.abs(skew) > 2000 ? skew : 0;
}

/** The server's now, in Unix seconds. */
export function nowS() {
  return (Date.now() + skewMs) / 1000;
}

const relFormat = new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" });
const absFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  timeZoneName: "short",
});
const clockFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const secondsFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const dayClockFormat = new Intl.DateTimeFormat(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });

/** "3 min ago", "in 2 min", "now". */
export function rel(epochS) {
  const d = epochS - nowS();
  const a = Math.abs(d);
  if (a < 5) return relFormat.format(0, "second");
  if (a < 60) return relFormat.format(Math.round(d), "second");
  if (a < 3600) return relFormat.format(Math.round(d / 60), "minute");
  if (a < 86400) return relFormat.format(Math.round(d / 3600), "hour");
  return relFormat.format(Math.round(d / 86400), "day");
}

/** The full local time, with its zone. */
export function abs(epochS) {
  return absFormat.format(new Date(epochS * 1000));
}

/** A chart axis label: the clock time, with the day when the span is longer than a day and
 * the seconds when it is shorter than 5 minutes. */
export function axisTime(epochS, spanS) {
  return (spanS > 86400 ? dayClockFormat : spanS < 300 ? secondsFormat : clockFormat).format(new Date(epochS * 1000));
}

/** A span of seconds for people: "45 s", "12 min", "3 h 5 min", "2 d 4 h". */
export function dur(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, seconds);
  if (s < 60) return `${s < 10 ? s.toFixed(1).replace(/\.0$/, "") : Math.round(s)} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) {
    const hours = Math.floor(s / 3600);
    const mins = Math.round((s - hours * 3600) / 60);
    return mins ? `${hours} h ${mins} min` : `${hours} h`;
  }
  const days = Math.floor(s / 86400);
  const hours = Math.round((s - days * 86400) / 3600);
  return hours ? `${days} d ${hours} h` : `${days} d`;
}

/** "1:05" / "1:02:03": what is left until a deadline. */
export function clock(seconds) {
  const s = Math.max(0, Math.ceil(seconds));
  const hh = Math.floor(s / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, "0");
  return hh ? `${hh}:${String(mm).padStart(2, "0")}:${ss}` : `${mm}:${ss}`;
}

/** A <time> showing the relative age, the full time in its title; the page's ticker keeps it current. */
export function when(epochS, { prefix = "" } = {}) {
  if (epochS === null || epochS === undefined) return "—";
  return h(
    "time",
    { datetime: new Date(epochS * 1000).toISOString(), title: abs(epochS), dataset: { rel: epochS, prefix } },
    prefix + rel(epochS),
  );
}

/** A countdown to a SIGKILL deadline, ticking every second. */
export function countdown(epochS, label = "SIGKILL in ") {
  return h(
    "span",
    { class: "countdown", title: `SIGKILL at ${abs(epochS)}`, dataset: { countdown: epochS, label } },
    countdownText(epochS, label),
  );
}

function countdownText(epochS, label) {
  const left = epochS - nowS();
  return left > 0 ? label + clock(left) : "SIGKILL due";
}

/** Move every relative time and countdown on the page one tick on. */
export function tick(root = document) {
  for (const el of root.querySelectorAll("[data-rel]")) el.textContent = (el.dataset.prefix || "") + rel(Number(el.dataset.rel));
  for (const el of root.querySelectorAll("[data-countdown]")) el.textContent = countdownText(Number(el.dataset.countdown), el.dataset.label || "");
}

/**
 * A reason's message names absolute times as "t=1733216400s" (the engine's clock); shown
 * with the viewer's clock instead: "14:05, in 3 min". Small t (a simulator's clock) stays.
 */
export function humanizeMessage(message) {
  return String(message ?? "").replace(/t=(\d{9,})s/g, (_, t) => {
    const at = Number(t);
    return `${clockFormat.format(new Date(at * 1000))}, ${rel(at)}`;
  });
}
