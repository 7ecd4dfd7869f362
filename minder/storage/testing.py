"""Helpers for tests that need a real database (used by Minder's own test suites).

PostgreSQL tests run in a throw-away schema: the URL returned by
:func:`temporary_postgres_schema` sets ``search_path`` to it, so tables and ``alembic_version``
land there, concurrent or repeated runs never see each other's rows, and dropping the schema
removes everything.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from sqlalchemy import Engine, create_engine, delete, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from minder.storage.engine import create_engine_for, normalise_url
from minder.storage.migrate import upgrade_database
from minder.storage.models import Base

POSTGRES_URL_ENV = "MINDER_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_test_url() -> URL:
    """The server tests use: ``$MINDER_TEST_POSTGRES_URL`` or the local ``test`` database."""
    return normalise_url(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))


def postgres_unavailable(url: URL | None = None) -> str | None:
    """Why PostgreSQL at ``url`` cannot be used (a reason to skip on), or ``None`` if it can."""
    target = url or postgres_test_url()
    engine = create_engine(target, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        first_line = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        return f"PostgreSQL not reachable at {target.render_as_string()}: {first_line}"
    finally:
        engine.dispose()
    return None


@contextmanager
def temporary_postgres_schema(url: URL | None = None) -> Iterator[URL]:
    """Create a fresh schema, yield a URL whose connections use it, drop it (cascade) at exit."""
    base = url or postgres_test_url()
    schema = f"minder_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield base.update_query_dict({"options": f"-csearch_path={schema}"})
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def clear_tables(engine: Engine) -> None:
    """Delete every row of Minder's tables (the schema and its revision stay)."""
    with engine.begin() as connection:
        for table in reversed(Base.metadata.sorted_tables):
            connection.execute(delete(table))


Backend = Literal["sqlite", "postgresql"]
BACKENDS: tuple[Backend, ...] = ("sqlite", "postgresql")


@contextmanager
def scratch_database(
    backend: Backend, directory: Path, *, migrate: bool = True
) -> Iterator[Engine]:
    """A new, empty database on ``backend`` (a file in ``directory``, or a temporary PostgreSQL
    schema), migrated to head unless ``migrate`` is false; disposed (and dropped) at exit.

    Check :func:`postgres_unavailable` first: this raises when the server cannot be reached.
    """
    if backend == "sqlite":
        engine = create_engine_for(f"sqlite:///{directory / f'minder-{uuid.uuid4().hex[:8]}.db'}")
        try:
            if migrate:
                upgrade_database(engine)
            yield engine
        finally:
            engine.dispose()
        return
    with temporary_postgres_schema() as url:
        engine = create_engine_for(url)
        try:
            if migrate:
                upgrade_database(engine)
            yield engine
        finally:
            engine.dispose()
