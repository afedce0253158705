"""Durations as people write and read them: "90s", "45m", "8h", "7d", "1h30m".

One short form everywhere a duration is written for a person: a policy shown back, a refusal,
a reason, a table. `format_duration` writes it exactly (it parses back to the same seconds);
`span` writes a measured or approximate duration in the same form, rounded to its two largest
units. Here, not in `warden.engine.policy`, because the CLI writes and checks durations on every
start and must not load pydantic to do so; the refusal of a value (`PolicyError`) lives here for
the same reason, and the policy module re-exports both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["MISSING", "PolicyError", "PolicyIssue", "format_duration", "parse_duration", "relative", "span"]


class _Missing:
    """The value of an issue about something that is absent (nothing to quote back)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy: where (dotted path, `[i]` for list items), what, and why."""

    path: str
    value: Any
    message: str
    allowed: str | None = None

    def __str__(self) -> str:
        text = self.message if self.value is MISSING else f"{self.message} (got {self.value!r})"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        return f"{self.path}: {text}" if self.path else text


class PolicyError(ValueError):
    """A policy was refused; `issues` holds every problem found, `source` names the input."""

    def __init__(self, issues: list[PolicyIssue], source: str | None = None) -> None:
        self.issues = issues
        self.source = source
        super().__init__("\n".join(str(i) for i in issues))


def refuse(value: Any, message: str, allowed: str | None = None) -> PolicyError:
    """An error about the value being validated; the caller's location becomes its path."""
    return PolicyError([PolicyIssue("", value, message, allowed)])


UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
NUMBER_RE = re.compile(_NUMBER)
_DURATION_RE = re.compile(rf"(?:{_NUMBER}[dhms])+")
_PART_RE = re.compile(rf"({_NUMBER})([dhms])")
DURATION_PATTERN = rf"^\s*(?:{_NUMBER}|(?:{_NUMBER}[dhms])+)\s*$"
DURATION_ALLOWED = "a number of seconds or a string like 90s, 45m, 8h, 7d, 1h30m"


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string of `<n><unit>` parts (units d, h, m, s)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise refuse(value, "not a duration", DURATION_ALLOWED)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise refuse(value, "durations cannot be negative")
        if NUMBER_RE.fullmatch(text):
            seconds = float(text)
        elif _DURATION_RE.fullmatch(text):
            seconds = sum(float(n) * UNITS[unit] for n, unit in _PART_RE.findall(text))
        else:
            raise refuse(value, "not a duration", DURATION_ALLOWED)
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise refuse(value, "durations must be finite")
    if seconds < 0:
        raise refuse(value, "durations cannot be negative")
    return seconds


def is_bare_number(text: str) -> bool:
    """Whether a duration as written has no unit ("10"): a command line refuses it rather than
    guess whether seconds or minutes were meant."""
    return NUMBER_RE.fullmatch(text.strip()) is not None


def format_duration(seconds: float) -> str:
    """The shortest string that parses back to exactly `seconds`; ties go to larger units."""
    seconds = float(seconds)
    if not seconds.is_integer():
        return f"{Decimal(repr(seconds)):f}s"
    n = int(seconds)
    if n == 0:
        return "0s"
    candidates = [f"{n // size}{unit}" for unit, size in UNITS.items() if n % size == 0]
    candidates.append(_in_units(n))
    return min(candidates, key=len)


def _in_units(n: int) -> str:
    """Whole seconds as days, hours, minutes and seconds, each unit once: "1d3h", "7m5s"."""
    rest, parts = n, []
    for unit, size in UNITS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def span(seconds: float) -> str:
    """A measured or approximate duration in the short form, to its two largest units: "4.2s",
    "45s", "7m5s", "3h12m", "2d4h" (a tenth of a second below ten seconds)."""
    s = max(0.0, float(seconds))
    if s < 10:
        return format_duration(round(s, 1))
    step = 3600 if s >= 86400 else 60 if s >= 3600 else 1
    return _in_units(round(s / step) * step)


def relative(t: float, now: float) -> str:
    """`t` as seen from `now`, to the second: "in 9m", "3m10s ago", "now"."""
    dt = round(t - now)
    if dt == 0:
        return "now"
    return f"in {span(dt)}" if dt > 0 else f"{span(-dt)} ago"
