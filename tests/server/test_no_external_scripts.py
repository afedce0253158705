"""Nothing the server serves loads a script, style or module from another origin: FastAPI's
`/docs` and `/redoc` (which load theirs from a CDN) are not served, `/openapi.json` is, and
every page and file of the origin references only its own. In process, on the real app."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from warden.server.app import Settings, build_service, create_app
from warden.server.ui import STATIC

TOKEN = "origin-admin-token"

#: Where a page, module or style names something to load: HTML `src`/`href`, JavaScript
#: `import ... from` and `import(...)`, CSS `url(...)` and `@import`.
REFERENCES = re.compile(
    r"""(?:\bsrc|\bhref)\s*=\s*["']?([^"'\s>]+)"""
    r"""|\bimport\b[^;"'`]*?\bfrom\s*["'`]([^"'`]+)"""
    r"""|\bimport\s*\(\s*["'`]([^"'`]+)"""
    r"""|\burl\(\s*["']?([^"')\s]+)"""
    r"""|@import\s+["']([^"']+)""",
    re.IGNORECASE,
)


def external(text: str) -> list[str]:
    """The references in `text` to another origin: with a scheme (other than data:) or `//`."""
    found = [next(g for g in m.groups() if g) for m in REFERENCES.finditer(text)]
    return [
        r
        for r in found
        if r.startswith("//") or (re.match(r"[a-z][a-z0-9+.-]*:", r, re.I) and not r.startswith("data:"))
    ]


def test_the_check_sees_external_references() -> None:
    """What FastAPI's /docs page holds, and the forms the dashboard uses, all seen."""
    page = '<script src="https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"></script>'
    assert external(page) == ["https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui-bundle.js"]
    assert external('<link rel="stylesheet" href="//cdn.example/x.css">') == ["//cdn.example/x.css"]
    assert external('import { a } from "https://esm.sh/x";') == ["https://esm.sh/x"]
    assert external("body { background: url(https://x.example/a.png) }") == ["https://x.example/a.png"]
    assert external('<script type="module" src="js/main.js"></script><img src="data:image/png;base64,AA">') == []
    assert external('import { a } from "./dom.js";') == []


@asynccontextmanager
async def no_lifespan(_: Any) -> AsyncIterator[None]:
    yield


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    policy = tmp_path / "policy.yaml"
    policy.write_text("queues:\n  name: cluster\n  children:\n    - {name: team}\n")
    service = build_service(
        Settings(policy=policy, fake_gpus=2, state_dir=tmp_path / "state", bootstrap_token=TOKEN), say=lambda _: None
    )
    app = create_app(service)
    app.router.lifespan_context = no_lifespan
    c = TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}, raise_server_exceptions=False)
    try:
        yield c
    finally:
        c.close()
        service.executor.close()
        service.store.close()


def test_docs_and_redoc_are_not_served_and_openapi_json_is(client: TestClient) -> None:
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        answer = client.get(path)
        assert answer.status_code == 404, f"{path}: {answer.status_code}"
    doc = client.get("/openapi.json")
    assert doc.status_code == 200 and doc.json()["paths"]["/v1/policy/diff"]


def test_no_answer_of_the_origin_references_another(client: TestClient) -> None:
    listed = client.get("/openapi.json").json()["paths"]
    paths = [p for p, ops in listed.items() if "get" in ops and "{" not in p]
    paths += ["/metrics", "/openapi.json", "/ui/", "/docs", "/redoc", "/no-such-page"]
    paths += ["/ui/" + p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.is_file()]
    assert "/v1/jobs" in paths and "/ui/js/main.js" in paths
    seen = 0
    for path in paths:
        answer = client.get(path)
        kind = answer.headers.get("content-type", "")
        assert not external(answer.text), f"{path} ({kind}) references {external(answer.text)}"
        assert "cdn" not in answer.text.lower(), path
        if kind.startswith("text/html"):
            assert "script-src 'self'" in answer.headers["content-security-policy"], path
            seen += 1
    assert seen >= 1  # the dashboard's page, with its CSP
