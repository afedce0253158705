"""The dashboard in a real browser: headless Chromium from Debian's packages (`chromium`,
`chromium-driver`) driven by selenium, pointed at /usr/bin/chromium and /usr/bin/chromedriver
explicitly, so nothing downloads a browser or a driver. Without them the browser tests skip,
unless WARDEN_REQUIRE_BROWSER=1 (then they fail)."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from uipage import WAIT_S

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))  # serverproc

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def _missing() -> list[str]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    return missing


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $WARDEN_UI_ARTIFACTS, else a temporary directory."""
    given = os.environ.get("WARDEN_UI_ARTIFACTS")
    path = Path(given) if given else tmp_path_factory.mktemp("ui-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tls_args(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """`--tls-cert/--tls-key` of one certificate for every dashboard test's server, which the
    browser trusts (`driver`): as an admin's certificate that a browser's store trusts."""
    from warden.server.tls import own_certificate, serving_names

    tls = own_certificate(tmp_path_factory.mktemp("ui-tls"), serving_names("127.0.0.1", None))
    return ("--tls-cert", str(tls.cert_file), "--tls-key", str(tls.key_file))


def _spki_sha256(chain: Path) -> str:
    """The base64 SHA-256 of the serving certificate's public key, as Chromium's
    `--ignore-certificate-errors-spki-list` takes it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(chain.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


@pytest.fixture(scope="module")
def driver(tls_args: tuple[str, ...]) -> Iterator[Any]:
    """One headless Chromium for a module's tests, trusting the servers' certificate
    (`tls_args`); quit (browser and driver ended) after them."""
    missing = _missing()
    if missing:
        message = (
            f"the dashboard's browser tests need {', '.join(missing)} "
            "(apt-get install chromium chromium-driver; pip install -e '.[test]'; scripts/test does both)"
        )
        if os.environ.get("WARDEN_REQUIRE_BROWSER") == "1":
            pytest.fail(message + " and WARDEN_REQUIRE_BROWSER=1")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="warden-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1366,900",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--lang=en-US",
        f"--user-data-dir={profile}",
        f"--ignore-certificate-errors-spki-list={_spki_sha256(Path(tls_args[1]))}",
        *(("--no-sandbox",) if os.geteuid() == 0 else ()),  # Chromium's sandbox refuses root
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(CHROMEDRIVER), log_output=os.devnull)
    browser = webdriver.Chrome(service=service, options=options)
    browser.set_page_load_timeout(WAIT_S)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)
