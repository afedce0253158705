"""The HTTP API under `/v1` (FastAPI; the OpenAPI document is at `/openapi.json`).

Every request but `/metrics` and `/v1/health` carries `Authorization: Bearer <token>`; a
token is bound to a user, the leaf queues they may submit to, and a role (user or admin).
Bad input gets a 4xx and a JSON body naming the field and the value
(`{"error": {"field": …, "value": …, "message": …}}`), and changes nothing.
"""

# No `from __future__ import annotations`: FastAPI reads these signatures at run time.

import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import ExitStack
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from warden.engine.model import JobState
from warden.engine.overcommit import quota_warnings
from warden.server.auth import Principal, bearer, require_admin
from warden.server.errors import ApiError, ErrorBody, error_body, safe_value, shorten
from warden.server.expensive_request_limits import PerUserLimit, ServerBudget
from warden.server.explanations import wall_times
from warden.server.export import PARQUET_HINT, Export, csv_chunks, parquet_chunks
from warden.server.history import MOST_SAMPLES, SPAN_MAX_S, history_view
from warden.server.requests import INT32_MAX, INT64_MAX, Name, PolicyRequest, ReportRequest, SubmitRequest, TokenRequest
from warden.server.service import Service
from warden.server.views import (
    action_view,
    cycles_of,
    job_detail,
    job_summary,
    listed_jobs,
    node_views,
    preemption_view,
    queue_views,
    verdict_view,
)
from warden.store.tokens import TokenInfo

T = TypeVar("T")
EXPORT_FILES = {
    "native": ("warden-trace.csv", "text/csv; charset=utf-8"),
    "parquet": ("warden-trace.parquet", "application/vnd.apache.parquet"),
}
"""`GET /v1/history/export`'s file name and media type for each format."""
PRIVATE_FIELDS = ("command", "workdir")
"""What `GET /v1/jobs/{id}` leaves out of another user's job under `--private-data jobs`."""

API_VERSION = "v1"
TIME_MAX = 1e11
"""The latest time (unix seconds, about the year 5100) a request may name."""
DAY_S = 86400.0
PAGE_MAX = 1000
"""The most jobs, or preemptions, one page may carry."""
OFFSET_MAX = 10**9
EXPORT_DEFAULT_S = 30 * 86400.0
EXPORT_MAX_S = 400 * 86400.0
"""How far back `GET /v1/history/export` reaches by default, and at most."""

log = logging.getLogger("warden.server")


def _token_view(t: TokenInfo) -> dict[str, Any]:
    """A token's grant as `GET /v1/tokens` lists it; never the secret (only its hash is kept)."""
    return {
        "id": t.id,
        "user": t.user,
        "role": t.role,
        "queues": list(t.queues),
        "created_at": t.created_at,
        "created_by": t.created_by,
        "expires_at": t.expires_at,
        "revoked_at": t.revoked_at,
    }


# -- refusals -----------------------------------------------------------------------------------

_ANSWERS = {
    400: "malformed request: the body is not JSON, not UTF-8, or nested too deeply",
    401: "no token, or an unknown, expired or revoked one",
    403: "the token's role or queues do not allow this",
    404: "no such job, attempt or token",
    409: "the job is in the wrong state, the token is revoked already, or an Idempotency-Key was used for another request",
    413: "the request body is larger than the policy's limits.max_body_bytes",
    422: "a field, parameter or header is invalid or above a limit",
    429: (
        "a limit of the user's is reached: it submits (dry runs counted) faster than its limit, too many jobs of the user or "
        "queue wait, or it already has as many of these requests in progress as one user may"
    ),
    503: (
        "the server works on as many policy diffs, history exports and dry runs as it may at once, every "
        "user together (the policy's limits.expensive_requests_at_once); retry after Retry-After"
    ),
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route: each refusal it may give, all in the one error shape."""
    return {s: {"model": ErrorBody, "description": _ANSWERS[s]} for s in sorted({400, 413, 422, *statuses})}


def install_error_handlers(app: FastAPI) -> None:
    """One error shape for every refusal: the field, the value, the message; FastAPI's and
    Starlette's own refusals (validation, malformed bodies, unknown routes) included."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        found = [_validation_detail(e) for e in err.errors()]
        status = 400 if any(e.get("type") == "json_invalid" for e in err.errors()) else 422
        return JSONResponse(error_body(found or [_detail("body", None, "invalid request")]), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body([_http_detail(request, err)]), status_code=err.status_code, headers=getattr(err, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _bug(request: Request, err: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=err)
        detail = _detail("request", None, f"internal error ({type(err).__name__}); the server log has the details")
        return JSONResponse(error_body([detail]), status_code=500)


def _detail(field: str, value: Any, message: str) -> dict[str, Any]:
    return {"field": shorten(field), "value": safe_value(value), "message": message}


def _validation_detail(e: Any) -> dict[str, Any]:
    loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path", "header", "[key]")]
    kind = e.get("type")
    if kind == "json_invalid":
        return _detail("body", None, "malformed JSON: " + str(e.get("ctx", {}).get("error", e.get("msg"))))
    if kind == "extra_forbidden":
        return _detail(".".join(loc) or "body", e.get("input"), "is not a field of this request")
    message = str(e.get("msg", "invalid")).removeprefix("Value error, ")
    return _detail(".".join(loc) or "body", e.get("input"), message)


def _http_detail(request: Request, err: StarletteHTTPException) -> dict[str, Any]:
    if err.status_code == 404:
        return _detail("path", request.url.path, "no such endpoint; the API is under /v1 (see /openapi.json)")
    if err.status_code == 405:
        return _detail("method", request.method, f"is not allowed on {shorten(request.url.path)}")
    if err.status_code == 400:
        cause = err.__cause__
        if isinstance(cause, UnicodeDecodeError):
            return _detail("body", None, "malformed JSON: not valid UTF-8")
        if isinstance(cause, RecursionError):
            return _detail("body", None, "malformed JSON: nested too deeply")
        return _detail("body", None, f"malformed request body: {err.detail}")
    return _detail("request", None, str(err.detail))


class BodyLimit:
    """Refuses a request body larger than `limit()` bytes with a 413 before anything reads it
    (a declared Content-Length, or the bytes as they arrive)."""

    def __init__(self, app: Any, limit: Callable[[], int]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _too_large(send, limit, int(declared) if declared.isdigit() else None)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone, or its body timed out (warden.server.connections)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await _too_large(send, limit, None)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


async def _too_large(send: Callable[[MutableMapping[str, Any]], Awaitable[None]], limit: int, size: int | None) -> None:
    detail = _detail(
        "body", size, f"the request body is larger than the limit of {limit} bytes (limits.max_body_bytes)"
    )
    payload = json.dumps(error_body([detail])).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def install_request_limits(app: FastAPI, service: Service) -> None:
    """Bound every request body by the policy in force (`limits.max_body_bytes`)."""
    app.add_middleware(BodyLimit, limit=lambda: service.policy.limits.max_body_bytes)


class RoleHeader:
    """Every answer says who answered: `X-Warden-Role: leader` or `standby`, and
    `X-Warden-Leader`, the leading server's API where this one knows it (a standby's answers
    are as current as the database; only the leader schedules)."""

    def __init__(self, app: Any, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_role(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                headers.append((b"x-warden-role", self.service.terms.role.encode()))
                leader = self.service.terms.leader_url()
                if leader:
                    headers.append((b"x-warden-leader", leader.encode("latin-1", "replace")))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_role)


def install_role_header(app: FastAPI, service: Service) -> None:
    app.add_middleware(RoleHeader, service=service)


JobId = Annotated[str, Path(description="a job id: ASCII digits, from 1 to 2^63 - 1")]
TokenId = Annotated[str, Path(description="a token id (`GET /v1/tokens`): ASCII digits, from 1 to 2^63 - 1")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[!-~]{1,255}$",
        description="makes a retried submission return the first job instead of creating another",
    ),
]


def build_router(service: Service) -> APIRouter:
    """The /v1 routes over a `warden.server.service.Service` (the state behind the API)."""
    r = APIRouter(prefix=f"/{API_VERSION}")
    diffs, exports = PerUserLimit("policy diffs"), PerUserLimit("history exports")
    expensive = ServerBudget(lambda: service.policy.limits.expensive_requests_at_once)

    def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        return service.auth.authenticate(authorization)

    Caller = Annotated[Principal, Depends(principal)]

    def report_bearer(authorization: Annotated[str | None, Header()] = None) -> str:
        """A report's token is checked against the job in the handler; its presence first."""
        bearer(authorization)
        return authorization or ""

    # On the event loop, not in the thread pool that the other routes share: it reads only what
    # the server holds in memory, so a pool busy with slow requests never delays it.
    @r.get("/health", responses={503: {"description": "a helper thread died: scheduling is stopped"}})
    async def health(response: Response) -> dict[str, Any]:
        dead = service.threads.dead()
        if dead:
            response.status_code = 503
        return {
            "ok": not dead,
            "passes": service.reconciler.stats.passes,
            "scheduling": "stopped" if dead else "running" if service.leading else "standby",
            "dead_threads": dead,
            "role": service.terms.role,
            "epoch": service.epoch,
            "leader": service.terms.leader_url(),
            "servers": service.peers.servers(),
        }

    @r.post(
        "/jobs",
        status_code=201,
        responses={
            200: {
                "description": "a replay: the job first submitted with this Idempotency-Key; or, with "
                "dry_run=true, what the scheduler would decide for the job now (nothing is stored)"
            },
            **errors(401, 403, 409, 429, 503),
        },
    )
    def submit(
        req: SubmitRequest,
        who: Caller,
        response: Response,
        idempotency_key: IdempotencyKey = None,
        dry_run: Annotated[
            bool, Query(description="check and plan the job on the live cluster, store and start nothing")
        ] = False,
    ) -> dict[str, Any]:
        if dry_run:
            response.status_code = 200
            with expensive.hold("dry runs"):
                verdict, state, now = service.submissions.dry_run(req, who)
            return verdict_view(verdict, state, now)
        job = service.submissions.submit(req, who, idempotency_key)
        if job.replayed:
            response.status_code = 200
            response.headers["Idempotent-Replayed"] = "true"
        return {"id": str(job.id), "state": job.state.value}

    @r.get("/whoami", responses=errors(401))
    def whoami(who: Caller) -> dict[str, Any]:
        """Who the token belongs to: what a client shows and offers (the dashboard hides what
        its user may not do; the API refuses it anyway)."""
        return {"user": who.user, "role": who.role, "queues": list(who.queues)}

    @r.get("/jobs", responses=errors(401))
    def list_jobs(
        who: Caller,
        response: Response,
        queue: Annotated[Name | None, Query()] = None,
        state: Annotated[list[Name] | None, Query(max_length=64)] = None,
        user: Annotated[Name | None, Query()] = None,
        all: bool = False,
        limit: Annotated[int | None, Query(ge=1, le=PAGE_MAX, description="at most this many (default: all)")] = None,
        offset: Annotated[int, Query(ge=0, le=OFFSET_MAX, description="skip this many first")] = 0,
    ) -> list[dict[str, Any]]:
        """Jobs holding resources (by id), then waiting ones in rank order, then finished ones;
        `X-Total-Count` is how many match the filters, whatever the page."""
        listing = listed_jobs(service.store, queue, _states(state, include_finished=all), user, offset, limit)
        response.headers["X-Total-Count"] = str(listing.total)
        page = listing.page
        now, policy = service.now(), service.policy
        view = service.forecasts.view
        cycles = cycles_of(service.store, (job for job, _ in page), policy)
        return [job_summary(job, now, attempt, policy, view(job), job.id in cycles) for job, attempt in page]

    @r.get("/jobs/{job_id}", responses=errors(401, 404))
    def get_job(job_id: JobId, who: Caller) -> dict[str, Any]:
        """One job; another user's without its command and workdir under `--private-data
        jobs` (`private` true then)."""
        job = service.ctx.job(job_id)
        attempts = service.store.attempts(job.id)
        out = job_detail(
            job,
            service.store.events(job.id),
            attempts,
            service.now(),
            service.policy,
            service.reconciler.charging.ledger,
            service.forecasts.view(job),
            links=service.store.preemption_links([job.id]),
            preemptors=service.store.queues_and_tiers(a.preempted_for for a in attempts),
        )
        readable = service.logs.may_read(who, job)
        if not readable:
            for name in PRIVATE_FIELDS:
                out.pop(name, None)
        out["private"] = not readable
        return out

    @r.post("/jobs/{job_id}/cancel", status_code=202, responses=errors(401, 403, 404, 409))
    def cancel(job_id: JobId, who: Caller) -> dict[str, Any]:
        job = service.actions.cancel(job_id, who)
        return action_view(job, service.store.attempt(job.id, job.attempt))

    @r.post("/jobs/{job_id}/approve", responses=errors(401, 403, 404, 409))
    def approve(job_id: JobId, who: Caller) -> dict[str, Any]:
        job = service.actions.approve(job_id, who)
        return action_view(job, service.store.attempt(job.id, job.attempt))

    @r.post("/jobs/{job_id}/release", responses=errors(401, 403, 404, 409))
    def release(job_id: JobId, who: Caller) -> dict[str, Any]:
        job = service.actions.release(job_id, who)
        return action_view(job, service.store.attempt(job.id, job.attempt))

    @r.post("/jobs/{job_id}/reports", status_code=202, responses=errors(401, 403, 404, 409))
    def report(
        job_id: JobId, req: ReportRequest, authorization: Annotated[str, Depends(report_bearer)]
    ) -> dict[str, Any]:
        return service.reports.take(job_id, authorization, req)

    @r.get("/jobs/{job_id}/logs", responses=errors(401, 403, 404))
    def logs(
        job_id: JobId,
        who: Caller,
        attempt: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
        rank: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
        offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    ) -> dict[str, Any]:
        return service.logs.read(job_id, attempt, rank, offset, who)

    @r.get("/nodes", responses=errors(401))
    def nodes(who: Caller) -> list[dict[str, Any]]:
        attempts = service.store.running_attempts()
        jobs = {a.job.id: a.job for a in service.store.active()}
        for job_id in {a.job_id for a in attempts} - jobs.keys():  # it ended between the two reads
            if (job := service.store.get(job_id)) is not None:
                jobs[job_id] = job
        cluster = service.reconciler.cluster
        return node_views(service.nodes, attempts, cluster.down, jobs, cluster)

    @r.get("/history", responses=errors(401))
    def history(
        who: Caller,
        since: Annotated[
            float | None,
            Query(ge=0, le=TIME_MAX, allow_inf_nan=False, description="unix seconds (default: until - 24h)"),
        ] = None,
        until: Annotated[
            float | None, Query(ge=0, le=TIME_MAX, allow_inf_nan=False, description="unix seconds (default: now)")
        ] = None,
    ) -> dict[str, Any]:
        """The samples taken from `since` to `until` (at most 31 days apart), oldest first; at
        most 2000, spread evenly over the span when it holds more."""
        now = service.now()
        end = _finite("until", until) if until is not None else now
        start = _finite("since", since) if since is not None else end - DAY_S
        if start > end:
            raise ApiError(422, "since", since, f"is after until, {wall_times(now)(end)}")
        if end - start > SPAN_MAX_S:
            raise ApiError(
                422, "since", since, f"is more than {SPAN_MAX_S / DAY_S:.0f} days before until, {wall_times(now)(end)}"
            )
        samples = service.store.samples(start, end, MOST_SAMPLES)
        return history_view(samples, service.reconciler.history.interval_s)

    @r.get("/preemptions", responses=errors(401))
    def preemptions(
        who: Caller,
        since: Annotated[
            float | None, Query(ge=0, le=TIME_MAX, allow_inf_nan=False, description="unix seconds (default: now - 24h)")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 200,
    ) -> list[dict[str, Any]]:
        """Preemptions, reclaims and evictions whose SIGTERM came at `since` or later, newest first."""
        now = service.now()
        start = _finite("since", since) if since is not None else now - DAY_S
        return [preemption_view(p, now) for p in service.store.preemptions(start, limit)]

    @r.get("/queues", responses=errors(401))
    def queues(who: Caller) -> list[dict[str, Any]]:
        return queue_views(
            service.policy, service.store, service.reconciler.charging.ledger, service.nodes, service.now()
        )

    @r.get("/policy", responses=errors(401))
    def get_policy(who: Caller) -> dict[str, Any]:
        current = service.store.current_policy()
        warnings = policy_warnings()
        if current is None:
            return {"version": 0, "source": "", "policy": service.policy.to_dict(), "warnings": warnings}
        return {"version": current.version, "source": current.source, "policy": current.resolved, "warnings": warnings}

    @r.put("/policy", responses=errors(401, 403))
    def put_policy(req: PolicyRequest, who: Caller) -> dict[str, Any]:
        version, changed = service.governance.apply_policy(req.source, who)
        return {"version": version, "changed": changed, "warnings": policy_warnings()}

    def policy_warnings() -> list[dict[str, object]]:
        """Where the policy in force promises more than the cluster has, or covers less of it
        (`quota_warnings`)."""
        return [w.to_dict() for w in quota_warnings(service.policy, service.nodes)]

    @r.post("/policy/diff", responses=errors(401, 429, 503))
    def diff_policy(req: PolicyRequest, who: Caller) -> dict[str, Any]:
        """What the policy `source` would change for the jobs in the system now, were it
        applied: validated as `PUT /v1/policy` validates it; nothing is changed. One in
        progress per user at a time (429), and the server's budget of such work (503)."""
        with diffs.hold(who.user), expensive.hold("policy diffs"):
            return service.governance.diff_policy(req.source)

    @r.get(
        "/history/export",
        responses={
            200: {"content": {"text/csv": {}, "application/vnd.apache.parquet": {}}, "description": "the trace"},
            **errors(401, 429, 503),
        },
    )
    def export_history(
        who: Caller,
        since: Annotated[
            float | None,
            Query(
                ge=0,
                le=TIME_MAX,
                allow_inf_nan=False,
                description="unix seconds (default: now - 30d; at most 400d ago)",
            ),
        ] = None,
        format: Annotated[Literal["native", "parquet"], Query(description="native CSV, or Parquet")] = "native",
    ) -> Response:
        """The jobs submitted at `since` or later that have run, as a native trace
        (docs/traces.md) that `warden sim run --trace` loads as it is. Where durations rest on
        an assumption (`duration_basis` not `observed`), a `Warning: 299` header counts them.
        One in progress per user at a time (429), and the server's budget of such work (503), both held until its rows are sent: they are read
        and sent a batch of jobs at a time, so its cost does not grow with its window."""
        now = service.now()
        start = _finite("since", since) if since is not None else now - EXPORT_DEFAULT_S
        if now - start > EXPORT_MAX_S:
            raise ApiError(422, "since", since, f"is more than {EXPORT_MAX_S / DAY_S:.0f} days ago")
        with ExitStack() as held:
            held.enter_context(exports.hold(who.user))
            held.enter_context(expensive.hold("history exports"))
            export = service.governance.export_history(start)
            chunks = _chunks(export, format)
            sent = held.pop_all()  # held until the rows are sent, or the sending stops
        headers = {"X-Total-Count": str(export.total)}
        if export.warning is not None:
            headers["Warning"] = f'299 - "{export.warning}"'
        name, media = EXPORT_FILES[format]
        headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return StreamingResponse(
            _releasing(chunks, sent), media_type=media, headers=headers, background=BackgroundTask(sent.close)
        )

    def _chunks(export: Export, format: str) -> Iterator[str] | Iterator[bytes]:
        """The export's rows as they are read (`warden.server.export`), in `format`."""
        if format == "native":
            return csv_chunks(export.rows)
        try:
            return parquet_chunks(export.rows)
        except ImportError:
            raise ApiError(422, "format", format, PARQUET_HINT) from None

    @r.post("/tokens", status_code=201, responses=errors(401, 403))
    def create_token(req: TokenRequest, who: Caller) -> dict[str, Any]:
        token, expires_at = service.governance.create_token(req, who)
        return {"user": req.user, "role": req.role, "queues": req.queues, "expires_at": expires_at, "token": token}

    @r.get("/tokens", responses=errors(401, 403))
    def list_tokens(who: Caller) -> list[dict[str, Any]]:
        """Every token's grant, revoked and expired ones included; never a secret."""
        return [_token_view(t) for t in service.governance.list_tokens(who)]

    @r.delete("/tokens/{token_id}", responses=errors(401, 403, 404, 409))
    def revoke_token(token_id: TokenId, who: Caller) -> dict[str, Any]:
        """Revoke a token (by its id in `GET /v1/tokens`): refused from the next request on."""
        return _token_view(service.governance.revoke_token(token_id, who))

    @r.get("/audit", responses=errors(401, 403))
    def audit(who: Caller, limit: int = Query(default=100, ge=1, le=10000)) -> list[dict[str, Any]]:
        require_admin(who, "read the audit log")
        return [
            {"id": a.id, "at": a.at, "actor": a.actor, "action": a.action, "target": a.target, "details": a.details}
            for a in service.store.audit_log(limit=limit)
        ]

    return r


def _finite(field: str, value: float) -> float:
    if not math.isfinite(value):
        raise ApiError(422, field, value, "is not a finite number of seconds")
    return value


def _releasing(chunks: Iterator[T], held: ExitStack) -> Iterator[T]:
    """`chunks`, then `held` let go, however the sending ends: the response's background task
    lets it go too, should the generator never be closed."""
    try:
        yield from chunks
    finally:
        held.close()


def _states(state: list[str] | None, include_finished: bool) -> set[str] | None:
    names = {s.value for s in JobState}
    if state:
        wanted = {s.strip().upper() for part in state for s in part.split(",") if s.strip()}
        bad = sorted(wanted - names)
        if bad:
            raise ApiError(422, "state", bad[0], f"is not a job state; allowed: {', '.join(sorted(names))}")
        return wanted
    if include_finished:
        return None
    return {s.value for s in JobState if not s.terminal}


def metrics_route(app: FastAPI, service: Service) -> None:
    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        body, content_type = service.metrics.render()
        return Response(content=body, media_type=content_type)
