// The public /v1 API, called with the signed-in token. The token lives in this tab's
// sessionStorage only: never in a URL, a cookie or localStorage. A 401 signs the tab out.
// Which endpoints the server has is read from its OpenAPI document, so that a view never calls
// a missing one and says "not available" instead.

import { noteServerDate } from "./time.js";

const TOKEN = "warden.token";
const ROLE = "warden.role";
const USER = "warden.user";

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function signIn(value) {
  sessionStorage.setItem(TOKEN, value);
  sessionStorage.removeItem(ROLE);
  sessionStorage.removeItem(USER);
}

export function signOut() {
  sessionStorage.removeItem(TOKEN);
  sessionStorage.removeItem(ROLE);
  sessionStorage.removeItem(USER);
}

/** A refusal or failure of the API: `status` (0 when the server could not be reached), the message. */
export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** The endpoint is not on this server (yet). */
export class Unavailable extends Error {
  constructor(path) {
    super(`${path} is not available on this server`);
    this.path = path;
  }
}

let unauthorized = () => {};

/** What to do when the server refuses the token (401): sign out and show the sign-in page. */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

let spec = null;

/** Read /openapi.json once (it needs no token). Without it, every endpoint is assumed present. */
export async function loadSpec() {
  if (spec) return spec;
  try {
    const res = await fetch("/openapi.json", { cache: "no-store", credentials: "omit" });
    spec = res.ok ? await res.json() : { paths: null };
  } catch {
    spec = { paths: null };
  }
  return spec;
}

/** Whether the server offers `method path` (path as in the OpenAPI document, e.g. "/v1/history"). */
export function has(method, path) {
  if (!spec || !spec.paths) return true;
  return Boolean(spec.paths[path] && spec.paths[path][method.toLowerCase()]);
}

function errorMessage(status, body) {
  const e = body && body.error;
  if (e && e.message) return e.field ? `${e.field}: ${e.message}` : e.message;
  return `the server answered ${status}`;
}

/**
 * Call the API: api("/jobs", {params: {state: ["PENDING"], limit: 100}}). Answers the JSON
 * body, or {data, headers} with `full`. `template` names the OpenAPI path when it has
 * parameters ("/v1/jobs/{job_id}"), so that a missing endpoint is never called.
 */
export async function api(path, { method = "GET", params, body, full = false, template } = {}) {
  const spec_path = template || `/v1${path}`;
  if (!has(method, spec_path)) throw new Unavailable(spec_path);
  const url = new URL(`/v1${path}`, location.origin);
  for (const [key, value] of Object.entries(params || {})) {
    if (value === null || value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(key, String(v));
  }
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
  } catch (err) {
    throw new ApiError(0, "the server cannot be reached", null);
  }
  noteServerDate(res.headers.get("Date"));
  let data = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (res.status === 401) {
    signOut();
    unauthorized();
    throw new ApiError(401, "the server refused the token: sign in again", data);
  }
  if (res.status === 404 && data && data.error && data.error.field === "path") throw new Unavailable(spec_path);
  if (!res.ok) throw new ApiError(res.status, errorMessage(res.status, data), data);
  return full ? { data, headers: res.headers } : data;
}

/** Who the token belongs to, {user, role, queues} (`GET /v1/whoami`), asked once per sign-in. */
export async function identity() {
  const role = sessionStorage.getItem(ROLE);
  if (role) return { role, user: sessionStorage.getItem(USER) || null };
  const me = await api("/whoami");
  const who = { role: me.role === "admin" ? "admin" : "user", user: me.user ?? null };
  sessionStorage.setItem(ROLE, who.role);
  if (who.user) sessionStorage.setItem(USER, who.user);
  return who;
}
