"""Engines and sessions for SQLite (development, single node) and PostgreSQL (production)."""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from minder.core.errors import ValidationError

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 30.0
"""How long a SQLite writer waits for another one before giving up ("database is locked")."""

SessionFactory = sessionmaker[Session]
"""What :func:`session_factory` returns and what the API app factory takes."""

_POSTGRES_ALIASES = frozenset({"postgresql", "postgres"})


def normalise_url(url: str | URL) -> URL:
    """Parse a database URL, sending bare PostgreSQL URLs to the psycopg 3 driver.

    ``postgresql://`` and ``postgres://`` become ``postgresql+psycopg://`` (psycopg 3 is the
    driver Minder installs; SQLAlchemy's default would be psycopg2).

    Raises
    ------
    ValidationError
        When ``url`` is not a SQLAlchemy URL.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        # The message names the URL, which may hold a password: name only its scheme.
        scheme = str(url).split(":", 1)[0]
        raise ValidationError(
            f"database URL with scheme {scheme!r} is not a valid SQLAlchemy URL: expected "
            "e.g. 'sqlite:///minder.db' or 'postgresql+psycopg://user@host:5432/db'"
        ) from None
    if parsed.drivername in _POSTGRES_ALIASES:
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _is_sqlite_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url)


def create_engine_for(url: str | URL, echo: bool = False) -> Engine:
    """An engine for ``url``, configured so the API thread and the service thread can share it.

    SQLite: WAL journal (readers do not block the writer), a busy timeout, connections usable from
    any thread, foreign keys on, and every transaction opened with ``BEGIN IMMEDIATE`` so that a
    read-then-write transaction (alert dedup) waits for the write lock up front instead of failing
    with ``SQLITE_BUSY`` half-way. An in-memory database uses one shared connection.

    PostgreSQL: psycopg 3, connections checked before use (a restarted server does not break
    the first request after it).
    """
    parsed = normalise_url(url)
    if parsed.get_backend_name() != "sqlite":
        return _sa_create_engine(parsed, echo=echo, pool_pre_ping=True)

    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
    }
    memory = _is_sqlite_memory(parsed)
    if memory:
        kwargs["poolclass"] = StaticPool
    engine = _sa_create_engine(parsed, echo=echo, **kwargs)
    _configure_sqlite(engine, wal=not memory)
    return engine


def _configure_sqlite(engine: Engine, *, wal: bool) -> None:
    # pysqlite opens transactions lazily and on its own terms, which breaks SAVEPOINT and makes
    # the lock upgrade of a read-then-write transaction fail without waiting: take over BEGIN
    # (the SQLAlchemy "pysqlite serializable" recipe), with IMMEDIATE so writers queue politely.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if wal:
                _enable_wal(cursor)
                # WAL makes NORMAL durable against application crashes, and much cheaper.
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Read-only sessions (see read_only) begin DEFERRED, so an open read never holds the
        # write lock the detection loop is waiting for.
        mode = connection.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
        connection.exec_driver_sql(f"BEGIN {mode}")


def _enable_wal(cursor: Any) -> None:
    # WAL is a property of the database file, set once for every later connection. Switching to it
    # needs an exclusive lock for which SQLite does not wait on the busy handler: processes that
    # open a new database at once (API and service migrating at start-up) can see "database is
    # locked" here. Retry within the busy timeout, and skip the switch once the file is in WAL.
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.2)


BEGIN_OPTION = "minder_sqlite_begin"
"""Execution option naming how a SQLite transaction begins (``IMMEDIATE`` unless told)."""


def read_only(session: Session) -> Session:
    """Mark ``session`` as read-only before its first statement.

    On SQLite its transaction then begins ``DEFERRED``: readers no longer queue behind, or block,
    writers (WAL). Other databases ignore the option.
    """
    session.connection(execution_options={BEGIN_OPTION: "DEFERRED"})
    return session


def session_factory(engine: Engine) -> SessionFactory:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)
