"""Alembic environment of Minder's schema.

Run through :func:`minder.storage.migrate.upgrade_database` (which hands over an open
connection in ``config.attributes["connection"]``) or any ``alembic.command`` with the
:func:`minder.storage.migrate.alembic_config` of a URL. No ``alembic.ini`` is needed.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from minder.core.errors import ValidationError
from minder.storage.engine import create_engine_for
from minder.storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite can alter a table only by copying it: let future migrations use batch mode
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the SQL for ``--sql`` mode instead of running it."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on a new engine for the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise ValidationError("the Alembic config has no connection and no sqlalchemy.url")
    engine = create_engine_for(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
