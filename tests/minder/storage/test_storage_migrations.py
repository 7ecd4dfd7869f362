"""Alembic migrations create the schema the models describe, idempotently."""

from __future__ import annotations

import threading

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, delete, func, inspect, select, text

from minder.core.alert import Alert, AlertKind
from minder.core.hang import Culprit, CulpritReason, HangAnalysis
from minder.storage import (
    current_revisions,
    database_status,
    get_hang_analysis,
    get_job,
    head_revisions,
    list_alerts,
    list_job_findings,
    load_layout,
    record_alert,
    save_hang_analysis,
    save_job_findings,
    save_layout,
    schema_is_current,
    session_factory,
    sweep_jobs,
    upgrade_database,
)
from minder.storage.migrate import alembic_config
from minder.storage.models import Base

TABLES = {
    "alembic_version",
    "jobs",
    "machines",
    "machine_scores",
    "alerts",
    "whatif_reports",
    "outbox",
    "action_audit",
    "breakers",
    "job_settings",
    "wire_layouts",
    "job_findings",
    "job_hangs",
    "selfchecks",
}
HEAD = frozenset({"0008"})
NEW_IN_0003 = {"outbox", "action_audit", "breakers", "job_settings"}
NEW_IN_0004 = {"wire_layouts"}
NEW_IN_0005 = {"job_findings"}
NEW_IN_0006 = {"job_hangs"}
NEW_IN_0008 = {"selfchecks"}


def _job_before_0007(
    engine: Engine, job: str, ts: float, status: str = "active", machines: int = 1
) -> None:
    """A job with ``machines`` machines as a schema before 0007 stores it (no lifecycle
    columns), updated at wall time ``ts``."""
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO jobs (id, first_seen_ts, last_seen_ts, machine_count, status, "
                "updated_at) VALUES (:job, :ts, :ts, :n, :status, :ts)"
            ),
            {"job": job, "ts": ts, "n": machines, "status": status},
        )
        for i in range(machines):
            connection.execute(
                text(
                    'INSERT INTO machines (job, name, "group", domain) '
                    "VALUES (:job, :name, '', '')"
                ),
                {"job": job, "name": f"n{i + 1}"},
            )


def test_upgrade_creates_schema_and_second_upgrade_is_a_no_op(empty_engine: Engine) -> None:
    assert current_revisions(empty_engine) == frozenset()
    assert not schema_is_current(empty_engine)

    upgrade_database(empty_engine)
    assert set(inspect(empty_engine).get_table_names()) >= TABLES
    assert current_revisions(empty_engine) == head_revisions() == HEAD
    assert schema_is_current(empty_engine)

    sessions = session_factory(empty_engine)
    alert = Alert(
        job="j",
        machine="m",
        kind=AlertKind.RULE,
        metric="gpu_xid_count",
        score=1.0,
        first_ts=10.0,
        detected_ts=10.0,
    )
    with sessions.begin() as session:
        record_alert(session, alert)
    upgrade_database(empty_engine)  # again: nothing to do, data kept
    assert current_revisions(empty_engine) == HEAD
    with sessions() as session:
        assert [a.id for a in list_alerts(session)[0]] == [alert.id]


def test_upgrade_from_url_string(empty_engine: Engine) -> None:
    url = empty_engine.url.render_as_string(hide_password=False)
    upgrade_database(url)
    assert schema_is_current(empty_engine)


def test_models_match_migrations(engine: Engine) -> None:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_downgrade_to_base_drops_tables(empty_engine: Engine) -> None:
    upgrade_database(empty_engine)
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "base")
    assert not (TABLES - {"alembic_version"}) & set(inspect(empty_engine).get_table_names())


def test_database_status_reports_missing_schema(empty_engine: Engine) -> None:
    sessions = session_factory(empty_engine)
    assert database_status(sessions) == {"database": True, "schema": False}
    upgrade_database(empty_engine)
    assert database_status(sessions) == {"database": True, "schema": True}


def test_concurrent_upgrades_do_not_collide(empty_engine: Engine) -> None:
    """The API and the service may both migrate at start-up."""
    url = empty_engine.url.render_as_string(hide_password=False)
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            upgrade_database(url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=upgrade) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert schema_is_current(empty_engine)


def test_whatif_reports_migration_upgrades_from_0001_and_downgrades_to_it(
    empty_engine: Engine,
) -> None:
    """A database made before what-if reports existed gains the table, keeping its alerts."""
    upgrade_database(empty_engine, "0001")
    assert "whatif_reports" not in inspect(empty_engine).get_table_names()
    sessions = session_factory(empty_engine)
    alert = Alert(
        job="j",
        machine="m",
        kind=AlertKind.RULE,
        metric="gpu_xid_count",
        score=1.0,
        first_ts=1.0,
        detected_ts=1.0,
    )
    with sessions.begin() as session:
        record_alert(session, alert)

    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    assert "whatif_reports" in inspect(empty_engine).get_table_names()
    with empty_engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []

    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")
    assert current_revisions(empty_engine) == frozenset({"0001"})
    tables = set(inspect(empty_engine).get_table_names())
    assert not tables & {
        "whatif_reports",
        *NEW_IN_0003,
        *NEW_IN_0004,
        *NEW_IN_0005,
        *NEW_IN_0006,
        *NEW_IN_0008,
    }
    assert (
        TABLES
        - {"whatif_reports", *NEW_IN_0003, *NEW_IN_0004, *NEW_IN_0005, *NEW_IN_0006, *NEW_IN_0008}
        <= tables
    )
    with sessions() as session:
        assert [a.id for a in list_alerts(session)[0]] == [alert.id]


def test_outbox_migration_downgrades_to_0002_keeping_alerts(empty_engine: Engine) -> None:
    upgrade_database(empty_engine)
    sessions = session_factory(empty_engine)
    alert = Alert(
        job="j", machine="m", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
        first_ts=1.0, detected_ts=1.0,
    )  # fmt: skip
    with sessions.begin() as session:
        record_alert(session, alert)
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    tables = set(inspect(empty_engine).get_table_names())
    assert (
        not tables & (NEW_IN_0003 | NEW_IN_0004 | NEW_IN_0005 | NEW_IN_0006 | NEW_IN_0008)
        and "whatif_reports" in tables
    )
    upgrade_database(empty_engine)
    assert set(inspect(empty_engine).get_table_names()) >= NEW_IN_0003
    with sessions() as session:
        assert [a.id for a in list_alerts(session)[0]] == [alert.id]


def test_wire_layouts_migration_downgrades_to_0003_and_upgrades_again(empty_engine: Engine) -> None:
    upgrade_database(empty_engine, "0003")
    assert "wire_layouts" not in inspect(empty_engine).get_table_names()
    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    sessions = session_factory(empty_engine)
    with sessions.begin() as session:
        assert save_layout(session, 2**64 - 1, {"metrics": ["cpu_util_ratio"]})
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
    tables = set(inspect(empty_engine).get_table_names())
    assert "wire_layouts" not in tables and tables >= NEW_IN_0003
    upgrade_database(empty_engine)
    with sessions() as session:
        assert load_layout(session, 2**64 - 1) is None  # the layouts went with the table


def test_job_findings_migration_upgrades_from_0004_keeping_jobs_and_downgrades(
    empty_engine: Engine,
) -> None:
    """A database of 0004 gains ``job_findings`` (its jobs kept, with no findings); the rows
    go with their job (ON DELETE CASCADE) and with the table on a downgrade."""
    upgrade_database(empty_engine, "0004")
    assert "job_findings" not in inspect(empty_engine).get_table_names()
    sessions = session_factory(empty_engine)
    _job_before_0007(empty_engine, "j", 10.0)
    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    finding = {"finding": "too_few_machines", "metric": None, "machines": 1, "since_ts": 10.0}
    with sessions.begin() as session:
        assert get_job(session, "j").finding_count == 0
        save_job_findings(session, "j", [finding], 11.0)
    with sessions() as session:
        assert [f.finding for f in list_job_findings(session, "j")] == ["too_few_machines"]
    with empty_engine.begin() as connection:
        foreign = inspect(connection).get_foreign_keys("job_findings")
        assert [(fk["referred_table"], fk["options"].get("ondelete")) for fk in foreign] == [
            ("jobs", "CASCADE")
        ]
        connection.execute(delete(Base.metadata.tables["jobs"]))
        assert connection.execute(select(func.count()).select_from(
            Base.metadata.tables["job_findings"])).scalar_one() == 0  # fmt: skip
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    tables = set(inspect(empty_engine).get_table_names())
    assert "job_findings" not in tables and "wire_layouts" in tables


def test_job_hangs_migration_upgrades_from_0005_keeping_jobs_and_downgrades(
    empty_engine: Engine,
) -> None:
    """A database of 0005 gains ``job_hangs`` (its jobs kept, with no analysis); the row goes
    with its job (ON DELETE CASCADE) and with the table on a downgrade."""
    upgrade_database(empty_engine, "0005")
    assert "job_hangs" not in inspect(empty_engine).get_table_names()
    sessions = session_factory(empty_engine)
    _job_before_0007(empty_engine, "j", 10.0)
    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    analysis = HangAnalysis(
        hung=True, culprits=(Culprit(1, CulpritReason.NO_DUMP, "n1"),), analysed_ts=11.0
    )
    with sessions.begin() as session:
        save_hang_analysis(session, "j", analysis, 12.0)
    with sessions() as session:
        assert get_hang_analysis(session, "j").analysis == analysis
    with empty_engine.begin() as connection:
        foreign = inspect(connection).get_foreign_keys("job_hangs")
        assert [(fk["referred_table"], fk["options"].get("ondelete")) for fk in foreign] == [
            ("jobs", "CASCADE")
        ]
        connection.execute(delete(Base.metadata.tables["jobs"]))
        assert connection.execute(select(func.count()).select_from(
            Base.metadata.tables["job_hangs"])).scalar_one() == 0  # fmt: skip
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0005")
    tables = set(inspect(empty_engine).get_table_names())
    assert "job_hangs" not in tables and "job_findings" in tables


def test_job_lifecycle_migration_keeps_jobs_and_makes_finished_ones_ended(
    empty_engine: Engine,
) -> None:
    """A database of 0006 gains the lifecycle columns: an active job stays active (its machines
    in it, its status since its last update, until the service ages it), a finished one is
    ended; a downgrade makes idle and ended jobs finished again."""
    upgrade_database(empty_engine, "0006")
    _job_before_0007(empty_engine, "running", 10.0, machines=2)
    _job_before_0007(empty_engine, "done", 20.0, status="finished")
    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    with empty_engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    sessions = session_factory(empty_engine)
    with sessions() as session:
        running, done = get_job(session, "running"), get_job(session, "done")
    assert (running.status, running.active_machines, running.status_since) == ("active", 2, 10.0)
    assert (done.status, done.active_machines, done.status_since) == ("ended", 0, 20.0)
    assert done.status_reason == "finished"
    with sessions.begin() as session:
        # no word from a worker since the job's last update: idle (a restart of the service)
        assert sweep_jobs(session, 100.0, stale_after_s=60, retention_s=3600) == (["running"], [])
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0006")
    with empty_engine.connect() as connection:
        assert "active_machines" not in {c["name"] for c in inspect(connection).get_columns("jobs")}
        rows = connection.execute(text("SELECT id, status FROM jobs ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("done", "finished"), ("running", "finished")]


def test_selfchecks_migration_upgrades_from_0007_keeping_alerts_and_downgrades(
    empty_engine: Engine,
) -> None:
    """0008 adds ``selfchecks`` beside the alerts it answers; a downgrade drops it and keeps
    the alerts (a self-check's verdict stays in their evidence)."""
    upgrade_database(empty_engine, "0007")
    sessions = session_factory(empty_engine)
    alert = Alert(job="j", machine="m", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                  first_ts=1.0, detected_ts=2.0)  # fmt: skip
    with sessions.begin() as session:
        record_alert(session, alert)
    upgrade_database(empty_engine)
    assert current_revisions(empty_engine) == HEAD
    with empty_engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    with empty_engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "0007")
    tables = set(inspect(empty_engine).get_table_names())
    assert "selfchecks" not in tables and "alerts" in tables
    with sessions() as session:
        assert [a.id for a in list_alerts(session)[0]] == [alert.id]
