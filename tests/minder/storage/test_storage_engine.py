"""Engine configuration: URL normalisation, SQLite pragmas, sharing a file DB across threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.storage import (
    create_engine_for,
    database_status,
    list_alerts,
    normalise_url,
    record_alert,
    session_factory,
    set_alert_status,
    upgrade_database,
)


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u:p@db:5432/minder", "postgresql+psycopg"),
        ("postgres://u@db/minder", "postgresql+psycopg"),
        ("postgresql+psycopg://u@db/minder", "postgresql+psycopg"),
        ("sqlite:///minder.db", "sqlite"),
    ],
)
def test_normalise_url_sends_postgresql_to_psycopg3(url: str, driver: str) -> None:
    parsed = normalise_url(url)
    assert parsed.drivername == driver
    assert parsed.database is not None and parsed.database.endswith(("minder", "minder.db"))


def test_invalid_url_is_refused_by_scheme_without_password() -> None:
    with pytest.raises(ValidationError, match="not a valid SQLAlchemy URL") as info:
        normalise_url("not a url:secret")
    assert "secret" not in str(info.value)


def test_sqlite_file_engine_uses_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 30_000
            assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        engine.dispose()


def test_sqlite_in_memory_engine_is_shared_and_migratable() -> None:
    engine = create_engine_for("sqlite://")
    try:
        upgrade_database(engine)
        assert database_status(session_factory(engine)) == {"database": True, "schema": True}
    finally:
        engine.dispose()


def test_unreachable_database_is_reported_not_raised(tmp_path: Path) -> None:
    # a directory is not a database file: connecting fails
    engine = create_engine_for(f"sqlite:///{tmp_path}")
    try:
        assert database_status(session_factory(engine)) == {"database": False, "schema": False}
    finally:
        engine.dispose()


def test_service_and_api_threads_share_a_sqlite_file(tmp_path: Path) -> None:
    """A writer thread (service) and a reader/PATCH thread (API) never see 'database is locked'."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'shared.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    errors: list[BaseException] = []
    n = 40

    def service() -> None:
        try:
            for i in range(n):
                alert = Alert(
                    job="j",
                    machine=f"m{i}",
                    kind=AlertKind.SIMILARITY,
                    metric="gpu_util_ratio",
                    score=float(i),
                    first_ts=float(i),
                    detected_ts=float(i),
                )
                with sessions.begin() as session:
                    record_alert(session, alert)
                    record_alert(session, alert, seen_ts=i + 1.0)
        except BaseException as exc:
            errors.append(exc)

    def api() -> None:
        try:
            done, deadline = 0, time.monotonic() + 30
            while done < n and not errors and time.monotonic() < deadline:
                with sessions.begin() as session:
                    alerts, _ = list_alerts(session, status=AlertStatus.OPEN, limit=500)
                    for alert in alerts:
                        set_alert_status(session, alert.id, AlertStatus.ACKNOWLEDGED)
                with sessions() as session:
                    done = list_alerts(session, status="acknowledged", limit=1)[1]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=service), threading.Thread(target=api)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    engine.dispose()
    assert not errors, errors
    assert all(not thread.is_alive() for thread in threads)
    with sessions() as session:
        assert list_alerts(session, status="acknowledged", limit=1)[1] == n


def test_an_open_read_only_session_does_not_block_writers_on_sqlite(tmp_path) -> None:
    import time

    from minder.storage import create_engine_for, session_factory, upgrade_database
    from minder.storage.engine import read_only
    from minder.storage.jobs import list_jobs, upsert_job_machines

    engine = create_engine_for(f"sqlite:///{tmp_path / 'ro.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    reader = read_only(sessions())
    list_jobs(reader)  # a read transaction stays open, like an API request in flight
    began = time.monotonic()
    with sessions.begin() as writer:
        upsert_job_machines(writer, "j", [{"name": "n1"}], 1.0)
    assert time.monotonic() - began < 1.0
    reader.close()
