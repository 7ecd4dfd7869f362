"""Database fixtures: every test using ``engine``/``sessions`` runs on SQLite and PostgreSQL."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from minder.storage import SessionFactory, session_factory
from minder.storage.testing import clear_tables, postgres_unavailable, scratch_database


@functools.cache
def _postgres_unavailable() -> str | None:
    return postgres_unavailable()


BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _skip_unless_available(backend: str) -> None:
    if backend == "postgresql" and (reason := _postgres_unavailable()):
        pytest.skip(reason)


@pytest.fixture(scope="session", params=BACKENDS)
def migrated_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """One migrated database per backend for the whole run (emptied after each test)."""
    _skip_unless_available(request.param)
    with scratch_database(request.param, tmp_path_factory.mktemp("db")) as engine:
        yield engine


@pytest.fixture
def engine(migrated_engine: Engine) -> Iterator[Engine]:
    yield migrated_engine
    clear_tables(migrated_engine)


@pytest.fixture
def sessions(engine: Engine) -> SessionFactory:
    return session_factory(engine)


@pytest.fixture(params=BACKENDS)
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A new database that was never migrated."""
    _skip_unless_available(request.param)
    with scratch_database(request.param, tmp_path, migrate=False) as engine:
        yield engine
