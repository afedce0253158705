"""A dry run (`POST /v1/jobs?dry_run=true`, `warden submit --dry-run`) answers what the next pass
decides for the job, and changes nothing.

The store (SQLite), the reconciler, the service and the local executor with its job processes
are real; the clock stands still, so "an unchanged cluster" is exact: the dry run, then the
real submission and one pass, all at the same moment.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from serverproc import end_everything

from warden.engine.model import JobState, Node
from warden.engine.policy import parse_policy
from warden.executors.local import LocalExecutor
from warden.server.app import create_app
from warden.server.auth import Principal
from warden.server.errors import ApiError
from warden.server.requests import SubmitRequest
from warden.server.service import Service
from warden.store.repo import Store

ROOT = Principal("root", "admin", ("*",))
ANA = Principal("ana", "user", ("*",))
POLICY = """\
min_grace: 1s
thrash: {{min_efficiency: {efficiency}, max_preemptions: {{per: 1h, count: 5}}}}
preemption: {{restart_overhead: 10s}}
scheduling: {{reservations: 2}}
tiers:
  1: {{name: prod, preemptible: false, grace: 1s, requires_approval: true, scope: cluster}}
  2: {{name: pretraining, lease: 0s, grace: 1s, requires_approval: true}}
  3: {{name: experimentation, lease: {lease}, grace: 2s}}
  4: {{name: opportunistic, lease: 0s, grace: 1s, charged: false}}
queues:
  name: cluster
  children:
    - {{name: a, nominal: {{gpu: {nominal}}}, borrowing_limit: {{gpu: 8}}}}
    - {{name: b, nominal: {{gpu: {nominal}}}}}
"""
LONG = ["sleep", "120"]


@contextmanager
def service(nodes: tuple[Node, ...], policy: str, clock: list[float]) -> Iterator[Service]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        store = Store.open(f"sqlite:///{tmp}/warden.db")
        svc = Service(store, LocalExecutor(), nodes, parse_policy(policy), state, clock=lambda: clock[0])
        try:
            yield svc
        finally:
            end_everything(svc)
            svc.stop()
            store.close()


def request(**fields: Any) -> SubmitRequest:
    return SubmitRequest(**{"command": LONG, "workdir": "/", **fields})


def submit_if_valid(svc: Service, req: SubmitRequest) -> None:
    try:
        svc.submissions.submit(req, ROOT)
    except ApiError as err:
        assert err.status == 422, err  # larger than the cluster: refused, as it should be


def settle(svc: Service) -> None:
    """Passes until nothing more is admitted, every admitted job runs, and every job sent SIGTERM
    (a preemption's, or its time limit's once the clock moved past it) is gone: otherwise the
    next pass would first collect its exit, and plan another cluster than the dry run saw."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        plan = svc.reconciler.reconcile()
        active = svc.store.active()
        starting = any(a.job.state in (JobState.ADMITTED, JobState.STARTING) for a in active)
        leaving = any(a.attempt is not None and a.attempt.sigterm_at is not None for a in active)
        if plan is not None and not plan.admissions and not starting and not leaving:
            return
        time.sleep(0.02)
    raise AssertionError("the cluster did not settle in 20 s")


def fingerprint(svc: Service) -> tuple[Any, ...]:
    """Everything a dry run must leave as it was: every job row and its events, the processes."""
    jobs = svc.store.list()
    return (
        tuple((j.id, j.version, j.state, j.explanation) for j in jobs),
        tuple(len(svc.store.events(j.id)) for j in jobs),
        tuple(sorted(svc.executor.running())),
    )


jobs_st = st.lists(
    st.fixed_dictionaries(
        {
            "queue": st.sampled_from(["a", "b"]),
            "tier": st.sampled_from([3, 3, 4]),
            "gpus": st.sampled_from([1, 2, 4]),
            "replicas": st.sampled_from([1, 1, 2]),
            "time_limit": st.sampled_from([None, 300.0, 3600.0]),
        }
    ),
    max_size=6,
)
new_st = st.fixed_dictionaries(
    {
        "queue": st.sampled_from(["a", "b"]),
        "tier": st.sampled_from([1, 2, 3, 4]),
        "gpus": st.sampled_from([1, 2, 4]),
        "replicas": st.sampled_from([1, 2]),
        "placement": st.sampled_from(["any", "pack"]),
        "time_limit": st.sampled_from([None, 60.0, 1800.0]),
    }
)


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example runs real processes: no shrinking
)
@given(
    node_count=st.integers(1, 2),
    gpus_per_node=st.sampled_from([4, 8]),
    lease=st.sampled_from(["0s", "10m"]),
    efficiency=st.sampled_from([0, 0.5]),
    nominal=st.sampled_from([2, 4, 8]),
    first=jobs_st,
    later=jobs_st,
    elapsed=st.sampled_from([0.0, 30.0, 3600.0]),
    new=new_st,
    admin=st.booleans(),
)
def test_a_dry_run_then_the_real_submission_get_the_same_decision(
    node_count: int,
    gpus_per_node: int,
    lease: str,
    efficiency: float,
    nominal: int,
    first: list[dict[str, Any]],
    later: list[dict[str, Any]],
    elapsed: float,
    new: dict[str, Any],
    admin: bool,
) -> None:
    nodes = tuple(Node(f"n{i}", gpus_per_node, block="b0") for i in range(node_count))
    clock = [1_000_000.0]
    with service(nodes, POLICY.format(lease=lease, efficiency=efficiency, nominal=nominal), clock) as svc:
        for fields in first:  # these run (those that fit) ...
            submit_if_valid(svc, request(**fields))
        settle(svc)
        clock[0] += elapsed  # ... for a while; then more arrive
        for fields in later:
            submit_if_valid(svc, request(**fields))
        settle(svc)
        who = ROOT if admin else ANA
        req = request(**new)

        before = fingerprint(svc)
        try:
            verdict, state, _ = svc.submissions.dry_run(req, who)
        except ApiError as refused:  # refused as the submission is refused
            with pytest.raises(ApiError) as real:
                svc.submissions.submit(req, who)
            assert str(real.value) == str(refused)
            assert fingerprint(svc) == before
            return
        assert fingerprint(svc) == before, "a dry run changed something"

        job_id = svc.submissions.submit(req, who).id
        assert str(job_id) == verdict.job_id and svc.store.get(job_id).state is state  # type: ignore[union-attr]
        plan = svc.reconciler.reconcile()
        assert plan is not None
        admitted = {a.job_id: a for a in plan.admissions}
        preempted = sorted(p.job_id for p in plan.preemptions if p.for_job == verdict.job_id)
        if verdict.decision == "start":
            assert verdict.job_id in admitted
            assert admitted[verdict.job_id].placement == verdict.placement
        else:
            assert verdict.job_id not in admitted
            assert preempted == sorted(v.job_id for v in verdict.victims if v.signal_at == clock[0])
            assert (verdict.decision == "preempt") == bool(preempted)
            assert plan.explanations[verdict.job_id] == verdict.explanation


# -- through the API and the CLI --------------------------------------------------------------------


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Service, TestClient, list[float]]]:
    clock = [1_000_000.0]
    policy = POLICY.format(lease="10m", efficiency=0, nominal=4)
    with service((Node("n0", 4), Node("n1", 4)), policy, clock) as svc:
        token = svc.store.create_token("ana", "user", ["*"], created_by="test", now=clock[0])
        client = TestClient(create_app(svc), headers={"Authorization": f"Bearer {token}"})
        try:
            yield svc, client, clock
        finally:
            client.close()


def test_the_api_answers_each_decision_and_stores_nothing(api: tuple[Service, TestClient, list[float]]) -> None:
    svc, client, clock = api
    for _ in range(2):
        svc.submissions.submit(request(queue="a", tier=3, gpus=4, time_limit=3600.0), ROOT)
    settle(svc)
    clock[0] += 3600.0  # past their leases
    before = fingerprint(svc)
    body = {"command": LONG, "workdir": "/", "gpus": 4}

    wait = client.post("/v1/jobs?dry_run=true", json={**body, "queue": "b", "tier": 3})
    assert wait.status_code == 200, wait.text
    out = wait.json()
    assert out["dry_run"] is True and out["decision"] == "wait" and out["state"] == "PENDING"
    assert out["reason"]["code"] and out["position"] == 1
    # Both running jobs end at their time limit: it starts then, as an estimate.
    assert out["expected_start"]["at"] == pytest.approx(1_000_000.0 + 3600.0)
    assert out["expected_start"]["estimate"] is True and "time limits" in out["expected_start"]["assumes"]

    preempt = client.post("/v1/jobs?dry_run=true", json={**body, "queue": "b", "tier": 4})
    assert preempt.json()["decision"] == "wait"  # tier 4 preempts nobody

    approval = client.post("/v1/jobs?dry_run=true", json={**body, "queue": "b", "tier": 2})
    a = approval.json()
    assert a["state"] == "AWAITING_APPROVAL" and a["decision"] == "wait"
    assert a["reason"]["code"] == "AwaitingApproval" and a["expected_start"]["at"] is None

    bad = client.post("/v1/jobs?dry_run=true", json={**body, "queue": "nope", "tier": 3})
    assert bad.status_code == 422 and "nope" in bad.text and "queue" in bad.text
    assert fingerprint(svc) == before


def test_a_dry_run_names_its_victims_and_what_they_lose(api: tuple[Service, TestClient, list[float]]) -> None:
    svc, client, clock = api
    for _ in range(2):
        svc.submissions.submit(request(queue="a", tier=4, gpus=4), ROOT)
    settle(svc)
    clock[0] += 60.0
    out = client.post(
        "/v1/jobs?dry_run=true", json={"command": LONG, "workdir": "/", "gpus": 4, "queue": "b", "tier": 3}
    ).json()
    assert out["decision"] == "preempt"
    (victim,) = out["victims"]
    assert victim["tier"] == 4 and victim["queue"] == "a" and victim["gpus"] == 4
    assert victim["signal_at"] == clock[0] and victim["gone_by"] == clock[0] + 1.0  # tier 4's grace
    assert victim["lost_work_gpu_hours"] > 0
    assert out["expected_start"]["at"] == clock[0] + 1.0
