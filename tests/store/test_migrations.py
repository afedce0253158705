"""The shipped Alembic migrations build exactly the schema of warden.store.schema, on both databases."""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from pg import fresh_postgres_url, postgres_server  # noqa: F401  (fixtures)
from sqlalchemy import Engine, inspect, text

from warden.store import Store, connect, current_revision, migrate
from warden.store.db import HEAD_REVISION, MIGRATIONS_DIR, alembic_config
from warden.store.schema import Base

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'warden.db'}"
    else:
        url = str(request.getfixturevalue("fresh_postgres_url"))
    created = connect(url)
    try:
        yield created
    finally:
        created.dispose()


def head() -> str:
    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert revision is not None
    return revision


def _columns(engine: Engine, table: str) -> dict[str, tuple[bool, bool]]:
    """name -> (nullable, part of the primary key), as the database reports them."""
    inspector = inspect(engine)
    pk = set(inspector.get_pk_constraint(table)["constrained_columns"])
    return {c["name"]: (bool(c["nullable"]), c["name"] in pk) for c in inspector.get_columns(table)}


def test_migrate_creates_exactly_the_orm_schema(engine: Engine) -> None:
    assert current_revision(engine) is None
    migrate(engine)
    assert current_revision(engine) == head()

    inspector = inspect(engine)
    assert set(inspector.get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
    for name, table in Base.metadata.tables.items():
        expected = {c.name: (bool(c.nullable), c.primary_key) for c in table.columns}
        assert _columns(engine, name) == expected, name
        indexes = {ix["name"]: tuple(ix["column_names"]) for ix in inspector.get_indexes(name) if not ix.get("unique")}
        assert indexes == {ix.name: tuple(c.name for c in ix.columns) for ix in table.indexes}, name
        foreign = {(tuple(fk["constrained_columns"]), fk["referred_table"]) for fk in inspector.get_foreign_keys(name)}
        assert foreign == {((fk.parent.name,), fk.column.table.name) for fk in table.foreign_keys}, name
    assert {tuple(u["column_names"]) for u in inspector.get_unique_constraints("tokens")} == {("token_hash",)}

    # Alembic's own comparison (types, nullability, indexes, constraints) finds nothing to do.
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_migrate_twice_is_harmless(engine: Engine) -> None:
    migrate(engine)
    store = Store(engine)
    job_id = store.submit(name="x", user="u", queue="q", tier=3, command=["true"], actor="u", now=1.0)
    store.audit("u", "approve", f"job/{job_id}", {}, now=2.0)
    migrate(engine)
    assert current_revision(engine) == head()
    assert store.get(job_id) is not None and len(store.audit_log()) == 1


def test_a_database_at_the_head_is_not_handed_to_alembic(engine: Engine) -> None:
    """`HEAD_REVISION` is Alembic's head; a server starting on a database already there does not
    even import Alembic (a fresh process: this one has imported it)."""
    assert head() == HEAD_REVISION
    migrate(engine)
    url = engine.url.render_as_string(hide_password=False)
    script = (
        "import sys\n"
        "from warden.store.db import connect, migrate\n"
        f"engine = connect({url!r})\n"
        "migrate(engine)\n"
        "print('alembic' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_concurrent_migrations_are_serialized(engine: Engine) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        try:
            barrier.wait()
            migrate(engine)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert current_revision(engine) == head()


def test_downgrade_to_base_removes_everything(engine: Engine) -> None:
    from alembic import command

    migrate(engine)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            functions = conn.execute(text("SELECT count(*) FROM pg_proc WHERE proname = 'warden_audit_append_only'"))
            assert functions.scalar_one() == 0
    migrate(engine)  # and back up again
    assert current_revision(engine) == head()


def test_every_migration_file_ships_in_the_package() -> None:
    """An installed warden must be able to migrate: pyproject's package-data must match every
    file Alembic needs (env.py, the template, each revision)."""
    config: dict[str, Any] = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["warden"]
    package_root = REPO_ROOT / "warden"
    needed = [p for p in MIGRATIONS_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert {p.name for p in needed} >= {"env.py", "script.py.mako", "0001_initial.py"}
    for path in needed:
        relative = path.relative_to(package_root).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


def test_0015_says_what_measured_lost_work_rests_on_and_charges_a_cancel_nothing(engine: Engine) -> None:
    """Attempts measured before 0015: `reported` where a checkpoint was, else `assumed`; a cancel
    or a time limit charged nothing (no lost work where no preemption stopped it, 0 `cancelled`
    where one did)."""
    from alembic import command

    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0014")
    attempts = {  # number: (reason, preemption_kind, last_checkpoint_at, lost_work_gpu_s)
        1: ("preempted", "'preemption'", "NULL", "100"),
        2: ("killed", "'reclaim'", "50", "40"),
        3: ("cancelled", "NULL", "NULL", "30"),
        4: ("cancelled", "'preemption'", "NULL", "20"),
        5: ("completed", "NULL", "NULL", "NULL"),
        6: ("timeout", "NULL", "NULL", "25"),
    }
    with engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO jobs (id, name, "user", queue, tier, state, replicas, gpus, cpu, memory, placement, '
                "command, workdir, env, submit_at, preempted_at) VALUES (1, 'x', 'u', 'q', 3, 'CANCELLED', 1, 1, 0, "
                "0, 'any', '[\"true\"]', '/', '{}', 1.0, '[]')"
            )
        )
        for number, (reason, kind, checkpoint, lost) in attempts.items():
            conn.execute(
                text(
                    "INSERT INTO attempts (job_id, number, state, started_at, assignment, log_dir, reason, "
                    f"preemption_kind, last_checkpoint_at, lost_work_gpu_s) VALUES (1, {number}, 'exited', 1.0, "
                    f"'[]', '', '{reason}', {kind}, {checkpoint}, {lost})"
                )
            )
    migrate(engine)
    store = Store(engine)
    assert {a.number: (a.lost_work_gpu_s, a.lost_work_basis) for a in store.attempts(1)} == {
        1: (100.0, "assumed"),
        2: (40.0, "reported"),
        3: (None, None),
        4: (0.0, "cancelled"),
        5: (None, None),
        6: (None, None),
    }
    assert store.get(1).saves_on_sigterm is False  # type: ignore[union-attr]


def test_0017_counts_the_bytes_each_user_keeps_from_the_jobs_already_stored(engine: Engine) -> None:
    """Every job stored before 0017, finished or not, counts toward its user's `user_storage`
    row, as `stored_bytes` counts it; a user with no job has no row; submissions add to it."""
    from alembic import command

    from warden.store.jobs import stored_bytes

    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0016")
    jobs = {  # id: (user, state, command, env, workdir)
        1: ("ana", "SUCCEEDED", ["python", "tráin.py"], {"K": "v" * 700}, "/home/ana"),
        2: ("ana", "PENDING", ["sleep", "1"], {}, ""),
        3: ("bo", "CANCELLED", ["x" * 1200], {"LANG": "C.UTF-8"}, "/"),
    }
    jobs.update({i: ("cy", "FAILED", ["true"], {}, "/tmp") for i in range(4, 1204)})  # more than a batch
    insert = text(
        'INSERT INTO jobs (name, "user", queue, tier, state, replicas, gpus, cpu, memory, placement, command, '
        "workdir, env, submit_at, preempted_at, saves_on_sigterm) VALUES ('x', :user, 'q', 3, :state, 1, 1, 0, 0, "
        "'any', :command, :workdir, :env, :at, '[]', false)"
    )
    with engine.begin() as conn:
        conn.execute(
            insert,
            [
                {"user": u, "state": s, "command": json.dumps(c), "workdir": w, "env": json.dumps(e), "at": i}
                for i, (u, s, c, e, w) in jobs.items()
            ],
        )
    migrate(engine)
    store = Store(engine)
    expected = {u: 0 for u, *_ in jobs.values()}
    for u, _, c, e, w in jobs.values():
        expected[u] += stored_bytes(c, e, w)
    assert {u: store.stored_bytes_of(u) for u in expected} == expected
    assert expected["cy"] == 1200 * 8
    assert store.stored_bytes_of("nobody") == 0
    store.submit(name="y", user="bo", queue="q", tier=3, command=["ab"], env={"c": "d"}, actor="bo", now=2e6)
    assert store.stored_bytes_of("bo") == expected["bo"] + 4


def test_0019_moves_a_sigkill_deadline_stored_in_an_events_text_into_its_details(engine: Engine) -> None:
    """An event whose text holds its SIGKILL deadline as epoch seconds keeps it as `kill_at` in its
    details, the text without it, so it reads as every later event does; other events stay."""
    from alembic import command

    from warden.server.explanations import event_message

    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0018")
    evicted = "evicted: node n1 is DOWN; the whole gang stops and is requeued; grace 120s"
    preempted = "preempted for job 3 (reclaim); grace 120s; expected lost work 5 GPU-s"
    events = {  # id: (reason as stored, details as stored)
        1: (f"{evicted}, SIGKILL at 1796386481.753", {}),
        2: ("preempted for job 3 (reclaim); grace 120s, SIGKILL at 1796386481.753; expected lost work 5 GPU-s", {}),
        3: (f"{preempted}, SIGKILL at 1796386481", {"kill_at": 1796386400.5, "grace_s": 120.0}),
        4: ("preempted for job 3 (reclaim); grace 2m", {"kill_at": 1796386481.753}),
        5: ("SIGKILL at 42s, the grace of a test", {}),
        6: ("requeued", {"attempt": 1}),
    }
    with engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO jobs (id, name, "user", queue, tier, state, replicas, gpus, cpu, memory, placement, '
                "command, workdir, env, submit_at, preempted_at, saves_on_sigterm) VALUES (1, 'x', 'u', 'q', 3, "
                "'PENDING', 1, 1, 0, 0, 'any', '[]', '', '{}', 0, '[]', false)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO events (id, job_id, at, to_state, reason, actor, details) "
                "VALUES (:id, 1, :id, 'PREEMPTING', :reason, 'warden', :details)"
            ),
            [{"id": i, "reason": r, "details": json.dumps(d)} for i, (r, d) in events.items()],
        )
    migrate(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, reason, details FROM events ORDER BY id")).all()
    stored = {i: (r, d if isinstance(d, dict) else json.loads(d)) for i, r, d in rows}
    assert stored == {
        1: (evicted, {"kill_at": 1796386481.753}),
        2: (preempted, {"kill_at": 1796386481.753}),
        3: (preempted, {"kill_at": 1796386400.5, "grace_s": 120.0}),
        4: events[4],
        5: events[5],
        6: events[6],
    }
    now = 1_796_386_000.0
    message = event_message(*stored[1], now)
    assert message is not None and message.startswith(f"{evicted}, SIGKILL at ") and message.endswith("(in 8m2s)")


def test_0020_keeps_each_jobs_time_limit_under_its_new_name(engine: Engine) -> None:
    """A job stored before 0020 keeps its time limit (`expected_duration_s` then, `time_limit_s`
    after), NULL included, and the attempts that refer to it stay; downgrading gives the values
    back under the old name."""
    from alembic import command

    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0019")
    limits = {1: 3600.0, 2: None, 3: 0.5}
    with engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO jobs (id, name, "user", queue, tier, state, replicas, gpus, cpu, memory, placement, '
                "command, workdir, env, submit_at, preempted_at, saves_on_sigterm, expected_duration_s) VALUES "
                "(:id, 'x', 'u', 'q', 3, 'RUNNING', 1, 1, 0, 0, 'any', '[]', '', '{}', 0, '[]', false, :limit)"
            ),
            [{"id": i, "limit": limit} for i, limit in limits.items()],
        )
        conn.execute(
            text(
                "INSERT INTO attempts (job_id, number, state, started_at, assignment, log_dir) "
                "VALUES (:id, 1, 'running', 1.0, '[]', '')"
            ),
            [{"id": i} for i in limits],
        )
    migrate(engine)
    assert current_revision(engine) == "0020"
    store = Store(engine)
    assert {i: store.get(i).time_limit_s for i in limits} == limits  # type: ignore[union-attr]
    assert {i: store.get(i).to_engine().time_limit for i in limits} == limits  # type: ignore[union-attr]
    assert all(len(store.attempts(i)) == 1 for i in limits)

    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0019")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, expected_duration_s FROM jobs ORDER BY id")).all()
    assert dict(rows) == limits
