"""API fixtures: every test using ``sessions``/``client`` runs on SQLite and PostgreSQL.

The ``client`` serves an app with the API token :data:`TOKEN` and sends it with every request
(the API refuses changes without a token unless it is open).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from api_testing import AUTH, TOKEN
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine

from minder.api import create_app
from minder.storage import SessionFactory, session_factory
from minder.storage.testing import clear_tables, postgres_unavailable, scratch_database


@functools.cache
def _postgres_unavailable() -> str | None:
    return postgres_unavailable()


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session", params=BACKENDS)
def migrated_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """One migrated database per backend for the whole run (emptied after each test)."""
    if request.param == "postgresql" and (reason := _postgres_unavailable()):
        pytest.skip(reason)
    with scratch_database(request.param, tmp_path_factory.mktemp("db")) as engine:
        yield engine


@pytest.fixture
def sessions(migrated_engine: Engine) -> Iterator[SessionFactory]:
    yield session_factory(migrated_engine)
    clear_tables(migrated_engine)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def client(sessions: SessionFactory, registry: CollectorRegistry) -> Iterator[TestClient]:
    app = create_app(sessions, registry=registry, api_token=TOKEN)
    with TestClient(app, headers=AUTH) as test_client:
        yield test_client
