"""The dashboard in a page of the browser: navigation, waits on conditions (never fixed
sleeps), screenshots and the browser's console."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

WAIT_S = 30.0
"""The longest a test waits for the page to show something: the page refreshes every 5 s."""


class Page:
    """The dashboard of one server in the browser: navigation, waits, screenshots and the
    browser's console."""

    def __init__(self, driver: Any, url: str, artifacts: Path) -> None:
        self.driver = driver
        self.url = url
        self.artifacts = artifacts

    def open(self, route: str = "") -> None:
        self.driver.get(f"{self.url}/ui/{route}")

    def go(self, route: str) -> None:
        """A hash route (e.g. "#/jobs") without reloading the page."""
        self.driver.execute_script("location.hash = arguments[0]", route)
        self.until(
            lambda d: d.find_element("id", "view").get_attribute("data-route") == _route_name(route), f"route {route}"
        )

    def until(self, condition: Callable[[Any], Any], what: str, timeout: float = WAIT_S) -> Any:
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(
            self.driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        ).until(condition, f"timed out after {timeout}s waiting for {what}")

    def updates(self) -> int:
        """How often the view on show has drawn itself from the API."""
        return int(self.css("#view").get_attribute("data-updates") or 0)

    def refreshed(self, after: int) -> int:
        """Wait until the view has drawn itself more than `after` times."""
        return self.until(lambda d: (n := self.updates()) > after and n, f"refresh {after + 1}")

    def css(self, selector: str) -> Any:
        return self.driver.find_element("css selector", selector)

    def all(self, selector: str) -> list[Any]:
        return list(self.driver.find_elements("css selector", selector))

    def sign_in(self, token: str, route: str = "cluster") -> None:
        """Open `route` signed out, sign in with `token` on the form, and wait for the view."""
        self.open(f"#/{route}")

        def fill(d: Any) -> bool:  # the form may be drawn again while the route settles: retried
            field = d.find_element("id", "signin-token")
            if not field.is_displayed():
                return False
            field.clear()
            field.send_keys(token)
            d.find_element("id", "signin-submit").click()
            return True

        self.until(fill, "the sign-in form")
        self.until(lambda d: d.find_element("id", "view").get_attribute("data-route") == route, f"the {route} view")
        self.refreshed(0)

    def sign_out(self) -> None:
        self.css("#who button").click()
        self.until(lambda d: d.find_element("id", "signin-token").is_displayed(), "the sign-in form")

    def shot(self, name: str) -> Path:
        path = self.artifacts / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def console(self) -> list[dict[str, Any]]:
        """What the page logged since the last call (the driver forgets what it hands over)."""
        return list(self.driver.get_log("browser"))

    def console_errors(self, *allowed: str) -> list[str]:
        """The page's errors since the last call, but for those matching an `allowed` pattern
        (an answer the page asks for on purpose, such as the 403 that tells it a user is no admin)."""
        return [
            e["message"]
            for e in self.console()
            if e["level"] == "SEVERE" and not any(re.search(p, e["message"]) for p in allowed)
        ]


def _route_name(route: str) -> str:
    parts = route.lstrip("#/").split("/")
    return "job" if parts[0] == "jobs" and len(parts) > 1 else parts[0]
