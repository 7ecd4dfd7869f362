"""The what-if runner itself: queued analyses at shutdown, crashes, a full backlog (the API's
use of it: tests/minder/api/test_api_whatif.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from minder.core.errors import NotFoundError, ValidationError
from minder.service.whatif_runner import (
    AnalysisTask,
    RunnerBusyError,
    RunnerStoppedError,
    WhatIfMetrics,
    WhatIfRunner,
)
from minder.storage import SessionFactory, WhatIfStatus, get_report, session_factory
from minder.storage.testing import postgres_unavailable, scratch_database
from whatif import WhatIfReport, analyze_path

WIA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "bytedance-straggler-wia"
POLL_TIMEOUT_S = 60.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionFactory]:
    if request.param == "postgresql" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    with scratch_database(request.param, tmp_path) as engine:
        yield session_factory(engine)


def need(path: Path) -> Path:
    """``path``, or skip the test when the shared data is not next to the repository."""
    if not path.exists():
        pytest.skip(f"shared test data {path} is absent (expected ../shared/data beside the repo)")
    return path.resolve()


class _Gate:
    """An analysis that waits for a signal, then analyses the ST trace for real."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> WhatIfReport:
        self.started.set()
        assert self.release.wait(POLL_TIMEOUT_S)
        return analyze_path(*args, **kwargs)


def _task(report_id: str) -> AnalysisTask:
    return AnalysisTask(report_id=report_id, traces=(need(WIA / "trace-ST.parquet"),))


def test_shutdown_finishes_the_running_analysis_and_fails_the_queued_ones(
    sessions: SessionFactory,
) -> None:
    gate = _Gate()
    runner = WhatIfRunner(sessions, WhatIfMetrics.on(CollectorRegistry()), analyze=gate)
    runner.start()
    runner.submit(_task("running"), "test")
    runner.submit(_task("queued"), "test")
    assert gate.started.wait(POLL_TIMEOUT_S)
    stopper = threading.Thread(target=runner.shutdown)
    stopper.start()
    time.sleep(0.05)
    gate.release.set()
    stopper.join(POLL_TIMEOUT_S)

    with sessions() as session:
        assert get_report(session, "running").status is WhatIfStatus.DONE
        queued = get_report(session, "queued")
    assert queued.status is WhatIfStatus.FAILED
    assert queued.error is not None and "server stopped before the analysis ran" in queued.error

    with pytest.raises(RunnerStoppedError, match="shutting down"):
        runner.submit(_task("late"), "test")
    with sessions() as session:
        assert get_report(session, "late").status is WhatIfStatus.FAILED


def test_an_unexpected_crash_of_the_analysis_is_stored_as_a_failure(
    sessions: SessionFactory,
) -> None:
    def crash(*_args: Any, **_kwargs: Any) -> WhatIfReport:
        raise RuntimeError("out of coffee")

    runner = WhatIfRunner(sessions, WhatIfMetrics.on(CollectorRegistry()), analyze=crash)
    runner.start()
    runner.submit(_task("crash"), "test")
    runner.shutdown()
    with sessions() as session:
        record = get_report(session, "crash")
    assert record.status is WhatIfStatus.FAILED
    assert record.error == "internal error (RuntimeError): out of coffee"


def test_a_full_backlog_refuses_new_analyses_without_storing_them(
    sessions: SessionFactory,
) -> None:
    gate = _Gate()
    runner = WhatIfRunner(
        sessions, WhatIfMetrics.on(CollectorRegistry()), max_backlog=1, analyze=gate
    )
    runner.start()
    try:
        runner.submit(_task("first"), "test")
        with pytest.raises(RunnerBusyError, match="1 what-if analyses are running or waiting"):
            runner.submit(_task("second"), "test")
    finally:
        gate.release.set()
        runner.shutdown()
    with sessions() as session:
        assert get_report(session, "first").status is WhatIfStatus.DONE
        with pytest.raises(NotFoundError):
            get_report(session, "second")
    with pytest.raises(ValidationError, match="workers 5 out of range"):
        WhatIfRunner(sessions, WhatIfMetrics.on(CollectorRegistry()), workers=5)
