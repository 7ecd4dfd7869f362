"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.concurrency import run_in_threadpool

from minder import __version__
from minder.api.deps import ApiContext, WhatIfContext
from minder.api.errors import install_error_handlers
from minder.api.routes import actions, alerts, deliveries, health, jobs, metrics, whatif
from minder.api.whatif_inputs import ScratchSpace
from minder.api.whatif_runner import WhatIfMetrics, WhatIfRunner
from minder.core.errors import ValidationError
from minder.storage import SessionFactory
from minder.storage.outbox import Destination

API_PREFIX = "/api/v1"

DOCS_ASSETS_URL = "/docs-assets"
"""Where the Swagger UI and ReDoc scripts and styles of ``/docs`` and ``/redoc`` are served."""

DEFAULT_MAX_UPLOAD_BYTES = 512 * 1024 * 1024
"""Largest what-if upload (request body) accepted by default: 512 MiB."""


def create_app(
    session_factory: SessionFactory,
    *,
    registry: CollectorRegistry | None = None,
    readiness: Callable[[], Mapping[str, bool]] | None = None,
    api_token: str | None = None,
    whatif_roots: Sequence[Path] | None = None,
    whatif_workdir: Path | None = None,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    whatif_workers: int = 1,
    title: str = "Minder",
    version: str = __version__,
    destinations: Sequence[Destination] = (),
    on_enqueued: Callable[[], None] | None = None,
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
    whatif_roots
        Directories whose files ``POST /api/v1/whatif`` with ``{"path": …}`` may analyse;
        ``None`` (the default) refuses server paths (403), leaving uploads only.
    whatif_workdir
        Where uploaded traces wait for their analysis (removed after it); a temporary directory,
        removed at shutdown, when not given.
    max_upload_bytes
        Largest what-if upload request accepted (413 beyond).
    whatif_workers
        What-if analyses run at once (1..4), on threads of the app's own pool, started with the
        app and stopped at its shutdown (queued analyses are then stored as failed).
    destinations
        Where alert status changes go (the outbox destinations of the service).
    on_enqueued
        Called after a request wrote outbox rows (wakes the delivery workers).

    Raises
    ------
    ValidationError
        For a what-if root that is not a directory, or a non-positive ``max_upload_bytes``.
    """
    if max_upload_bytes <= 0:
        raise ValidationError(f"max_upload_bytes {max_upload_bytes}: expected a positive size")
    roots = None if whatif_roots is None else tuple(_checked_root(r) for r in whatif_roots)
    the_registry = registry if registry is not None else REGISTRY
    runner = WhatIfRunner(session_factory, WhatIfMetrics.on(the_registry), workers=whatif_workers)
    scratch = ScratchSpace(whatif_workdir)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        runner.start()
        try:
            yield
        finally:
            # waits for running analyses; queued ones are stored as failed
            await run_in_threadpool(runner.shutdown)
            scratch.close()

    # /docs and /redoc load Swagger UI and ReDoc from assets bundled in fastapi-offline, served
    # under DOCS_ASSETS_URL, not from a CDN: they work on a cluster without internet access
    app = FastAPIOffline(
        static_url=DOCS_ASSETS_URL,
        title=title,
        version=version,
        description="Faulty-machine detection for large GPU training jobs: jobs, scores, alerts, "
        "what-if straggler analyses.",
        lifespan=lifespan,
    )
    app.state.minder = ApiContext(
        session_factory=session_factory,
        registry=the_registry,
        readiness=readiness,
        api_token=api_token or None,
        version=version,
        whatif=WhatIfContext(
            runner=runner, roots=roots, scratch=scratch, max_upload_bytes=max_upload_bytes
        ),
        destinations=tuple(destinations),
        on_enqueued=on_enqueued,
    )
    # submissions work even when the server runs the app without its lifespan
    runner.start()
    install_error_handlers(app)
    v1 = APIRouter(prefix=API_PREFIX)
    for router in (
        health.router,
        jobs.router,
        alerts.router,
        deliveries.router,
        actions.router,
        whatif.router,
        metrics.router,
    ):
        v1.include_router(router)
    app.include_router(v1)
    # Prometheus scrapes /metrics, and probes ask /health and /ready, by convention; the
    # /api/v1 paths are the same handlers
    app.include_router(metrics.router)
    app.include_router(health.router)
    return app


def _checked_root(root: Path | str) -> Path:
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise ValidationError(f"what-if root {str(root)!r} is not a directory")
    return path
