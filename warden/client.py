"""A small client of warden's HTTP API, used by the CLI.

The server's address comes from `WARDEN_URL` (default `http://127.0.0.1:8765`) and the token
from `WARDEN_TOKEN`; without one, the admin token a local server wrote into its state
directory is used, so the CLI works out of the box on the server's own machine. Flags
override both.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from warden.paths import default_state_dir

DEFAULT_URL = "http://127.0.0.1:8765"
SUBMIT_BACKOFF_S = 0.5
"""The first pause before a submission is sent again; it doubles on each retry."""


class ApiRefused(Exception):
    """The server refused a request (4xx/5xx); `field`, `value` and `message` say why."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            self.field, self.value, self.message = error.get("field"), error.get("value"), error.get("message", "")
        else:
            self.field, self.value, self.message = None, None, str(body)
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.field is None:
            return f"the server answered {self.status}: {self.message}"
        got = "" if self.value is None else f" (got {self.value!r})"
        return f"{self.field}: {self.message}{got}"


class Unreachable(Exception):
    pass


def local_token() -> str | None:
    """The admin token a server on this machine wrote at its first start, if readable."""
    state = default_state_dir()
    try:
        return (state / "admin-token").read_text().strip() or None
    except OSError:
        return None


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("WARDEN_URL") or DEFAULT_URL).rstrip("/")
        self.token = token or os.environ.get("WARDEN_TOKEN") or local_token()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.TransportError as err:
            raise Unreachable(f"cannot reach the warden server at {self.url}: {err}") from None
        if r.status_code >= 400:
            try:
                raise ApiRefused(r.status_code, r.json())
            except ValueError:
                raise ApiRefused(r.status_code, r.text) from None
        return r

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        r = self._send(method, path, **kw)
        try:
            return r.json()
        except ValueError:
            return r.text

    def submit(self, *, idempotency_key: str | None = None, retries: int = 0, **job: Any) -> dict[str, Any]:
        """Submit a job. With an `idempotency_key`, a submission whose answer was lost (the
        server unreachable, a timeout) is sent again up to `retries` times with the same key:
        the server then answers with the job the first one created, never a second job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        for attempt in range(retries + 1):
            try:
                return self._call("POST", "/v1/jobs", json=job, headers=headers)
            except Unreachable:
                if not idempotency_key or attempt == retries:
                    raise
                time.sleep(SUBMIT_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def dry_run(self, **job: Any) -> dict[str, Any]:
        """What the scheduler would decide for this job now; nothing is submitted."""
        return self._call("POST", "/v1/jobs", json=job, params={"dry_run": "true"})

    def jobs(
        self, queue: str | None = None, state: str | None = None, user: str | None = None, all: bool = False
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {k: v for k, v in {"queue": queue, "state": state, "user": user}.items() if v}
        if all:
            params["all"] = "true"
        return self._call("GET", "/v1/jobs", params=params)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def approve(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/approve")

    def release(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/release")

    def logs(self, job_id: str, attempt: int | None = None, rank: int = 0, offset: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return self._call("GET", f"/v1/jobs/{job_id}/logs", params=params)

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes")

    def queues(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/queues")

    def policy(self) -> dict[str, Any]:
        return self._call("GET", "/v1/policy")

    def apply_policy(self, source: str) -> dict[str, Any]:
        return self._call("PUT", "/v1/policy", json={"source": source})

    def diff_policy(self, source: str) -> dict[str, Any]:
        return self._call("POST", "/v1/policy/diff", json={"source": source})

    def export_history(self, since: float | None = None, format: str = "native") -> bytes:
        """The trace `GET /v1/history/export` answers: CSV text, or Parquet, as bytes."""
        params: dict[str, Any] = {"format": format}
        if since is not None:
            params["since"] = since
        return self._send("GET", "/v1/history/export", params=params).content

    def create_token(
        self, user: str, role: str, queues: list[str], expires_in_s: float | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"user": user, "role": role, "queues": queues}
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return self._call("POST", "/v1/tokens", json=body)

    def tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens")

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")

    def audit(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/audit", params={"limit": limit})

    def metrics(self) -> str:
        try:
            return self._http.get("/metrics").text
        except httpx.TransportError as err:
            raise Unreachable(f"cannot reach the warden server at {self.url}: {err}") from None
