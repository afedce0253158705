"""A pending job's explanation as the API shows it: the stored reason rendered when it is read.

The server stores each job's reason (`Reason.to_dict()`) when it changes; its sentence names
times, and "in 9m" is true only at the moment it is read. So the API rebuilds the reason
from its stored code and details (`reasons.from_dict`) and renders the sentence with the
request's `now`, times in the server's local time zone (`wall_times`). The details are returned
as stored (machine-readable; times stay epoch seconds there). A code the engine does not give
(a held job's `Held`) keeps its stored sentence.

An event's sentence is rendered the same way (`event_message`): a SIGKILL deadline is kept as a
number in the event's details (`kill_at`) and written in the sentence when it is read, in local
time and relative to the reader's now; no sentence a person reads holds epoch seconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from warden.engine.durations import relative
from warden.engine.reasons import TimeText, from_dict


@lru_cache(maxsize=4)
def wall_times(now: float, seconds: bool = False) -> TimeText:
    """Epoch seconds as a person reads them at `now`: "14:05 (in 9m)" today, "Dec 4 14:05
    (in 1d2h)" on another day, with the year when it is another year (local time); with
    `seconds`, "14:05:07 (3s ago)" (an event log, whose entries come seconds apart). Kept for
    the last few `now`s: a listing renders every job's reason at one."""
    today = datetime.fromtimestamp(now)
    hm = "%H:%M:%S" if seconds else "%H:%M"

    def text(t: float) -> str:
        if not math.isfinite(t):
            return "an unknown time"
        try:
            at = datetime.fromtimestamp(t)
        except (OverflowError, OSError, ValueError):
            return "an unknown time"
        if at.date() == today.date():
            clock = at.strftime(hm)
        elif at.year == today.year:
            clock = f"{at.strftime('%b')} {at.day} {at.strftime(hm)}"
        else:
            clock = f"{at.strftime('%b')} {at.day} {at.year} {at.strftime(hm)}"
        return f"{clock} ({relative(t, now)})"

    return text


def rendered(reason: Mapping[str, Any] | None, now: float, job_id: str | None = None) -> dict[str, Any] | None:
    """The stored reason with its `message` rendered at `now` (`code` and `details` as stored)."""
    if reason is None:
        return None
    rebuilt = from_dict(reason)
    if rebuilt is None:
        return dict(reason)
    return {**reason, "message": rebuilt.render(wall_times(now), job_id)}


KILL_AT = "kill_at"
"""The detail of an event that holds its SIGKILL deadline (epoch seconds)."""


def event_message(reason: str | None, details: Mapping[str, Any] | None, now: float) -> str | None:
    """An event's sentence as a person reads it at `now`: its SIGKILL deadline (the `kill_at`
    detail) ends it as ", SIGKILL at 14:05 (in 2m)", in local time (migration 0019 moved the
    deadlines of events stored with it in their text into that detail). No text, no sentence."""
    if reason is None:
        return None
    kill_at = (details or {}).get(KILL_AT)
    if isinstance(kill_at, int | float) and not isinstance(kill_at, bool):
        return f"{reason}, SIGKILL at {wall_times(now)(float(kill_at))}"
    return reason
