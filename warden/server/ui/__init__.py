"""The dashboard: static files (HTML, CSS, plain JavaScript modules) served by the server
itself under `/ui/`, no build step. The page reads only the public `/v1` API with the token
its user signs in with (kept in the tab's sessionStorage); see docs/dashboard.md."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

STATIC = Path(__file__).resolve().parent / "static"

#: Scripts and styles from this origin only (no inline script, nothing from elsewhere), the API
#: of this origin only, no framing; the page sends no Referer (a job id in a hash route stays
#: in the tab).
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # The files change with an upgrade of warden: revalidate (an ETag makes that cheap).
    "Cache-Control": "no-cache",
}


class DashboardFiles(StaticFiles):
    """`StaticFiles` with the dashboard's security and caching headers on every answer."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in HEADERS.items():
                    if name.lower().encode() not in present:
                        headers.append((name.lower().encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await super().__call__(scope, receive, with_headers)


def mount_ui(app: FastAPI) -> None:
    """Serve the dashboard at `/ui/` (`/ui` redirects there)."""
    app.mount("/ui", DashboardFiles(directory=STATIC, html=True), name="ui")
