"""A job's output, as its replicas wrote it, and who may read it (`--private-data`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Literal

from warden.server.auth import Principal
from warden.server.errors import ApiError
from warden.server.serving import ServiceContext
from warden.store.jobs import StoredJob

PrivateData = Literal["jobs", "none"]


class Logs:
    """Reads one replica's log of one attempt, for its owner, admins, or anyone (`private_data`)."""

    def __init__(self, ctx: ServiceContext, private_data: PrivateData = "jobs") -> None:
        self.ctx = ctx
        self.private_data: PrivateData = private_data
        """What a user may not read of other users' jobs: "jobs", their command, workdir and
        logs (only the owner and admins read them); "none", everything is readable."""

    def may_read(self, who: Principal, job: StoredJob) -> bool:
        """Whether `who` may read the job's command, workdir and logs: its owner and admins
        always, anyone under `--private-data none`."""
        return who.is_admin or who.user == job.user or self.private_data == "none"

    def private(self, who: Principal, job: StoredJob, what: str) -> ApiError:
        return ApiError(
            403,
            "id",
            str(job.id),
            f"user {who.user!r} may not read {what} of job {job.id}, which is {job.user!r}'s "
            "(the server's --private-data jobs: only a job's owner and admins do)",
        )

    def read(self, job_id: str, attempt: int | None, rank: int, offset: int, who: Principal) -> dict[str, Any]:
        """Up to 1 MiB of one replica's output from `offset` (the API bounds `attempt` >= 1,
        `rank` >= 0 and `offset` to int64); 403 for another user's job under `--private-data jobs`."""
        job = self.ctx.job(job_id)
        if not self.may_read(who, job):
            raise self.private(who, job, "the logs")
        if rank >= job.replicas:
            raise ApiError(422, "rank", rank, f"the job has ranks 0..{job.replicas - 1}")
        number = attempt if attempt is not None else job.attempt
        if number < 1:
            return {"id": job_id, "attempt": 0, "rank": rank, "text": "", "offset": 0, "eof": job.state.terminal}
        row = self.ctx.store.attempt(job.id, number)
        if row is None:
            raise ApiError(404, "attempt", attempt, f"job {job_id} has no such attempt")
        replicas = (row.handle or {}).get("replicas") or []
        path = Path(replicas[rank]["log_path"]) if rank < len(replicas) else Path(row.log_dir) / f"rank-{rank}.log"
        text = b""
        try:
            # A job may own its attempt's directory (Slurm): a link planted there is never followed.
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            fd = None  # not written yet, or not a file the server will read
        if fd is not None:
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(fd).st_mode) and offset < f.seek(0, os.SEEK_END):
                    f.seek(offset)  # seeking far past the end fails on some file systems
                    text = f.read(1 << 20)
        return {
            "id": job_id,
            "attempt": number,
            "rank": rank,
            "text": text.decode("utf-8", "replace"),
            "offset": offset + len(text),
            "eof": row.state == "exited" and len(text) < (1 << 20),
        }
