"""The service's API thread: bounded by the open-file limit before anything starts, and an end
of it while the service runs is reported (``minder serve`` then exits non-zero)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from service_settings import isolated_settings

from minder.core.errors import MinderError
from minder.service.stack import build_stack
from minder.stream import EmbeddedBroker

pytestmark = [pytest.mark.kafka]


def test_the_api_thread_ending_is_reported_until_the_stack_stops(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = isolated_settings(broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}")
    stack = build_stack(settings, registry=CollectorRegistry())
    try:
        stack.start()
        assert stack.api_failure() is None
        assert httpx.get(f"{stack.api_url}/health", timeout=10).status_code == 200
        assert stack.server is not None
        stack.server.should_exit = True  # its server stops without the stack stopping
        deadline = time.monotonic() + 15
        while stack.api_failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stack.api_failure() == "its server stopped on its own"
    finally:
        stack.stop()
    assert stack.api_failure() is None  # stopping is no failure


def test_a_connection_bound_past_the_file_limit_stops_the_start_at_once(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit to exceed")
    settings = isolated_settings(broker.bootstrap, f"sqlite:///{tmp_path / 'minder.db'}")
    settings.api.max_connections = soft
    stack = build_stack(settings, registry=CollectorRegistry())
    try:
        with pytest.raises(MinderError, match=f"API max connections {soft} .*MAX_CONNECTIONS"):
            stack.start()
        assert stack.server is None
    finally:
        stack.stop()
