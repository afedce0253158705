"""`warden history export`: the server's own jobs as a native trace (docs/traces.md) that
`warden sim run --trace` loads as it is, so a policy can be tried on the jobs a cluster really
ran.

One row a job submitted in the window that has had an attempt (finished, running, or waiting
again after a preemption); jobs that never started say nothing about how long they run and are
left out. What each column is made of, from the store's jobs and attempts and what the workload
SDK reported (docs/traces.md, *Exported traces*):

- `duration`: the work the job needs, in seconds of progress, from what was observed. Each
  attempt ran until its SIGTERM, its exit, or now while it still runs, less its startup and
  the checkpoints it wrote before that point; the progress it kept is that run less the work
  its preemption threw away (measured lost work / GPUs; a cancel throws none away). A job
  that finished (succeeded or failed) needs the progress its earlier attempts kept plus the
  run of its last one; one that did not (it runs, waits again, was cancelled or ran out its time limit) needs at
  least the most progress any of its attempts reached;
- `duration_basis`: what that rests on (`warden.traces.DURATION_BASES`): `observed`, `at_least` (it never
  finished), or `assumed` (a preemption's loss was assumed, so the progress kept before its
  last attempt is a guess and it may need more);
- `startup_seconds`: the median of the startups its attempts reported, else what the server
  assumed (the policy's `preemption.restart_overhead`), the same figure its lost work and η
  were computed with;
- `checkpoint_seconds`: checkpoint time per save (all saves, SIGTERM ones included; a declared
  save on SIGTERM takes the time from SIGTERM to the job's exit 0);
- `checkpoint_interval`: progress between periodic saves (a save on SIGTERM is no periodic
  one), empty when it saved only on SIGTERM or never;
- `resumable`: whether it ever completed a checkpoint, reported or declared (else it restarts
  from zero).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass
from typing import Any

from warden.engine.accounting import assumed_startup
from warden.engine.model import JobState
from warden.engine.policy import Policy
from warden.store.jobs import EXPORT_FINISHED, JobHead, StoredAttempt
from warden.store.repo import Store
from warden.traces import NATIVE_COLUMNS, native_cell

FORMATS = ("native", "parquet")
"""`?format=`: native CSV (text/csv), or the same columns as Parquet."""
PARQUET_HINT = "writing Parquet needs pyarrow on the server: pip install 'gpu-warden[parquet]'"
FINISHED = frozenset(JobState(s) for s in EXPORT_FINISHED)
"""The states in which a job has shown all the work it needs: it ended by itself."""
BATCH = 500
"""Jobs read (with their attempts) and written at a time: an export holds one batch, however
long its window."""


@dataclass(frozen=True, slots=True)
class ExportedJob:
    """One row of an exported trace: the native columns, in their order (`NATIVE_COLUMNS`)."""

    job_id: str
    submit: float
    num_gpus: int
    duration: float
    queue: str
    tier: int
    user: str
    replicas: int
    gpus_per_replica: int
    lease: float | None
    checkpoint_interval: float | None
    checkpoint_seconds: float
    startup_seconds: float
    resumable: bool
    cpu: int
    memory: int
    flavor: str | None
    duration_basis: str


def exported_job(job: JobHead, attempts: Sequence[StoredAttempt], policy: Policy, now: float) -> ExportedJob:
    """A job and its attempts as one trace row (the module docstring says how)."""
    gpus = job.gpus * job.replicas
    reported = [a.startup_s for a in attempts if a.startup_s is not None]
    startup = statistics.median(reported) if reported else assumed_startup(policy, None)
    kept = reached = 0.0
    periodic_saves = 0
    periodic_spans: list[float] = []
    declared = [took for a in attempts if (took := _declared_save_s(a)) is not None]
    saves = sum(a.checkpoints for a in attempts) + len(declared)
    per_save = (sum(a.checkpoint_s for a in attempts) + sum(declared)) / saves if saves else 0.0
    for a in attempts:
        stop = a.sigterm_at if a.sigterm_at is not None else a.ended_at if a.ended_at is not None else now
        began = a.started_at + assumed_startup(policy, a.startup_s)
        on_sigterm = _saved_on_sigterm(a)
        before = a.checkpoint_s - ((a.sigterm_save_s or 0.0) if on_sigterm else 0.0)
        ran = max(0.0, stop - began - before)
        lost = min(ran, (a.lost_work_gpu_s or 0.0) / gpus if gpus else 0.0)
        reached = max(reached, kept + ran)
        kept += ran - lost
        periodic = a.checkpoints - (1 if on_sigterm else 0)
        periodic_saves += periodic
        if periodic > 0 and not on_sigterm and a.last_checkpoint_at is not None:
            periodic_spans.append((a.last_checkpoint_at - began) / periodic - per_save)
    duration = max(kept, reached)
    interval: float | None = None
    if periodic_saves:
        spans = [s for s in periodic_spans if s > 0]
        interval = statistics.median(spans) if spans else (duration / periodic_saves or None)
    if job.state not in FINISHED:
        basis = "at_least"
    else:
        basis = "assumed" if any(a.lost_work_basis == "assumed" for a in attempts) else "observed"
    return ExportedJob(
        job_id=job.job_id,
        submit=job.submit_at,
        num_gpus=gpus,
        duration=round(duration, 6),
        queue=job.queue,
        tier=job.tier,
        user=job.user,
        replicas=job.replicas,
        gpus_per_replica=job.gpus,
        lease=job.lease_s,
        checkpoint_interval=None if interval is None else round(interval, 6),
        checkpoint_seconds=round(per_save, 6),
        startup_seconds=round(startup, 6),
        resumable=saves > 0,
        cpu=job.cpu,
        memory=job.memory,
        flavor=job.flavor,
        duration_basis=basis,
    )


def _declared_save_s(a: StoredAttempt) -> float | None:
    """How long the attempt's declared save on SIGTERM took (from SIGTERM to its clean exit);
    None when it kept none."""
    if a.lost_work_basis != "declared" or a.sigterm_at is None or a.ended_at is None:
        return None
    return a.ended_at - a.sigterm_at


def _saved_on_sigterm(a: StoredAttempt) -> bool:
    """Was the attempt's newest checkpoint the save after its SIGTERM?"""
    return a.sigterm_at is not None and a.last_checkpoint_at is not None and a.last_checkpoint_at >= a.sigterm_at


@dataclass(frozen=True, slots=True)
class Export:
    """An export as `GET /v1/history/export` sends it: what its headers say, read before any
    row, and its rows, read from the store `BATCH` jobs at a time as they are written."""

    total: int
    """How many rows it has (`X-Total-Count`)."""
    warning: str | None
    """`assumption_warning`'s sentence, if any."""
    rows: Iterator[ExportedJob]


def export(store: Store, since: float, policy: Policy, now: float) -> Export:
    """The jobs submitted at `since` or later that have run, as trace rows: their ids and how
    many rest on an assumption from one read (`Store.export_window`), then each batch of jobs
    with its attempts (`Store.export_batch`), so that an export costs one batch of memory. A
    job's row is as it is when its batch is read: one that finishes meanwhile is exported
    finished, though the warning counted it as unfinished."""
    window = store.export_window(since)

    def rows() -> Iterator[ExportedJob]:
        for start in range(0, len(window.ids), BATCH):
            for job, attempts in store.export_batch(window.ids[start : start + BATCH]):
                yield exported_job(job, attempts, policy, now)

    total = len(window.ids)
    return Export(total, assumption_warning(total, window.unfinished, window.assumed), rows())


def assumption_warning(total: int, at_least: int, assumed: int) -> str | None:
    """One sentence counting the rows of `total` whose duration rests on an assumption: `at_least`
    that never finished, `assumed` whose lost work was assumed (None: none does)."""
    parts = []
    if at_least:
        parts.append(f"{at_least} never finished (at_least: they need at least what they ran)")
    if assumed:
        parts.append(f"{assumed} had their lost work assumed at a preemption (assumed: they may need more)")
    if not parts:
        return None
    return (
        f"{at_least + assumed} of {total} durations rest on an assumption: "
        + "; ".join(parts)
        + " (column duration_basis)"
    )


def csv_chunks(rows: Iterable[ExportedJob]) -> Iterator[str]:
    """The native CSV, `BATCH` rows a chunk: a header of every column, an empty cell where a
    value is not set."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(NATIVE_COLUMNS)
    for n, row in enumerate(rows, 1):
        writer.writerow([native_cell(v) for v in astuple(row)])
        if n % BATCH == 0:
            yield _drained(out)
    yield _drained(out)


def _drained(out: io.StringIO) -> str:
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    return text


class _Chunks(io.RawIOBase):
    """A write-only file that keeps what was written until `take`: where Parquet is written, a
    row group at a time. `tell` counts every byte written, as Parquet's footer offsets need."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: list[bytes] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        self._written += len(chunk)
        return len(chunk)

    def tell(self) -> int:
        return self._written

    def take(self) -> bytes:
        taken = b"".join(self._parts)
        self._parts.clear()
        return taken


def parquet_chunks(rows: Iterable[ExportedJob]) -> Iterator[bytes]:
    """The same columns as Parquet, typed (nulls where the CSV has empty cells), one row group
    of up to `BATCH` rows a chunk. Raises ImportError without pyarrow, before any chunk."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    schema = pa.schema([(name, _parquet_type(pa, name)) for name in NATIVE_COLUMNS])

    def chunks() -> Iterator[bytes]:
        sink = _Chunks()
        with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema) as writer:
            batch: list[ExportedJob] = []
            wrote = False
            for row in rows:
                batch.append(row)
                if len(batch) == BATCH:
                    writer.write_table(_parquet_table(pa, schema, batch))
                    batch.clear()
                    wrote = True
                    yield sink.take()
            if batch or not wrote:  # an empty export is still one (empty) row group
                writer.write_table(_parquet_table(pa, schema, batch))
        yield sink.take()

    return chunks()


def _parquet_table(pa: Any, schema: Any, rows: Sequence[ExportedJob]) -> Any:
    columns = list(zip(*(astuple(r) for r in rows))) if rows else [() for _ in NATIVE_COLUMNS]
    return pa.Table.from_arrays([pa.array(list(c), type=t) for c, t in zip(columns, schema.types)], schema=schema)


def _parquet_type(pa: Any, name: str) -> Any:
    types = {
        "job_id": pa.string(),
        "submit": pa.float64(),
        "num_gpus": pa.int64(),
        "duration": pa.float64(),
        "queue": pa.string(),
        "tier": pa.int64(),
        "user": pa.string(),
        "replicas": pa.int64(),
        "gpus_per_replica": pa.int64(),
        "lease": pa.float64(),
        "checkpoint_interval": pa.float64(),
        "checkpoint_seconds": pa.float64(),
        "startup_seconds": pa.float64(),
        "resumable": pa.bool_(),
        "cpu": pa.int64(),
        "memory": pa.int64(),
        "flavor": pa.string(),
        "duration_basis": pa.string(),
    }
    return types[name]
