"""Minder's errors as HTTP errors."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from minder.api.deps import ApiContext
from minder.api.schemas import TransitionProblem
from minder.core.errors import MinderError, NotFoundError, ValidationError
from minder.core.selfcheck import SelfCheckConflictError, SelfCheckTokenError
from minder.storage import StatusTransitionError

logger = logging.getLogger(__name__)


def _transition(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StatusTransitionError)
    body = TransitionProblem(
        detail=str(exc), current=exc.current, requested=exc.requested, allowed=exc.allowed
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=409)


def _shown(request: Request, exc: Exception) -> str:
    """The error's message as clients see it: server paths relative to the what-if roots."""
    context: ApiContext | None = getattr(request.app.state, "minder", None)
    return str(exc) if context is None else context.whatif.relative(str(exc))


def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": _shown(request, exc)}, status_code=404)


def _invalid(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": _shown(request, exc)}, status_code=422)


def _check_token(request: Request, exc: Exception) -> JSONResponse:
    # the message names the check, never the token
    return JSONResponse(
        {"detail": _shown(request, exc)},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )


def _conflict(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": _shown(request, exc)}, status_code=409)


def _internal(request: Request, exc: Exception) -> JSONResponse:
    logger.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return JSONResponse({"detail": _shown(request, exc)}, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    """404 for a missing entity, 409 for a forbidden transition or a self-check that takes no
    report (or request) now, 401 for a self-check report without its check's token, 422 for bad
    input."""
    # Starlette picks the handler of the most specific class in the exception's MRO
    app.add_exception_handler(StatusTransitionError, _transition)
    app.add_exception_handler(SelfCheckTokenError, _check_token)
    app.add_exception_handler(SelfCheckConflictError, _conflict)
    app.add_exception_handler(NotFoundError, _not_found)
    app.add_exception_handler(ValidationError, _invalid)
    app.add_exception_handler(MinderError, _internal)
