"""The FastAPI application factory."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi_offline import FastAPIOffline
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.concurrency import run_in_threadpool

from minder import __version__
from minder.api.deps import READ_RESPONSES, ApiContext, WhatIfContext, require_read_access
from minder.api.errors import install_error_handlers
from minder.api.routes import (
    actions,
    alerts,
    deliveries,
    health,
    jobs,
    metrics,
    selfchecks,
    whatif,
)
from minder.api.security import (
    DEFAULT_BODY_MIN_RATE,
    DEFAULT_BODY_TIMEOUT_S,
    install_http_guards,
)
from minder.core.errors import ValidationError
from minder.service.whatif_inputs import ScratchSpace
from minder.service.whatif_runner import WhatIfMetrics, WhatIfRunner
from minder.storage import SessionFactory
from minder.storage.outbox import Destination

logger = logging.getLogger(__name__)

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
    open_access: bool = False,
    open_reads: bool = False,
    allowed_hosts: Sequence[str] | None = None,
    cors_origins: Sequence[str] = (),
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    body_min_rate: int = DEFAULT_BODY_MIN_RATE,
    whatif_roots: Sequence[Path] | None = None,
    whatif_workdir: Path | None = None,
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    whatif_workers: int = 1,
    title: str = "Minder",
    version: str = __version__,
    destinations: Sequence[Destination] = (),
    on_enqueued: Callable[[], None] | None = None,
    selfcheck_wake: Callable[[], None] | None = None,
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
        When set (non-empty), mutating endpoints and the ``/api/v1`` reads need
        ``Authorization: Bearer <api_token>`` (``/health``, ``/ready``, ``/metrics``, at the
        root and under ``/api/v1``, and the docs do not); when not, changes are refused (403)
        unless ``open_access``, and reads are served to loopback clients only (403 to others)
        unless ``open_reads``.
    open_access
        Without a token, let anyone change alerts, the breaker and job settings, submit
        what-if analyses and read (logged as a warning); refused together with a token.
    open_reads
        Without a token, serve the reads to any client; refused together with a token.
    allowed_hosts
        Host header values accepted (``*.example.org`` wildcards); another gets 400 (against
        DNS rebinding). ``None``: any.
    cors_origins
        Browser origins allowed cross-origin requests; none by default, and a change from an
        origin neither allowed nor the API's own is refused (403).
    body_timeout_s
        A request body that sends nothing for this long gets 408 and its connection closed.
    body_min_rate
        Bytes per second a request body must average after its first ``body_timeout_s``
        seconds (408 otherwise).
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
    selfcheck_wake
        Called after a request changed a self-check (a node's report, an operator's request or
        cancel): wakes the service's self-check loop to act on it at once.

    Raises
    ------
    ValidationError
        For a what-if root that is not a directory, a non-positive ``max_upload_bytes`` or
        ``body_timeout_s``, a bad host pattern, or contradictory access options (a token with
        ``open_access`` or ``open_reads``).
    """
    token = api_token or None
    if token is not None and open_access:
        raise ValidationError(
            "an API token and open access were both given: expected one of them (the token "
            "restricts changes to its holders, open access lets anyone change)"
        )
    if token is not None and open_reads:
        raise ValidationError(
            "an API token and open reads were both given: expected one of them (with a token "
            "every read needs it, open reads serve them to anyone)"
        )
    if max_upload_bytes <= 0:
        raise ValidationError(f"max_upload_bytes {max_upload_bytes}: expected a positive size")
    roots = None if whatif_roots is None else tuple(_checked_root(r) for r in whatif_roots)
    shown_roots = _shown_roots(whatif_roots or (), roots or ())
    the_registry = registry if registry is not None else REGISTRY
    runner = WhatIfRunner(
        session_factory,
        WhatIfMetrics.on(the_registry),
        workers=whatif_workers,
        shown_roots=shown_roots,
    )
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
    install_http_guards(
        app,
        allowed_hosts=allowed_hosts,
        cors_origins=cors_origins,
        body_timeout_s=body_timeout_s,
        body_min_rate=body_min_rate,
        api_token=token,
        open_access=open_access,
    )
    app.state.minder = ApiContext(
        session_factory=session_factory,
        registry=the_registry,
        readiness=readiness,
        api_token=token,
        version=version,
        whatif=WhatIfContext(
            runner=runner,
            roots=roots,
            scratch=scratch,
            max_upload_bytes=max_upload_bytes,
            shown_roots=shown_roots,
        ),
        destinations=tuple(destinations),
        on_enqueued=on_enqueued,
        selfcheck_wake=selfcheck_wake,
        open_access=open_access,
        open_reads=open_access or open_reads,
        cors_origins=tuple(cors_origins),
    )
    _log_access(token, open_access=open_access, open_reads=open_reads)
    # submissions work even when the server runs the app without its lifespan
    runner.start()
    install_error_handlers(app)
    v1 = APIRouter(prefix=API_PREFIX)
    resources = (
        jobs.router,
        alerts.router,
        deliveries.router,
        actions.router,
        whatif.router,
        selfchecks.router,
    )
    for router in resources:
        # reads need the token when there is one, else a loopback client or open reads
        v1.include_router(
            router, dependencies=[Depends(require_read_access)], responses=READ_RESPONSES
        )
    # a node's self-check report: its check's own token, not the API token
    v1.include_router(selfchecks.report_router)
    for router in (health.router, metrics.router):  # open to probes and scrapers, always
        v1.include_router(router)
    app.include_router(v1)
    # Prometheus scrapes /metrics, and probes ask /health and /ready, by convention; the
    # /api/v1 paths are the same handlers
    app.include_router(metrics.router)
    app.include_router(health.router)
    return app


def _log_access(token: str | None, *, open_access: bool, open_reads: bool) -> None:
    if open_access:
        logger.warning(
            "the API is open (MINDER_API__OPEN=true): anyone who can reach it may read, change "
            "alerts, the actions breaker and job settings, and submit what-if analyses; set "
            "MINDER_API__TOKEN instead outside a trial"
        )
    elif token is None:
        readers = (
            "any client (MINDER_API__OPEN_READS=true)"
            if open_reads
            else "loopback clients only (403 to others)"
        )
        logger.info(
            "the API has no token (MINDER_API__TOKEN): it serves reads to %s and refuses "
            "changes (403)",
            readers,
        )
    else:
        logger.info("the API's changes and reads need the bearer token (MINDER_API__TOKEN)")


def _shown_roots(configured: Sequence[Path], resolved: Sequence[Path]) -> tuple[Path, ...]:
    """Each root as configured (absolute) and resolved: the forms error messages may hold."""
    forms = {Path(root).expanduser().absolute() for root in configured} | set(resolved)
    return tuple(sorted(forms))


def _checked_root(root: Path | str) -> Path:
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise ValidationError(f"what-if root {str(root)!r} is not a directory")
    return path
