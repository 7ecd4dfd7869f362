"""Liveness and readiness."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from minder.api.deps import Context
from minder.api.schemas import Health, Readiness
from minder.storage import database_status

logger = logging.getLogger(__name__)

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness")
def health(context: Context) -> Health:
    """Always 200 while the process serves requests."""
    return Health(version=context.version)


@router.get(
    "/ready",
    response_model=Readiness,
    summary="Readiness",
    responses={503: {"model": Readiness, "description": "a check fails"}},
)
def ready(context: Context) -> JSONResponse:
    """200 when the database is reachable and migrated and every service check passes, else 503."""
    checks = database_status(context.session_factory)
    if context.readiness is not None:
        try:
            extra = dict(context.readiness())
        except Exception:
            logger.exception("readiness check raised")
            extra = {"readiness": False}
        checks.update({name: bool(ok) for name, ok in extra.items()})
    failing = sorted(name for name, ok in checks.items() if not ok)
    body = Readiness(ready=not failing, checks=checks, failing=failing)
    return JSONResponse(body.model_dump(), status_code=503 if failing else 200)
