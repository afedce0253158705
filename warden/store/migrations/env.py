"""Alembic environment for warden's schema.

`warden.store.db.migrate` runs this with a live connection in
`config.attributes["connection"]` (already inside its transaction); that is the normal path.
Without one (a developer running Alembic's commands by hand, see docs/store.md) it opens the
URL given as `-x url=...`, else the `sqlalchemy.url` option, else warden's default SQLite file.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from warden.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    from warden.store.db import default_url, normalize_url

    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return normalize_url(url or default_url()).render_as_string(hide_password=False)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit the SQL instead of running it (`alembic upgrade head --sql`)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from warden.store.db import connect, writer

    engine = connect(_url())
    try:
        with writer(engine).begin() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
