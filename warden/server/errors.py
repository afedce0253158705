"""The one shape of every refusal the API makes.

`{"error": {"field", "value", "message"}, "errors": [...]}`: the first problem, then all of
them. A value is echoed back only in a form JSON can always carry (`safe_value`), so no input,
however hostile, turns a refusal into a 500.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

VALUE_CHARS = 200
"""Longest text an error echoes back; a longer value is cut and marked with `…`."""
_VALUE_ITEMS = 20
_VALUE_DEPTH = 3


class ApiError(Exception):
    """A 4xx naming the field and the value that caused it; nothing was changed."""

    def __init__(
        self, status: int, field: str, value: Any, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{field}: {message} (got {shorten(repr(value))})")
        self.status = status
        self.field = field
        self.value = value
        self.message = message
        self.headers = headers

    def detail(self) -> dict[str, Any]:
        return {"field": self.field, "value": safe_value(self.value), "message": self.message}

    def body(self) -> dict[str, Any]:
        return error_body([self.detail()])


def error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    return {"error": errors[0], "errors": errors}


def shorten(text: str, limit: int = VALUE_CHARS) -> str:
    """`text` cut to `limit` characters, lone surrogates escaped (they cannot be UTF-8)."""
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def safe_value(value: Any, depth: int = 0) -> Any:
    """`value` as JSON can carry it: finite numbers, short valid text, small containers;
    anything else as a short string."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else shorten(str(value), 40)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return shorten(value)
    if isinstance(value, bytes):
        return shorten(value.decode("utf-8", "backslashreplace"))
    if depth < _VALUE_DEPTH and isinstance(value, list | tuple) and len(value) <= _VALUE_ITEMS:
        return [safe_value(v, depth + 1) for v in value]
    if depth < _VALUE_DEPTH and isinstance(value, dict) and len(value) <= _VALUE_ITEMS:
        return {shorten(str(k), 60): safe_value(v, depth + 1) for k, v in value.items()}
    return shorten(_bounded_repr(value))


def _bounded_repr(value: Any) -> str:
    """A repr that never walks a huge or deeply nested value."""
    if isinstance(value, list | tuple | dict | set):
        kind = type(value).__name__
        return f"<{kind} of {len(value)} items>"
    try:
        return repr(value)
    except Exception:  # a repr that fails must not fail the refusal
        return f"<{type(value).__name__}>"


class ErrorDetail(BaseModel):
    """One problem with a request."""

    field: str = Field(description="the field, parameter or header at fault (`body` for the whole body)")
    value: Any = Field(description="what was sent, shortened when long; null when there is nothing to quote")
    message: str = Field(description="why it was refused, with the limit or the allowed values")


class ErrorBody(BaseModel):
    """Every 4xx answer: the first problem, and all of them."""

    error: ErrorDetail
    errors: list[ErrorDetail]
