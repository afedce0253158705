"""The bodies the API takes (`POST /v1/jobs`, reports, tokens, policies), validated by pydantic.

A module of their own: the HTTP routes (`warden.server.api`) parse them and the service's
collaborators (`warden.server.submissions`, `reports`, `governance`) act on them. The routes
import the service; its collaborators take the bodies from here, not from the routes, so the two
do not import each other.
"""

# No `from __future__ import annotations`: pydantic and FastAPI read these types at run time.

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from warden.engine.policy import Duration
from warden.server.auth import TOKEN_LIFETIME_MAX_S
from warden.server.errors import ApiError, shorten

INT32_MAX = 2**31 - 1
"""The largest count the database holds in an Integer column on every backend."""
INT64_MAX = 2**63 - 1
NAME_CHARS = 255
"""Names, queues, flavors and users are String(255) columns."""
SECONDS_MAX = 1e9
"""About 30 years: the longest duration a report may state."""
ID_RE = re.compile(r"[0-9]{1,19}")
"""A stored row's id as a path gives it: ASCII digits (str.isdigit also takes '¹' and '٣')."""


def stored_id(what: str, value: str) -> int:
    """The id of the job or token a path names. Every id the store gives is from 1 to 2^63 - 1
    (a BIGINT key on every backend); any other text names nothing stored, so it is a 404
    naming the value, never a database error on a number the column cannot hold."""
    if not ID_RE.fullmatch(value) or not 1 <= int(value) <= INT64_MAX:
        raise ApiError(404, "id", value, f"no such {what}: a {what} id is ASCII digits, from 1 to 2^63 - 1")
    return int(value)


def clean_text(text: str) -> str:
    """Text the database, the JSON encoder and `exec` all accept: no NUL, no lone surrogate."""
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate, which is not Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(clean_text)]
Name = Annotated[Text, Field(max_length=NAME_CHARS)]
Count = Annotated[int, Field(strict=True, ge=0, le=INT32_MAX)]
Positive = Annotated[int, Field(strict=True, ge=1, le=INT32_MAX)]
"""A count of at least one. Its own type: a `Field(ge=1)` on a `Count` field loses to the
`ge=0` inside `Count` (pydantic applies an Annotated type's constraints after the field's)."""
BigCount = Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]
"""A counter a long run can take past 2³¹ (training steps, samples): a BigInteger column."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubmitRequest(_Request):
    """A job: a command run as `replicas` × (`gpus`, `cpu`, `memory`), admitted and evicted whole.
    The policy's `limits` bound its sizes; the cluster's largest node bounds each replica."""

    queue: Name = Field(min_length=1)
    tier: int = Field(strict=True, ge=1, le=4)
    command: list[Text] = Field(min_length=1)
    name: Name = ""
    gpus: Count = Field(default=1, description="GPUs per replica")
    replicas: Positive = Field(default=1, description="replicas of the gang, admitted and evicted whole")
    cpu: Count = Field(default=0, description="millicores per replica")
    memory: Count = Field(default=0, description="MiB per replica")
    flavor: Name | None = None
    placement: Literal["pack", "block", "any"] = "any"
    lease: Duration | None = Field(default=None, description="minimum runtime, e.g. 30m")
    grace: Duration | None = Field(
        default=None, description="grace period after SIGTERM, e.g. 300s; between the policy's min_grace and max_grace"
    )
    time_limit: Duration | None = Field(
        default=None,
        description="the longest each attempt may run, from its start: then SIGTERM, its grace, SIGKILL, and "
        "the job ends TIMEOUT; reservations and expected starts take it as the job's runtime; more than 0, at "
        "most its tier's max_time_limit (leave it out for its tier's default)",
    )
    workdir: Text | None = None
    env: dict[Text, Text] = Field(default_factory=dict)
    saves_on_sigterm: bool = Field(
        default=False,
        strict=True,
        description="the job saves its state on SIGTERM (as `warden check-workload` checks): an exit 0 within "
        "its grace after one counts as a save, and its preemption loses nothing",
    )

    @field_validator("command")
    @classmethod
    def _non_empty_program(cls, v: list[str]) -> list[str]:
        if not v[0]:
            raise ValueError("the program (first word) is empty")
        return v

    @field_validator("env")
    @classmethod
    def _variable_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or "=" in key:
                raise ValueError(f"{shorten(key, 60)!r} is not a variable name (non-empty, without '=')")
        return v


class ReportRequest(_Request):
    """What the workload SDK tells the server about the attempt it runs in."""

    attempt: int = Field(strict=True, ge=1, le=INT32_MAX)
    kind: Literal["startup", "progress", "checkpoint_started", "checkpoint_finished"]
    at: float | None = Field(default=None, ge=0, le=1e11)
    startup_s: float | None = Field(default=None, ge=0, le=SECONDS_MAX)
    step: BigCount | None = None
    samples: BigCount | None = None
    duration_s: float | None = Field(default=None, ge=0, le=SECONDS_MAX)
    size_bytes: int | None = Field(default=None, strict=True, ge=0, le=INT64_MAX)
    on_sigterm: bool | None = None


class TokenRequest(_Request):
    user: str = Field(min_length=1, max_length=NAME_CHARS, pattern=r"^[A-Za-z0-9_.@-]+$")
    role: Literal["user", "admin"] = "user"
    queues: list[Name] = Field(default_factory=lambda: ["*"], max_length=10_000)
    expires_in_s: float | None = Field(
        default=None,
        ge=1,
        le=TOKEN_LIFETIME_MAX_S,
        allow_inf_nan=False,
        description="seconds until the token expires, 1 to 10 years; default: the server's --token-lifetime",
    )


class PolicyRequest(_Request):
    source: Text = Field(description="the policy YAML, as written; not empty")
