"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import APIRouter, FastAPI
from prometheus_client import REGISTRY, CollectorRegistry

from minder import __version__
from minder.api.deps import ApiContext
from minder.api.errors import install_error_handlers
from minder.api.routes import alerts, health, jobs, metrics
from minder.storage import SessionFactory

API_PREFIX = "/api/v1"


def create_app(
    session_factory: SessionFactory,
    *,
    registry: CollectorRegistry | None = None,
    readiness: Callable[[], Mapping[str, bool]] | None = None,
    api_token: str | None = None,
    title: str = "Minder",
    version: str = __version__,
) -> FastAPI:
    """The HTTP API of Minder, under ``/api/v1``, plus ``/metrics``.

    Parameters
    ----------
    session_factory
        Opens the session of each request (:func:`minder.storage.session_factory`); the schema
        must be migrated (``/ready`` says so when it is not).
    registry
        What ``/metrics`` exposes; the process-wide default registry when not given.
    readiness
        Extra checks for ``/ready`` (e.g. ``{"kafka": True, "detector": True}``); it may be
        called from several threads at once, and an exception counts as not ready.
    api_token
        When set (non-empty), mutating endpoints need ``Authorization: Bearer <api_token>``.
    """
    app = FastAPI(
        title=title,
        version=version,
        description="Faulty-machine detection for large GPU training jobs: jobs, scores, alerts.",
    )
    app.state.minder = ApiContext(
        session_factory=session_factory,
        registry=registry if registry is not None else REGISTRY,
        readiness=readiness,
        api_token=api_token or None,
        version=version,
    )
    install_error_handlers(app)
    v1 = APIRouter(prefix=API_PREFIX)
    for router in (health.router, jobs.router, alerts.router, metrics.router):
        v1.include_router(router)
    app.include_router(v1)
    # Prometheus scrapes /metrics by convention; /api/v1/metrics is the same handler
    app.include_router(metrics.router)
    return app
