"""The HTTP API under `/v1` (FastAPI; the OpenAPI document is at `/openapi.json`).

Every request but `/metrics` and `/v1/health` carries `Authorization: Bearer <token>`; a
token is bound to a user, the leaf queues they may submit to, and a role (user or admin).
Bad input gets a 4xx and a JSON body naming the field and the value
(`{"error": {"field": …, "value": …, "message": …}}`), and changes nothing.
"""

# No `from __future__ import annotations`: FastAPI reads these signatures at run time.

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator

from warden.engine.model import JobState
from warden.engine.policy import Duration
from warden.server.auth import Principal
from warden.server.errors import ApiError
from warden.server.views import job_detail, job_summary, node_views, queue_views

if TYPE_CHECKING:
    from warden.server.service import Service

API_VERSION = "v1"


class SubmitRequest(BaseModel):
    """A job: a command run as `replicas` × (`gpus`, `cpu`, `memory`), admitted and evicted whole."""

    model_config = ConfigDict(extra="forbid")

    queue: str = Field(min_length=1)
    tier: int = Field(ge=1, le=4)
    command: list[str] = Field(min_length=1)
    name: str = ""
    gpus: int = Field(default=1, ge=0, description="GPUs per replica")
    replicas: int = Field(default=1, ge=1)
    cpu: int = Field(default=0, ge=0, description="millicores per replica")
    memory: int = Field(default=0, ge=0, description="MiB per replica")
    flavor: str | None = None
    placement: Literal["pack", "block", "any"] = "any"
    lease: Duration | None = Field(default=None, description="minimum runtime, e.g. 30m")
    grace: Duration | None = Field(default=None, description="grace period after SIGTERM, e.g. 300s")
    time_limit: Duration | None = Field(default=None, description="runtime estimate, used for reservations")
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _non_empty_program(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("the program (first word) is empty")
        return v


class ReportRequest(BaseModel):
    """What the workload SDK tells the server about the attempt it runs in."""

    model_config = ConfigDict(extra="forbid")

    attempt: int = Field(ge=1)
    kind: Literal["startup", "progress", "checkpoint_started", "checkpoint_finished"]
    at: float | None = None
    startup_s: float | None = Field(default=None, ge=0)
    step: int | None = Field(default=None, ge=0)
    samples: int | None = Field(default=None, ge=0)
    duration_s: float | None = Field(default=None, ge=0)
    size_bytes: int | None = Field(default=None, ge=0)
    on_sigterm: bool | None = None


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Literal["user", "admin"] = "user"
    queues: list[str] = Field(default_factory=lambda: ["*"])


class PolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="the policy YAML, as written")


def install_error_handlers(app: FastAPI) -> None:
    """One error shape for every refusal: the field, the value, the message."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        errors = []
        for e in err.errors():
            loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
            value = e.get("input")
            if e.get("type") == "extra_forbidden":
                message = "is not a field of this request"
            elif e.get("type") == "json_invalid":
                message = "malformed JSON: " + str(e.get("ctx", {}).get("error", e.get("msg")))
                value = None
            else:
                message = e.get("msg", "invalid")
            errors.append({"field": ".".join(loc) or "body", "value": _jsonable(value), "message": message})
        status = 400 if any(x["message"].startswith("malformed JSON") for x in errors) else 422
        return JSONResponse({"error": errors[0], "errors": errors}, status_code=status)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def build_router(service: "Service") -> APIRouter:
    """The /v1 routes over a `warden.server.service.Service` (the state behind the API)."""
    r = APIRouter(prefix=f"/{API_VERSION}")

    def principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
        return service.authenticate(authorization)

    Caller = Annotated[Principal, Depends(principal)]

    @r.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "passes": service.reconciler.stats.passes}

    @r.post("/jobs", status_code=201)
    def submit(req: SubmitRequest, who: Caller) -> dict[str, Any]:
        job = service.submit(req, who)
        return {"id": str(job.id), "state": job.state.value}

    @r.get("/jobs")
    def list_jobs(
        who: Caller,
        queue: str | None = None,
        state: list[str] | None = Query(default=None),
        user: str | None = None,
        all: bool = False,
    ) -> list[dict[str, Any]]:
        states = _states(state, include_finished=all)
        return [job_summary(j, service.now()) for j in service.store.list(queue=queue, state=states, user=user)]

    @r.get("/jobs/{job_id}")
    def get_job(job_id: str, who: Caller) -> dict[str, Any]:
        job = service.job(job_id)
        return job_detail(
            job, service.store.events(job.id), service.store.attempts(job.id), service.now(), service.policy
        )

    @r.post("/jobs/{job_id}/cancel", status_code=202)
    def cancel(job_id: str, who: Caller) -> dict[str, Any]:
        job = service.cancel(job_id, who)
        return {"id": str(job.id), "state": job.state.value}

    @r.post("/jobs/{job_id}/approve")
    def approve(job_id: str, who: Caller) -> dict[str, Any]:
        job = service.approve(job_id, who)
        return {"id": str(job.id), "state": job.state.value}

    @r.post("/jobs/{job_id}/release")
    def release(job_id: str, who: Caller) -> dict[str, Any]:
        job = service.release(job_id, who)
        return {"id": str(job.id), "state": job.state.value}

    @r.post("/jobs/{job_id}/reports", status_code=202)
    def report(
        job_id: str, req: ReportRequest, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        return service.report(job_id, authorization, req)

    @r.get("/jobs/{job_id}/logs")
    def logs(
        job_id: str, who: Caller, attempt: int | None = None, rank: int = 0, offset: int = Query(default=0, ge=0)
    ) -> dict[str, Any]:
        return service.logs(job_id, attempt, rank, offset)

    @r.get("/nodes")
    def nodes(who: Caller) -> list[dict[str, Any]]:
        return node_views(service.nodes, service.store.running_attempts())

    @r.get("/queues")
    def queues(who: Caller) -> list[dict[str, Any]]:
        return queue_views(service.policy, service.store, service.reconciler.ledger, service.nodes, service.now())

    @r.get("/policy")
    def get_policy(who: Caller) -> dict[str, Any]:
        current = service.store.current_policy()
        if current is None:
            return {"version": 0, "source": "", "policy": service.policy.to_dict()}
        return {"version": current.version, "source": current.source, "policy": current.resolved}

    @r.put("/policy")
    def put_policy(req: PolicyRequest, who: Caller) -> dict[str, Any]:
        version = service.apply_policy(req.source, who)
        return {"version": version}

    @r.post("/tokens", status_code=201)
    def create_token(req: TokenRequest, who: Caller) -> dict[str, Any]:
        token = service.create_token(req, who)
        return {"user": req.user, "role": req.role, "queues": req.queues, "token": token}

    @r.get("/audit")
    def audit(who: Caller, limit: int = Query(default=100, ge=1, le=10000)) -> list[dict[str, Any]]:
        service.require_admin(who, "read the audit log")
        return [
            {"id": a.id, "at": a.at, "actor": a.actor, "action": a.action, "target": a.target, "details": a.details}
            for a in service.store.audit_log(limit=limit)
        ]

    return r


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


def metrics_route(app: FastAPI, service: "Service") -> None:
    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        body, content_type = service.metrics.render()
        return Response(content=body, media_type=content_type)
