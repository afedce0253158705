"""The dashboard's files as the server ships and serves them, without a browser: mounted at
/ui/ with its security headers, every module it imports present and shipped as package data,
valid JavaScript, and no markup built from strings."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from warden.server.ui import STATIC, mount_ui

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(STATIC.rglob("*.js"))


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = FastAPI()
    mount_ui(app)
    return TestClient(app)


def test_the_dashboard_is_served_at_ui_with_its_headers(client: TestClient) -> None:
    r = client.get("/ui/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="js/main.js"></script>' in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    js = client.get("/ui/js/main.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert client.get("/ui", follow_redirects=False).headers["location"].endswith("/ui/")
    assert client.get("/ui/no-such-file.js").status_code == 404


def test_every_module_imported_exists() -> None:
    seen: set[Path] = set()
    todo = [STATIC / "js" / "main.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        assert path.is_file(), f"{path} is imported but missing"
        seen.add(path)
        for spec in re.findall(r'^import .*? from "(\.{1,2}/[^"]+)";', path.read_text(), re.MULTILINE):
            todo.append((path.parent / spec).resolve())
    assert seen == {p.resolve() for p in SCRIPTS}, "a script is never imported"


def test_no_string_becomes_markup() -> None:
    """Every string from the API reaches the page as text (dom.js builds elements)."""
    for path in SCRIPTS:
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in text, f"{path.name} uses {sink}"


def test_the_files_are_package_data() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["warden"]
    package = REPO / "warden"
    for path in STATIC.rglob("*"):
        if path.is_file():
            relative = path.relative_to(package).as_posix()
            assert any(fnmatch(relative, p) and relative.count("/") == p.count("/") for p in patterns), relative


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: the syntax check needs it")
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(STATIC).as_posix())
def test_the_scripts_parse(path: Path, tmp_path: Path) -> None:
    module = tmp_path / (path.stem + ".mjs")
    module.write_text(path.read_text())
    r = subprocess.run(["node", "--check", str(module)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
