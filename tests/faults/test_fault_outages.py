"""Outages of what the service depends on: PostgreSQL for 30 s mid-stream, and a broker restart.
Alerts raised meanwhile are retried until stored, none is lost, and consumption goes on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fault_harness import (
    FAULTY,
    HEALTHY,
    HEALTHY_PARTITION,
    PARTITIONS,
    FaultService,
    Figures,
    wait_until,
)
from sqlalchemy.engine import make_url
from tcp_proxy import CuttableProxy

from minder.storage.testing import postgres_unavailable, temporary_postgres_schema
from minder.stream import EmbeddedBroker, ensure_topics

OUTAGE_S = 30.0


@pytest.fixture
def proxied_postgres() -> Iterator[tuple[str, CuttableProxy]]:
    """A throw-away schema on the test PostgreSQL, reached through a proxy the test can cut."""
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with temporary_postgres_schema() as url:
        proxy = CuttableProxy((url.host or "127.0.0.1", url.port or 5432)).start()
        try:
            proxied = make_url(url.render_as_string(hide_password=False)).set(
                host="127.0.0.1", port=proxy.port
            )
            yield proxied.render_as_string(hide_password=False), proxy
        finally:
            proxy.close()


def stored_alerts(service: FaultService) -> list[dict[str, Any]]:
    answer = httpx.get(f"{service.api}/api/v1/alerts", params={"job": HEALTHY}, timeout=10)
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.slow
def test_a_30_s_postgresql_outage_mid_stream_loses_no_alert(
    make_service: Any, figures: Figures, proxied_postgres: tuple[str, CuttableProxy]
) -> None:
    url, proxy = proxied_postgres
    service: FaultService = make_service(database={"url": url})
    service.warm_up()
    proxy.cut()
    cut_at = time.monotonic()
    healthy = service.fault_then_alert(figures, timeout_s=OUTAGE_S - 5)
    consumed = service.consumed(HEALTHY_PARTITION)
    figures.record("healthy partition consumed during the outage", float(consumed), "bool")
    assert healthy.on_time(), healthy
    assert consumed
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
    proxy.restore()
    stored = wait_until(lambda: len(stored_alerts(service)) >= 1, 60)
    figures.record("alert stored after the database came back", stored, "s")
    assert stored is not None, "the alert raised during the outage was never stored"
    time.sleep(2.0)  # a second store of the same alert would show now
    [alert] = stored_alerts(service)
    assert alert["machine"] == FAULTY


@pytest.mark.kafka
@pytest.mark.slow
def test_a_broker_restart_mid_stream_and_the_alert_after_it_is_on_time(
    own_broker: EmbeddedBroker, tmp_path: Path, figures: Figures
) -> None:
    service = FaultService(own_broker, tmp_path).start()
    try:
        service.warm_up()
        own_broker.stop()
        time.sleep(2.0)
        own_broker.start()  # empty: no topic, no message, no committed offset
        ensure_topics(
            own_broker.bootstrap, {service.topic: PARTITIONS, service.deadletter_topic: 1}
        )
        service.broker_restarted()
        # The rest of the job, its fault included, into the restarted broker's fresh
        # partitions (offsets from 0 again, below the worker's position before the restart).
        healthy = service.fault_then_alert(figures, timeout_s=60)
        assert healthy.on_time(), healthy
    finally:
        service.close()
