"""Fixtures of the fault suite: a real broker per module and the service under test
(:mod:`fault_harness`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_harness import FaultService, Figures, broker_unavailable

from minder.stream import EmbeddedBroker


def _running_broker() -> Iterator[EmbeddedBroker]:
    reason = broker_unavailable()
    if reason is not None:
        pytest.skip(f"no embedded Kafka broker: {reason}")
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """The module's broker, shared by its cases (each has topics and a group of its own)."""
    yield from _running_broker()


@pytest.fixture
def own_broker() -> Iterator[EmbeddedBroker]:
    """A broker of one case only, which it may stop and start."""
    yield from _running_broker()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node.nodeid)


@pytest.fixture
def make_service(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Callable[..., FaultService]]:
    """``make_service(actuator=None, **sections)``: a started service, its settings' sections
    overridden (``detection={...}``, ``api={...}``), its scheduler target replaced by
    ``actuator`` when given; stopped after the test."""
    made: list[FaultService] = []

    def make(actuator: object | None = None, **sections: dict[str, Any]) -> FaultService:
        directory = tmp_path / f"service-{len(made)}"
        directory.mkdir()
        service = FaultService(broker, directory, actuator, **sections)
        made.append(service)
        return service.start()

    yield make
    for service in made:
        service.close()
