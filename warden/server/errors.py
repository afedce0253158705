"""The one shape of every refusal the API makes."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A 4xx naming the field and the value that caused it; nothing was changed."""

    def __init__(
        self, status: int, field: str, value: Any, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{field}: {message} (got {value!r})")
        self.status = status
        self.field = field
        self.value = value
        self.message = message
        self.headers = headers

    def body(self) -> dict[str, Any]:
        error = {"field": self.field, "value": self.value, "message": self.message}
        return {"error": error, "errors": [error]}
