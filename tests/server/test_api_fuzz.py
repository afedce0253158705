"""Schemathesis over the whole API, in process: valid and invalid requests generated from the
OpenAPI document. No answer is a 5xx, every 4xx has the documented error shape and a status
the document lists. The reconcile loop is not started, so no generated command ever runs.

The figures in BENCHMARKS.md ("API fuzzing") come from:
    WARDEN_FUZZ_EXAMPLES=25 python -m pytest -q -s tests/server/test_api_fuzz.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error, status_code_conformance

from warden.server.app import Settings, build_service, create_app
from warden.server.service import Service

TOKEN = "fuzz-admin-token"
POLICY = "queues:\n  name: cluster\n  children:\n    - {name: team}\n"
EXAMPLES = int(os.environ.get("WARDEN_FUZZ_EXAMPLES", "15"))
"""Examples per operation and generation mode: well under a minute on two shared cores at 30."""


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    svc = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    svc.store.submit(name="seed", user="admin", queue="team", tier=3, command=["true"], actor="admin", now=1.0)
    try:
        yield svc
    finally:
        svc.executor.close()
        svc.store.close()


def check_error_shape(response: Any) -> None:
    body = json.loads(response.text, parse_constant=lambda name: pytest.fail(f"{name} in an error body"))
    assert isinstance(body, dict) and set(body) == {"error", "errors"}, body
    assert body["errors"] and body["errors"][0] == body["error"]
    for error in body["errors"]:
        assert set(error) == {"field", "value", "message"}, error
        assert isinstance(error["field"], str) and isinstance(error["message"], str) and error["message"]


def test_no_input_gets_a_5xx_and_every_4xx_has_the_error_shape(service: Service) -> None:
    app = create_app(service)
    app.router.lifespan_context = no_lifespan  # no reconcile loop: nothing sent here runs
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    statuses: Counter[int] = Counter()
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def call(case: Any) -> None:
                headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
                case.headers = {**headers, "Authorization": f"Bearer {TOKEN}"}
                response = case.call()
                statuses[response.status_code] += 1
                case.validate_response(response, checks=[not_a_server_error, status_code_conformance])
                if 400 <= response.status_code < 500:
                    check_error_shape(response)

            try:
                call()
            except Unsatisfiable:  # no invalid request exists for an operation without parameters
                assert mode is GenerationMode.NEGATIVE
    took = time.monotonic() - started
    assert service.reconciler.stats.passes == 0, "the fuzzed server must not run what it is sent"
    requests, errors = sum(statuses.values()), sum(n for s, n in statuses.items() if s >= 500)
    print(
        f"\nAPI fuzzing: {requests} requests in {took:.1f} s, {errors} 5xx; by status: {dict(sorted(statuses.items()))}"
    )
    assert errors == 0 and requests > 0
