"""Fixtures of the service tests: a real Tansu broker and a database of each backend."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from minder.storage.testing import postgres_unavailable, temporary_postgres_schema

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from minder.stream import EmbeddedBroker


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'minder.db'}"
        return
    reason = postgres_unavailable()
    if reason is not None:
        pytest.skip(f"PostgreSQL is not reachable: {reason}")
    with temporary_postgres_schema() as url:
        yield url.render_as_string(hide_password=False)
