"""What-if analyses of job traces: submit (upload or server path), poll one, list them."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import status as http_status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from minder.api.deps import (
    MUTATION_RESPONSES,
    Context,
    DbSession,
    Offset,
    WhatIfContext,
    require_token,
)
from minder.api.schemas import (
    InvalidInput,
    Problem,
    WhatIfAccepted,
    WhatIfPage,
    WhatIfPathRequest,
    WhatIfReportOut,
    WhatIfSummaryOut,
)
from minder.api.whatif_uploads import UploadTooLargeError, receive_upload
from minder.core.errors import ValidationError
from minder.service.whatif_inputs import ALLOWED_TYPES, PathNotAllowedError, resolve_server_inputs
from minder.service.whatif_runner import AnalysisTask, RunnerBusyError, RunnerStoppedError
from minder.storage import MAX_PAGE, WhatIfStatus, get_report, list_reports
from whatif import WhatIf

router = APIRouter(prefix="/whatif", tags=["whatif"])

TEXT_FIELDS = ("job", "what_ifs")
"""Text fields of an upload besides its files."""

JSON_BODY_MAX_BYTES = 64 * 1024
"""Largest ``{"path": …}`` body accepted."""

MAX_WHAT_IFS = 64
"""Most custom what-ifs one analysis may ask for."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such report"}
}

_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {
                            "type": "array",
                            "items": {"type": "string", "format": "binary"},
                            "description": f"the trace's files, any field name: {ALLOWED_TYPES}",
                        },
                        "job": {"type": "string", "description": "the job's name (optional)"},
                        "what_ifs": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "custom what-ifs, one per field (optional)",
                        },
                    },
                    "required": ["files"],
                }
            },
            "application/json": {"schema": WhatIfPathRequest.model_json_schema()},
        },
    }
}


@router.post(
    "",
    status_code=http_status.HTTP_202_ACCEPTED,
    response_model=WhatIfAccepted,
    dependencies=[Depends(require_token)],
    openapi_extra=_REQUEST_BODY,
    responses={
        **MUTATION_RESPONSES,
        403: {
            "model": Problem,
            "description": "changes disabled (no token, not open), a cross-origin request from "
            "an origin not allowed, server paths disabled, or a path outside the roots",
        },
        408: {"model": Problem, "description": "the request body stalled"},
        413: {"model": Problem, "description": "the upload is larger than the server accepts"},
        415: {"model": Problem, "description": "neither multipart/form-data nor JSON"},
        422: {
            "model": InvalidInput,
            "description": "unsupported file type, truncated upload, missing path, bad spec",
        },
        503: {"model": Problem, "description": "too many analyses waiting, or shutting down"},
    },
    summary="Submit a what-if analysis",
)
async def submit(request: Request, context: Context) -> JSONResponse:
    """Analyse a job trace in the background; answer 202 with the report's id and link.

    Send either the trace's files as ``multipart/form-data`` (one canonical ``.parquet`` trace
    with an optional meta ``.yaml``, or the Kineto ``.json``/``.json.gz`` traces of the ranks;
    optional text fields ``job`` and ``what_ifs``, the latter repeated), or a JSON body
    ``{"path": …, "meta": …, "what_ifs": […], "job": …}`` naming files under the server's allowed
    roots. The report goes ``pending → running → done | failed``: poll ``links.self``.
    """
    whatif = context.whatif
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    report_id = uuid.uuid4().hex
    try:
        whatif.runner.check_capacity()  # before reading a body that may weigh 512 MiB
    except RunnerBusyError as exc:
        raise HTTPException(http_status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    if media == "multipart/form-data":
        task, source = await _from_upload(request, whatif, report_id)
    elif media == "application/json" or media.endswith("+json"):
        task, source = await _from_server_path(request, whatif, report_id)
    else:
        raise HTTPException(
            http_status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"content type {media or 'none'!r} is not accepted: send multipart/form-data (the "
            'trace files) or application/json ({"path": …})',
        )
    try:
        summary = await run_in_threadpool(whatif.runner.submit, task, source)
    except (RunnerBusyError, RunnerStoppedError) as exc:
        _remove(task.scratch)
        raise HTTPException(http_status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
    except BaseException:
        _remove(task.scratch)
        raise
    body = WhatIfAccepted.of(summary)
    return JSONResponse(
        body.model_dump(mode="json", by_alias=True),
        status_code=http_status.HTTP_202_ACCEPTED,
        headers={"Location": body.links.self_},
    )


async def _from_upload(
    request: Request, whatif: WhatIfContext, report_id: str
) -> tuple[AnalysisTask, str]:
    directory = await run_in_threadpool(whatif.scratch.directory_for, report_id)
    try:
        upload = await receive_upload(
            request.headers,
            request.stream(),
            directory,
            max_bytes=whatif.max_upload_bytes,
            text_fields=TEXT_FIELDS,
        )
        job = _single(upload.fields.get("job", []), "job")
        what_ifs = _checked_what_ifs(upload.fields.get("what_ifs", []))
    except UploadTooLargeError as exc:
        _remove(directory)
        raise HTTPException(http_status.HTTP_413_CONTENT_TOO_LARGE, str(exc)) from None
    except BaseException:
        _remove(directory)
        raise
    task = AnalysisTask(
        report_id=report_id,
        traces=upload.inputs.traces,
        meta=upload.inputs.meta,
        what_ifs=what_ifs,
        job=job,
        scratch=directory,
    )
    return task, f"{upload.inputs.describe('upload')} ({upload.size} bytes)"


async def _from_server_path(
    request: Request, whatif: WhatIfContext, report_id: str
) -> tuple[AnalysisTask, str]:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > JSON_BODY_MAX_BYTES:
            raise HTTPException(
                http_status.HTTP_413_CONTENT_TOO_LARGE,
                f"the JSON body is larger than {JSON_BODY_MAX_BYTES} bytes",
            )
    try:
        body = WhatIfPathRequest.model_validate_json(bytes(raw))
    except pydantic.ValidationError as exc:
        errors = [
            {**e, "loc": ("body", *e["loc"]), "input": _shown_input(e.get("input"))}
            for e in exc.errors(include_url=False)
        ]
        raise RequestValidationError(errors) from None
    try:
        inputs = await run_in_threadpool(resolve_server_inputs, body.path, body.meta, whatif.roots)
    except PathNotAllowedError as exc:
        raise HTTPException(http_status.HTTP_403_FORBIDDEN, whatif.relative(str(exc))) from None
    task = AnalysisTask(
        report_id=report_id,
        traces=inputs.traces,
        meta=inputs.meta,
        what_ifs=_checked_what_ifs(body.what_ifs),
        job=body.job,
    )
    # server files by their path under their root, as error messages name them
    return task, whatif.relative(inputs.describe("path", full_paths=True))


def _shown_input(value: object) -> object:
    """A rejected input as the 422 answer shows it: a body that is not JSON (raw bytes, maybe
    not UTF-8) as text, cut to 200 characters."""
    if not isinstance(value, bytes):
        return value
    text = value[:200].decode("utf-8", "replace")
    return text + ("…" if len(value) > 200 else "")


def _single(values: list[str], name: str) -> str | None:
    if not values:
        return None
    if len(values) > 1 or not values[0] or len(values[0]) > 255:
        raise ValidationError(f"form field {name!r} must be given once, 1..255 characters")
    return values[0]


def _checked_what_ifs(specs: list[str]) -> tuple[str, ...]:
    """The specs, each parsed once so a malformed one is refused now (422), not after queuing."""
    if len(specs) > MAX_WHAT_IFS:
        raise ValidationError(f"{len(specs)} what-ifs given: at most {MAX_WHAT_IFS}")
    for spec in specs:
        WhatIf.parse(spec)
    return tuple(specs)


def _remove(directory: Path | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@router.get("", response_model=WhatIfPage, summary="List what-if reports")
def reports(
    session: DbSession,
    job: str | None = None,
    status: WhatIfStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> WhatIfPage:
    """Reports (without their bodies), newest submitted first, with the total for paging."""
    items, total = list_reports(session, job=job, status=status, limit=limit, offset=offset)
    return WhatIfPage(
        items=[WhatIfSummaryOut.of(item) for item in items],
        total=total,
        limit=limit,
        offset=offset,
    )


@router.get(
    "/{report_id}",
    response_model=WhatIfReportOut,
    responses=_NOT_FOUND,
    summary="Get a what-if report",
)
def report(report_id: str, session: DbSession) -> WhatIfReportOut:
    """A report's status, its body (docs/architecture.md §3.5) once done, its error once failed."""
    return WhatIfReportOut.of_record(get_report(session, report_id))
