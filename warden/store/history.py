"""What the cluster used and went through: the fair-share ledger, the history samples, and
the preemptions read back from the attempts that suffered them."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from sqlalchemy import Connection, Row, Table, delete, func, insert, select

from warden.engine.cycles import Preempted
from warden.engine.model import JobState, UsageLedger
from warden.store.base import _READ_CHUNK, StoreBase
from warden.store.jobs import ATTEMPTS, EVENTS, JOBS, job_key
from warden.store.schema import LedgerRow, SampleRow

LEDGER = cast(Table, LedgerRow.__table__)
SAMPLES = cast(Table, SampleRow.__table__)


@dataclass(frozen=True, slots=True)
class HistorySample:
    """One sample of the cluster's history: the figures at `at` (`warden.server.history`)."""

    at: float
    cluster: dict[str, Any]
    queues: dict[str, Any]
    lost_totals: dict[str, float]
    """Lost work of every preemption recorded by `at`, GPU-seconds per leaf queue."""


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """An attempt that got SIGTERM for a preemption, a reclaim or an eviction, with its victim
    and preemptor jobs and the reason its PREEMPTING event gave."""

    job_id: int
    attempt: int
    victim_queue: str
    victim_tier: int
    victim_user: str
    kind: str
    sigterm_at: float
    kill_at: float | None
    ended_at: float | None
    lost_work_gpu_s: float | None
    preemptor: str | None
    preemptor_queue: str | None
    preemptor_tier: int | None
    reason: str | None
    lost_work_basis: str | None = None
    """What the lost work rests on (`attempts.lost_work_basis`); the fields after it say why."""
    saves_on_sigterm: bool = False
    last_checkpoint_at: float | None = None
    last_checkpoint_step: int | None = None
    exit_codes: tuple[int, ...] | None = None
    killed: bool = False


class LedgerState(NamedTuple):
    """The persisted fair-share ledger: unpacks as `(at, {queue: usage})`."""

    at: float
    usage: dict[str, float]

    def to_engine(self) -> UsageLedger:
        return UsageLedger(at=self.at, usage=dict(self.usage))


class HistoryStore(StoreBase):
    """The ledger, history and preemptions part of `Store`."""

    # --- fair-share ledger ---------------------------------------------------------------------

    def load_ledger(self) -> LedgerState:
        """The saved ledger as `(at, {queue: usage})`; `(0.0, {})` when none was saved."""
        with self._read() as conn:
            rows = conn.execute(select(LEDGER)).all()
        if not rows:
            return LedgerState(0.0, {})
        return LedgerState(max(float(r.at) for r in rows), {r.queue: float(r.usage) for r in rows})

    def save_ledger(self, at: float, usage: Mapping[str, float]) -> None:
        """Replace the saved ledger with `usage` as of `at` (queues absent now are dropped)."""
        params = [{"queue": q, "usage": float(u), "at": at} for q, u in usage.items()]
        with self._write() as conn:
            conn.execute(delete(LEDGER))
            if params:
                conn.execute(insert(LEDGER), params)

    # --- history -------------------------------------------------------------------------------

    def record_sample(self, sample: HistorySample, keep_after: float) -> None:
        """Store a sample and drop the samples older than `keep_after`, in one transaction."""
        values = {
            "at": sample.at,
            "cluster": dict(sample.cluster),
            "queues": dict(sample.queues),
            "lost_totals": dict(sample.lost_totals),
        }
        with self._write() as conn:
            conn.execute(insert(SAMPLES), values)
            conn.execute(delete(SAMPLES).where(SAMPLES.c.at < keep_after))

    def last_sample(self) -> HistorySample | None:
        """The newest sample: what the next one counts from."""
        query = select(SAMPLES).order_by(SAMPLES.c.at.desc(), SAMPLES.c.id.desc()).limit(1)
        with self._read() as conn:
            row = conn.execute(query).first()
        return None if row is None else _sample(row)

    def samples(self, since: float, until: float, most: int) -> tuple[HistorySample, ...]:
        """The samples taken from `since` to `until`, oldest first. Of more than `most`, `most`
        spread evenly from the first to the last: only their ids are read to choose them."""
        where = (SAMPLES.c.at >= since) & (SAMPLES.c.at <= until)
        rows: builtins.list[Row[Any]] = []
        with self._read() as conn:
            ids = builtins.list(
                conn.execute(select(SAMPLES.c.id).where(where).order_by(SAMPLES.c.at, SAMPLES.c.id)).scalars()
            )
            chosen = evenly(ids, most)
            for start in range(0, len(chosen), _READ_CHUNK):
                rows.extend(conn.execute(select(SAMPLES).where(SAMPLES.c.id.in_(chosen[start : start + _READ_CHUNK]))))
        rows.sort(key=lambda r: (r.at, r.id))
        return tuple(_sample(r) for r in rows)

    def preemption_counts(self, after: float, until: float) -> dict[str, int]:
        """Per leaf queue, the attempts whose SIGTERM for a preemption, reclaim or eviction came
        after `after`, up to `until`."""
        query = (
            select(JOBS.c.queue, func.count())
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(
                ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.sigterm_at > after, ATTEMPTS.c.sigterm_at <= until
            )
            .group_by(JOBS.c.queue)
        )
        with self._read() as conn:
            return {str(q): int(n) for q, n in conn.execute(query)}

    def lost_work_totals(self) -> dict[str, float]:
        """Per leaf queue, the lost work (GPU-seconds) of every preempted, reclaimed or evicted
        attempt whose exit was recorded so far."""
        query = (
            select(JOBS.c.queue, func.sum(ATTEMPTS.c.lost_work_gpu_s))
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.lost_work_gpu_s.is_not(None))
            .group_by(JOBS.c.queue)
        )
        with self._read() as conn:
            return {str(q): float(total or 0.0) for q, total in conn.execute(query)}

    def preemptions(self, since: float, limit: int) -> tuple[PreemptionRecord, ...]:
        """The attempts preempted, reclaimed or evicted at `since` or later, newest first, at most
        `limit`: each with its victim and preemptor jobs and its PREEMPTING event's reason."""
        query = (
            select(
                ATTEMPTS.c.job_id,
                ATTEMPTS.c.number,
                ATTEMPTS.c.preemption_kind,
                ATTEMPTS.c.sigterm_at,
                ATTEMPTS.c.kill_at,
                ATTEMPTS.c.ended_at,
                ATTEMPTS.c.lost_work_gpu_s,
                ATTEMPTS.c.preempted_for,
                ATTEMPTS.c.reason,
                ATTEMPTS.c.lost_work_basis,
                ATTEMPTS.c.last_checkpoint_at,
                ATTEMPTS.c.last_checkpoint_step,
                ATTEMPTS.c.exit_codes,
                JOBS.c.queue,
                JOBS.c.tier,
                JOBS.c.user,
                JOBS.c.saves_on_sigterm,
            )
            .select_from(ATTEMPTS.join(JOBS, JOBS.c.id == ATTEMPTS.c.job_id))
            .where(ATTEMPTS.c.preemption_kind.is_not(None), ATTEMPTS.c.sigterm_at >= since)
            .order_by(ATTEMPTS.c.sigterm_at.desc(), ATTEMPTS.c.job_id.desc(), ATTEMPTS.c.number.desc())
            .limit(limit)
        )
        events: dict[int, builtins.list[tuple[float, str]]] = {}
        with self._read() as conn:
            rows = conn.execute(query).all()
            preemptors = _queues_and_tiers(conn, (r.preempted_for for r in rows))
            victims = sorted({int(r.job_id) for r in rows})
            for start in range(0, len(victims), _READ_CHUNK):
                chunk = victims[start : start + _READ_CHUNK]
                preempting = select(EVENTS.c.job_id, EVENTS.c.at, EVENTS.c.reason).where(
                    EVENTS.c.job_id.in_(chunk), EVENTS.c.to_state == JobState.PREEMPTING.value
                )
                for j, at, reason in conn.execute(preempting):
                    events.setdefault(int(j), []).append((float(at), str(reason)))
        out = []
        for r in rows:
            key = job_key(r.preempted_for) if r.preempted_for else None
            by = preemptors.get(key) if key is not None else None
            said = events.get(int(r.job_id))
            reason = min(said, key=lambda e: abs(e[0] - r.sigterm_at))[1] if said else r.reason
            out.append(
                PreemptionRecord(
                    job_id=int(r.job_id),
                    attempt=int(r.number),
                    victim_queue=r.queue,
                    victim_tier=int(r.tier),
                    victim_user=r.user,
                    kind=r.preemption_kind,
                    sigterm_at=float(r.sigterm_at),
                    kill_at=r.kill_at,
                    ended_at=r.ended_at,
                    lost_work_gpu_s=r.lost_work_gpu_s,
                    preemptor=r.preempted_for,
                    preemptor_queue=by[0] if by else None,
                    preemptor_tier=by[1] if by else None,
                    reason=reason,
                    lost_work_basis=r.lost_work_basis,
                    saves_on_sigterm=bool(r.saves_on_sigterm),
                    last_checkpoint_at=r.last_checkpoint_at,
                    last_checkpoint_step=r.last_checkpoint_step,
                    exit_codes=None if r.exit_codes is None else tuple(r.exit_codes),
                    killed=r.reason == "killed",
                )
            )
        return tuple(out)

    def preemption_links(self, job_ids: Iterable[int | str]) -> tuple[Preempted, ...]:
        """What `warden.engine.cycles` reads to tell whether these jobs are in a preemption
        cycle: every preemption, reclaim or eviction of one of them, and every preemption one
        of them caused of a job that also preempted one of them (the only ones that can make
        a pair alternate), oldest first."""
        ids = sorted({k for j in job_ids if (k := job_key(j)) is not None})
        kinds = ATTEMPTS.c.preemption_kind.is_not(None)
        columns = (ATTEMPTS.c.sigterm_at, ATTEMPTS.c.job_id, ATTEMPTS.c.preempted_for, ATTEMPTS.c.preemption_kind)
        links: builtins.list[Preempted] = []

        def read(conn: Connection, where: Any) -> None:
            for at, victim, by, kind in conn.execute(
                select(*columns).where(kinds, ATTEMPTS.c.sigterm_at.is_not(None), where)
            ):
                links.append(Preempted(float(at), str(victim), by, str(kind)))

        with self._read() as conn:
            for start in range(0, len(ids), _READ_CHUNK):
                read(conn, ATTEMPTS.c.job_id.in_(ids[start : start + _READ_CHUNK]))
            # by the primary key: the jobs that preempted ours, and only what ours did to them
            partners = sorted({k for p in links if p.by is not None and (k := job_key(p.by)) is not None} - set(ids))
            names = [str(i) for i in ids]
            for start in range(0, len(partners), _READ_CHUNK):
                for n in range(0, len(names), _READ_CHUNK):
                    read(
                        conn,
                        ATTEMPTS.c.job_id.in_(partners[start : start + _READ_CHUNK])
                        & ATTEMPTS.c.preempted_for.in_(names[n : n + _READ_CHUNK]),
                    )
        links.sort(key=lambda p: (p.at, int(p.victim)))
        return tuple(links)

    def queues_and_tiers(self, job_ids: Iterable[int | str | None]) -> dict[int, tuple[str, int]]:
        """The queue and tier of each of these jobs that exists (ids that name none are left out)."""
        with self._read() as conn:
            return _queues_and_tiers(conn, job_ids)


def _queues_and_tiers(conn: Connection, job_ids: Iterable[int | str | None]) -> dict[int, tuple[str, int]]:
    wanted = sorted({k for j in job_ids if j is not None and (k := job_key(j)) is not None})
    out: dict[int, tuple[str, int]] = {}
    for start in range(0, len(wanted), _READ_CHUNK):
        chunk = wanted[start : start + _READ_CHUNK]
        for i, q, t in conn.execute(select(JOBS.c.id, JOBS.c.queue, JOBS.c.tier).where(JOBS.c.id.in_(chunk))):
            out[int(i)] = (str(q), int(t))
    return out


def evenly(items: Sequence[Any], most: int) -> builtins.list[Any]:
    """`items` whole when there are at most `most`, else `most` of them spread evenly from the
    first to the last."""
    n = len(items)
    if n <= most:
        return builtins.list(items)
    if most <= 1:
        return builtins.list(items[-most:]) if most == 1 else []
    return [items[round(i * (n - 1) / (most - 1))] for i in range(most)]


def _sample(row: Row[Any]) -> HistorySample:
    return HistorySample(float(row.at), dict(row.cluster), dict(row.queues), dict(row.lost_totals))
