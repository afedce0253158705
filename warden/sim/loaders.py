"""Trace loaders: warden's native CSV/Parquet schema and the public traces in shared/traces.

Every loader turns a file into the same thing, a `Trace` whose jobs are sorted by (submit, file
order), numbered by `seq` and rebased so that the first job submits at 0.0, with whatever the
file does not record filled in by the seeded rules of `warden.sim.enrich`. Formats and their
mappings are documented in docs/traces.md.

A bad row stops loading with a `TraceError` naming the file, the line, the column and the value
(a simulation over a silently mangled trace is worse than none); `skip_invalid=True` skips and
counts such rows instead. A few rows of the public traces are left out always, by documented
rules (zero-length jobs, CPU-only pods), and counted the same way.

The hot path is plain `csv` and built-in conversions (a conversion only raises, and so only
costs, on a bad value), and each job is built once: a 111k-row trace loads in about a second.
"""

from __future__ import annotations

import csv
import difflib
import gc
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any

from warden.sim.enrich import FIELD_INDEX, FIELDS, FORMAT_GIVES, fill_fields
from warden.sim.records import Trace, TraceJob
from warden.traces import DURATION_BASES, NATIVE_OPTIONAL, NATIVE_REQUIRED, native_cell

FORMATS = ("native", "philly", "philly-rfold", "pai2023")
"""The formats `load_trace` reads; `auto` picks one of them from the header or suffix."""

PHILLY_HEADER = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
PHILLY_REQUIRED = ("timestamp", "duration", "num_gpus", "cluster")
RFOLD_HEADER = ("#job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)")
RFOLD_REQUIRED = ("#job id", "arrival time (sec)", "size", "duration (sec)")
PAI_HEADER_PREFIX = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
PAI_REQUIRED = ("name", "num_gpu", "creation_time", "deletion_time")

VC_FILE_NAME = "philly_vc_nodes.csv"
GPUS_PER_PHILLY_NODE = 8
PAI_QOS_TIERS = {"ls": 1, "guaranteed": 2, "burstable": 3, "be": 4}
"""PAI's Kubernetes QoS classes, most to least protected, onto warden's tiers 1..4."""
PAI_WHOLE_GPU_MILLI = 1000
PARQUET_HINT = "reading Parquet needs pyarrow: pip install 'gpu-warden[parquet]'"

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})
_EPOCH = datetime(1970, 1, 1)
_TIERS = range(1, 5)


class TraceError(ValueError):
    """A trace that cannot be loaded as asked: the message names file, line, column and value."""

    def __init__(
        self,
        message: str,
        *,
        source: str = "",
        line: int | None = None,
        column: str | None = None,
        value: str | None = None,
    ) -> None:
        super().__init__(message)
        self.source = source
        self.line = line
        """1-based, the header being line 1 (Parquet: the 1-based row)."""
        self.column = column
        self.value = value


class _BadValue(Exception):
    """One cell (or one row's combination of cells) that breaks the schema.

    `column` is also the key the row is counted under in `Trace.skipped_reasons`.
    """

    def __init__(self, column: str, value: str, problem: str) -> None:
        super().__init__(column, value, problem)
        self.column = column
        self.value = value
        self.problem = problem

    def describe(self) -> str:
        if self.value == "":
            return f"{self.column}: {self.problem}"
        return f"{self.column}: {self.value!r} {self.problem}"


_MISSING = "missing value"


# --- cell conversions: fast when the value is good, and only then ------------------------------


def _whole(text: str, column: str, minimum: int = 0) -> int:
    """A whole number >= minimum; "8.0" is accepted (pandas writes ints that way next to NaN)."""
    try:
        value = int(text)
    except ValueError:
        value = _whole_slow(text, column)
    if value < minimum:
        raise _BadValue(column, text, f"is below {minimum}")
    return value


def _whole_slow(text: str, column: str) -> int:
    if not text:
        raise _BadValue(column, text, _MISSING)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not number.is_integer():
        raise _BadValue(column, text, "is not a whole number")
    return int(number)


def _number(text: str, column: str, minimum: float | None = 0.0, positive: bool = False) -> float:
    """A finite number of seconds (or a time stamp when minimum is None)."""
    try:
        value = float(text)
    except ValueError:
        raise _BadValue(column, text, _MISSING if not text else "is not a number") from None
    if not math.isfinite(value):
        raise _BadValue(column, text, "is not a finite number")
    if positive and value <= 0:
        raise _BadValue(column, text, "must be positive")
    if minimum is not None and value < minimum:
        raise _BadValue(column, text, "is negative")
    return value


def _flag(text: str, column: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise _BadValue(column, text, "is not one of true/false/1/0/yes/no")


def _duration_basis(text: str, column: str) -> str:
    if text not in DURATION_BASES:
        raise _BadValue(column, text, f"is not one of {', '.join(DURATION_BASES)}")
    return text


def _tier(text: str, column: str) -> int:
    value = _whole(text, column, minimum=-(2**31))
    if value not in _TIERS:
        raise _BadValue(column, text, "is not a tier (1..4)")
    return value


def _required_text(text: str, column: str) -> str:
    if not text:
        raise _BadValue(column, text, _MISSING)
    return text


def _wall_clock(text: str, column: str) -> float:
    """Seconds since the epoch of `YYYY-MM-DD HH:MM:SS`, read as UTC when it names no zone."""
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise _BadValue(column, text, _MISSING if not text else "is not a date-time (YYYY-MM-DD HH:MM:SS)") from None
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(UTC).replace(tzinfo=None)
    return (stamp - _EPOCH).total_seconds()


# --- rows in, rows out -------------------------------------------------------------------------


@dataclass
class _Rows:
    """What one format's parser made of a file: job fields per row, and what it left out."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    """TraceJob keyword arguments per kept row (submit not yet rebased, seq not yet set)."""
    skipped: Counter[str] = field(default_factory=Counter)
    given: frozenset[str] = frozenset()
    """TraceJob fields the file records for every job (enrichment leaves them alone)."""
    rules: list[str] = field(default_factory=list)
    """Loader rules, stated once the rows are read (counts included)."""
    queues: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Context:
    """Where the rows come from, and whether a bad one stops loading or is counted."""

    source: str
    skip_invalid: bool
    unit: str = "line"

    def reject(self, out: _Rows, where: int, bad: _BadValue) -> None:
        """Count a bad row under its column, or stop at it."""
        if not self.skip_invalid:
            raise TraceError(
                f"{self.source} {self.unit} {where}: {bad.describe()}",
                source=self.source,
                line=where,
                column=bad.column,
                value=bad.value,
            )
        out.skipped[bad.column] += 1

    def error(self, message: str, column: str | None = None) -> TraceError:
        return TraceError(f"{self.source}: {message}", source=self.source, column=column)


Numbered = Iterable[tuple[int, list[str]]]


def _csv_rows(reader: Any, width: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, stripped cells) of every non-blank row, padded to the header's width.

    A short row's missing cells read as empty (the value is then "not given" or missing); a
    row with more cells than the header is a bad row, reported by the parser as `fields`.
    """
    for row in reader:
        if not row:
            continue
        cells = list(map(str.strip, row))
        if len(cells) < width:
            cells.extend([""] * (width - len(cells)))
        yield reader.line_num, cells


def _check_width(cells: list[str], width: int) -> None:
    if len(cells) > width:
        raise _BadValue("fields", str(len(cells)), f"cells, but the header has {width} columns")


def _index(header: list[str], required: Iterable[str], ctx: _Context) -> dict[str, int]:
    """Column name -> position; every required column must be there."""
    where = {name: i for i, name in enumerate(header)}
    missing = [name for name in required if name not in where]
    if missing:
        raise ctx.error(
            "missing required column" + ("s " if len(missing) > 1 else " ") + ", ".join(repr(m) for m in missing),
            column=missing[0],
        )
    return where


# --- native ------------------------------------------------------------------------------------

_NATIVE_CONVERT: dict[str, Callable[[str, str], Any]] = {
    "queue": lambda t, c: t,
    "tier": _tier,
    "user": lambda t, c: t,
    "replicas": lambda t, c: _whole(t, c, 1),
    "gpus_per_replica": lambda t, c: _whole(t, c, 1),
    "lease": _number,
    "checkpoint_interval": lambda t, c: _number(t, c, positive=True),
    "checkpoint_seconds": _number,
    "startup_seconds": _number,
    "resumable": _flag,
    "cpu": _whole,
    "memory": _whole,
    "flavor": lambda t, c: t,
    "duration_basis": _duration_basis,
}


def _native_columns(header: list[str], ctx: _Context) -> dict[str, int]:
    """Check a native header: required columns present, no unknown (mistyped) columns."""
    known = set(NATIVE_REQUIRED) | set(NATIVE_OPTIONAL)
    unknown = [h for h in header if h not in known]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ctx.error(
            f"unknown column{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
            f"native columns are {', '.join(NATIVE_REQUIRED + NATIVE_OPTIONAL)}",
            column=unknown[0],
        )
    repeated = [name for name, n in Counter(header).items() if n > 1]
    if repeated:
        raise ctx.error(f"column {repeated[0]!r} appears more than once", column=repeated[0])
    return _index(header, NATIVE_REQUIRED, ctx)


def _native_row(
    cells: list[str], idx: tuple[int, int, int, int], optional: list[tuple[int, str, Callable[[str, str], Any]]]
) -> dict[str, Any]:
    """One native row as TraceJob fields; an empty optional cell takes the field's default."""
    i_id, i_submit, i_gpus, i_dur = idx
    num_gpus = _whole(cells[i_gpus], "num_gpus", 1)
    row: dict[str, Any] = {
        "job_id": _required_text(cells[i_id], "job_id"),
        "submit": _number(cells[i_submit], "submit"),
        "num_gpus": num_gpus,
        "duration": _number(cells[i_dur], "duration"),
    }
    for i, name, convert in optional:
        text = cells[i]
        if text:
            row[name] = convert(text, name)
    replicas: int | None = row.get("replicas")
    per: int | None = row.get("gpus_per_replica")
    if replicas is not None and per is not None:
        if replicas * per != num_gpus:
            raise _BadValue("replicas", str(replicas), f"x gpus_per_replica {per} is not num_gpus {num_gpus}")
    elif replicas is not None:
        if num_gpus % replicas:
            raise _BadValue("replicas", str(replicas), f"does not divide num_gpus {num_gpus}")
        row["gpus_per_replica"] = num_gpus // replicas
    elif per is not None:
        if num_gpus % per:
            raise _BadValue("gpus_per_replica", str(per), f"does not divide num_gpus {num_gpus}")
        row["replicas"] = num_gpus // per
    else:
        row["replicas"], row["gpus_per_replica"] = 1, num_gpus
    return row


def _parse_native(header: list[str], rows: Numbered, ctx: _Context) -> _Rows:
    where = _native_columns(header, ctx)
    idx = (where["job_id"], where["submit"], where["num_gpus"], where["duration"])
    optional = [(where[name], name, _NATIVE_CONVERT[name]) for name in NATIVE_OPTIONAL if name in where]
    width = len(header)
    out = _Rows(given=frozenset(header) | FORMAT_GIVES["native"])
    first_line: dict[str, int] = {}
    for line, cells in rows:
        try:
            _check_width(cells, width)
            row = _native_row(cells, idx, optional)
            job_id = row["job_id"]
            if job_id in first_line:
                raise _BadValue("job_id", job_id, f"repeats the job of {ctx.unit} {first_line[job_id]}")
        except _BadValue as bad:
            ctx.reject(out, line, bad)
            continue
        first_line[job_id] = line
        out.rows.append(row)
    return out


# --- Philly (Pollux) ---------------------------------------------------------------------------


def _read_vc_file(path: Path) -> dict[str, float]:
    """VC -> nominal GPUs (nodes x 8) from HeliosArtifact's `vc,node num` table."""
    ctx = _Context(str(path), skip_invalid=False)
    quotas: dict[str, float] = {}
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        where = _index(header, ("vc", "node num"), ctx)
        for line, cells in _csv_rows(reader, len(header)):
            try:
                vc = _required_text(cells[where["vc"]], "vc")
                quotas[vc] = float(_whole(cells[where["node num"]], "node num") * GPUS_PER_PHILLY_NODE)
            except _BadValue as bad:
                ctx.reject(_Rows(), line, bad)
    return quotas


def _parse_philly(header: list[str], rows: Numbered, ctx: _Context, vc_file: Path | None) -> _Rows:
    where = _index(header, PHILLY_REQUIRED, ctx)
    i_ts, i_dur, i_gpus, i_vc = (where[c] for c in ("timestamp", "duration", "num_gpus", "cluster"))
    width = len(header)
    out = _Rows(given=FORMAT_GIVES["philly"])
    append = out.rows.append
    for index, (line, cells) in enumerate(rows):
        try:
            _check_width(cells, width)
            append(
                {
                    "job_id": str(index),
                    "submit": _wall_clock(cells[i_ts], "timestamp"),
                    "num_gpus": _whole(cells[i_gpus], "num_gpus", 1),
                    "duration": _number(cells[i_dur], "duration"),
                    "queue": _required_text(cells[i_vc], "cluster"),
                }
            )
        except _BadValue as bad:
            ctx.reject(out, line, bad)
    out.rules.append("job_id: Pollux's Philly trace has no job ids; a job's id is its 0-based data row in the file.")
    out.rules.append("queue: a job's Philly virtual cluster (`cluster`) is its queue.")
    if vc_file is not None:
        quotas = _read_vc_file(vc_file)
        seen = sorted({row["queue"] for row in out.rows} - quotas.keys())
        out.queues = dict(quotas)
        for name in seen:
            out.queues[name] = 0.0
        sentence = (
            f"queues: nominal quota of each VC = {GPUS_PER_PHILLY_NODE} GPUs x its nodes in "
            f"{vc_file.name} ({len(quotas)} VCs)"
        )
        if seen:
            sentence += (
                f"; {len(seen)} VC{'s' if len(seen) > 1 else ''} of the trace not in that "
                f"file ({', '.join(seen)}) get quota 0"
            )
        out.rules.append(sentence + ".")
    else:
        out.rules.append(f"queues: no {VC_FILE_NAME} next to the trace, so no nominal quotas.")
    return out


# --- Philly (RFold) ----------------------------------------------------------------------------


def _parse_rfold(header: list[str], rows: Numbered, ctx: _Context) -> _Rows:
    where = _index(header, RFOLD_REQUIRED, ctx)
    i_id, i_sub, i_gpus, i_dur = (where[c] for c in RFOLD_REQUIRED)
    width = len(header)
    out = _Rows(given=FORMAT_GIVES["philly-rfold"])
    first_line: dict[str, int] = {}
    zero = 0
    for line, cells in rows:
        try:
            _check_width(cells, width)
            job_id = _required_text(cells[i_id], "#job id")
            submit = _number(cells[i_sub], "arrival time (sec)", minimum=None)
            num_gpus = _whole(cells[i_gpus], "size", 1)
            duration = _number(cells[i_dur], "duration (sec)")
            if job_id in first_line:
                raise _BadValue("#job id", job_id, f"repeats the job of {ctx.unit} {first_line[job_id]}")
        except _BadValue as bad:
            ctx.reject(out, line, bad)
            continue
        if duration == 0.0:
            zero += 1
            continue
        first_line[job_id] = line
        out.rows.append({"job_id": job_id, "submit": submit, "num_gpus": num_gpus, "duration": duration})
    if zero:
        out.skipped["duration"] += zero
    out.rules.append(
        f"duration: rows with duration 0 are rejected, always ({zero} in this file, "
        f"counted in skipped under 'duration'): a job that needs no time is no job."
    )
    return out


# --- Alibaba PAI 2023 --------------------------------------------------------------------------


def _qos_tier(text: str, column: str) -> int:
    tier = PAI_QOS_TIERS.get(text.lower())
    if tier is None:
        raise _BadValue(column, text, "is not one of LS, Guaranteed, Burstable, BE")
    return tier


def _parse_pai(header: list[str], rows: Numbered, ctx: _Context) -> _Rows:
    where = _index(header, PAI_REQUIRED, ctx)
    width = len(header)
    col = where.get
    i_name, i_gpu, i_create, i_delete = (where[c] for c in PAI_REQUIRED)
    i_milli, i_cpu, i_mem, i_spec, i_qos, i_sched = (
        col(c) for c in ("gpu_milli", "cpu_milli", "memory_mib", "gpu_spec", "qos", "scheduled_time")
    )
    given = FORMAT_GIVES["pai2023"] if i_qos is not None else FORMAT_GIVES["pai2023"] - {"tier"}
    out = _Rows(given=given)
    first_line: dict[str, int] = {}
    always: Counter[str] = Counter()
    for line, cells in rows:
        try:
            _check_width(cells, width)
            name = _required_text(cells[i_name], "name")
            num_gpus = _whole(cells[i_gpu], "num_gpu")
            milli = PAI_WHOLE_GPU_MILLI
            if i_milli is not None and cells[i_milli]:
                milli = _whole(cells[i_milli], "gpu_milli")
            creation = _number(cells[i_create], "creation_time", minimum=None)
            deletion_text = cells[i_delete]
            deletion = _number(deletion_text, "deletion_time", minimum=None) if deletion_text else None
            start = creation
            if i_sched is not None and cells[i_sched]:
                start = _number(cells[i_sched], "scheduled_time", minimum=None)
            row: dict[str, Any] = {"job_id": name, "submit": creation, "num_gpus": num_gpus}
            if i_cpu is not None and cells[i_cpu]:
                row["cpu"] = _whole(cells[i_cpu], "cpu_milli")
            if i_mem is not None and cells[i_mem]:
                row["memory"] = _whole(cells[i_mem], "memory_mib")
            if i_spec is not None and cells[i_spec]:
                row["flavor"] = cells[i_spec]
            if i_qos is not None and cells[i_qos]:
                row["tier"] = _qos_tier(cells[i_qos], "qos")
            if name in first_line:
                raise _BadValue("name", name, f"repeats the pod of {ctx.unit} {first_line[name]}")
        except _BadValue as bad:
            ctx.reject(out, line, bad)
            continue
        if num_gpus == 0:
            always["num_gpu"] += 1
            continue
        if deletion is None:
            always["deletion_time"] += 1
            continue
        duration = deletion - start
        if duration <= 0:
            always["duration"] += 1
            continue
        first_line[name] = line
        row["duration"] = duration
        row["gpus_per_replica"] = num_gpus
        row["_fractional"] = milli < PAI_WHOLE_GPU_MILLI
        out.rows.append(row)
    out.skipped.update(always)
    out.rules.append(
        "duration: deletion_time - scheduled_time for a pod that was scheduled, "
        "else deletion_time - creation_time; submit is creation_time."
    )
    out.rules.append(
        f"skipped, always: pods with num_gpu 0 are CPU-only ({always['num_gpu']}); "
        f"pods with no deletion_time ({always['deletion_time']}) or a duration <= 0 "
        f"({always['duration']}) never ran."
    )
    if i_qos is not None:
        out.rules.append("tier from qos: LS -> 1, Guaranteed -> 2, Burstable -> 3, BE -> 4 (an empty qos: tier 3).")
    out.rules.append(
        "each pod is one replica; gpu_spec (when set) is its flavor; cpu_milli and memory_mib are its cpu and memory."
    )
    return out


def _fraction_rule(count: int) -> str:
    return (
        f"fractional GPUs: {count} pod{'s' if count != 1 else ''} asked for a share of one GPU "
        f"(gpu_milli < {PAI_WHOLE_GPU_MILLI}) and {'were' if count != 1 else 'was'} rounded up "
        f"to one whole GPU, since warden allocates whole GPUs."
    )


# --- detection, reading, finishing -------------------------------------------------------------


def detect_format(path: str | Path) -> str:
    """The format of `path`, told from its suffix (`.parquet`: native) or its header line."""
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return "native"
    with path.open(newline="", encoding="utf-8-sig") as handle:
        header = [h.strip() for h in next(csv.reader(handle), [])]
    return _format_of(header, str(path))


def _format_of(header: list[str], source: str) -> str:
    if set(NATIVE_REQUIRED) <= set(header):
        return "native"
    if tuple(header[: len(PHILLY_HEADER)]) == PHILLY_HEADER:
        return "philly"
    if tuple(header[: len(RFOLD_HEADER)]) == RFOLD_HEADER:
        return "philly-rfold"
    if tuple(header[: len(PAI_HEADER_PREFIX)]) == PAI_HEADER_PREFIX:
        return "pai2023"
    shown = ",".join(header)[:120]
    raise TraceError(
        f"{source}: cannot tell the trace format from the header {shown!r}; "
        f"a native trace needs the columns {','.join(NATIVE_REQUIRED)} "
        f"(or pass format= one of {', '.join(FORMATS)})",
        source=source,
        line=1,
    )


def _parquet_rows(path: Path, ctx: _Context) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """A Parquet file's header and rows as text cells, so one validator serves CSV and Parquet."""
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise ctx.error(PARQUET_HINT) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise ctx.error(f"not a readable Parquet file ({exc})") from exc
    header = [str(name).strip() for name in table.column_names]
    columns = [[native_cell(v) for v in table.column(i).to_pylist()] for i in range(table.num_columns)]
    return header, ((n, list(cells)) for n, cells in enumerate(zip(*columns), start=1))


def load_trace(
    path: str | Path,
    format: str = "auto",
    *,
    seed: int = 0,
    skip_invalid: bool = False,
    limit: int | None = None,
    vc_file: str | Path | None = None,
    enrich: bool = True,
) -> Trace:
    """Load a trace file into jobs sorted by (submit, file order), rebased to start at 0.0.

    `format`: auto, native, philly, philly-rfold or pai2023. `seed` drives the enrichment
    draws. `skip_invalid` counts bad rows in `Trace.skipped` instead of raising `TraceError`.
    `limit` keeps the first N jobs by submit time. `vc_file` (Philly only) is the VC quota
    table; by default `philly_vc_nodes.csv` next to the trace, when there is one.
    `enrich=False` applies none of the enrichment rules: what the trace lacks keeps
    `TraceJob`'s defaults (tier 3, no startup, no checkpoints, one replica) — the bare jobs
    that textbook simulators replay.
    """
    with _gc_paused():
        return _load(
            Path(path), format, seed=seed, skip_invalid=skip_invalid, limit=limit, vc_file=vc_file, enrich=enrich
        )


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a trace loads.

    Loading allocates a few objects per row and frees none, so the collector's generational
    passes find nothing while rescanning every row so far: about a quarter of the load time
    of a 100k-row trace. The rows hold no cycles, so nothing is lost by waiting.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load(
    path: Path,
    format: str,
    *,
    seed: int,
    skip_invalid: bool,
    limit: int | None,
    vc_file: str | Path | None,
    enrich: bool,
) -> Trace:
    source = str(path)
    if format != "auto" and format not in FORMATS:
        raise TraceError(
            f"{source}: unknown format {format!r}; expected auto or one of {', '.join(FORMATS)}", source=source
        )
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    if not path.is_file():
        raise TraceError(f"{source}: no such file", source=source)
    if path.suffix.lower() == ".parquet":
        if format not in ("auto", "native"):
            raise TraceError(f"{source}: only native traces are read from Parquet, not {format}", source=source)
        ctx = _Context(source, skip_invalid, unit="row")
        header, rows = _parquet_rows(path, ctx)
        return _finish(_parse_native(header, rows, ctx), "native", source, seed, limit, enrich)
    ctx = _Context(source, skip_invalid)
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise ctx.error("empty file: no header line")
        resolved = _format_of(header, source) if format == "auto" else format
        if vc_file is not None and resolved != "philly":
            raise ctx.error(f"vc_file applies to philly traces only, not {resolved}")
        numbered = _csv_rows(reader, len(header))
        if resolved == "native":
            parsed = _parse_native(header, numbered, ctx)
        elif resolved == "philly":
            parsed = _parse_philly(header, numbered, ctx, _vc_file_for(path, vc_file))
        elif resolved == "philly-rfold":
            parsed = _parse_rfold(header, numbered, ctx)
        else:
            parsed = _parse_pai(header, numbered, ctx)
    return _finish(parsed, resolved, source, seed, limit, enrich)


def _vc_file_for(trace: Path, vc_file: str | Path | None) -> Path | None:
    if vc_file is not None:
        vc_file = Path(vc_file)
        if not vc_file.is_file():
            raise TraceError(f"{vc_file}: no such file (vc_file)", source=str(vc_file))
        return vc_file
    beside = trace.with_name(VC_FILE_NAME)
    return beside if beside.is_file() else None


def _finish(parsed: _Rows, format: str, source: str, seed: int, limit: int | None, enrich: bool = True) -> Trace:
    """Sort (stable: ties keep file order), cut to `limit`, rebase, number, enrich, build."""
    rows = parsed.rows
    rows.sort(key=itemgetter("submit"))
    if limit is not None:
        del rows[limit:]
    base = rows[0]["submit"] if rows else 0.0
    fractional = 0
    defaults = [_DEFAULTS[name] for name in FIELDS]
    i_submit, i_seq, i_per = (FIELD_INDEX[n] for n in ("submit", "seq", "gpus_per_replica"))
    values: list[list[Any]] = []
    for seq, row in enumerate(rows):
        if row.pop("_fractional", False):
            fractional += 1
        job = defaults.copy()
        job[i_per] = row["num_gpus"]  # one replica of all its GPUs unless the row says
        for name, value in row.items():
            job[FIELD_INDEX[name]] = value
        job[i_submit] = row["submit"] - base
        job[i_seq] = seq
        values.append(job)
    rules = fill_fields(values, seed=seed, format=format, given=parsed.given) if enrich else []
    loader_rules = parsed.rules
    if format == "pai2023":
        loader_rules = [*loader_rules, _fraction_rule(fractional)]
    return Trace(
        jobs=tuple(TraceJob(*job) for job in values),
        source=source,
        format=format,
        queues=parsed.queues,
        skipped=sum(parsed.skipped.values()),
        skipped_reasons=dict(parsed.skipped),
        rules=tuple(loader_rules + rules),
        seed=seed,
    )


_DEFAULTS: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in fields(TraceJob)}
"""TraceJob's defaults by field (every field but the four required ones has one)."""


__all__ = ["FORMATS", "TraceError", "detect_format", "load_trace"]
