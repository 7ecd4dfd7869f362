"""What the operator commands (``minder alerts``, ``labels``, ``actions``, ``breaker``) share:
their connection options (``--api``, ``--token``, ``--timeout``, ``--format``), :func:`connect`,
which turns an :class:`~minder.client.ApiError` into the CLI's one-line error, :func:`parse_time`
and the small formatters of their output. The client itself is :mod:`minder.client`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from minder.cli.common import OutputFormat, fail
from minder.client.api import (
    API_TOKEN_ENV,
    API_URL_ENV,
    SERVER_TOKEN_ENV,
    ApiError,
    MinderApi,
    one_line,
)

ApiUrlOption = Annotated[
    str,
    typer.Option(
        "--api",
        envvar=API_URL_ENV,
        help="URL of Minder's API",
        rich_help_panel="Connection",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=[API_TOKEN_ENV, SERVER_TOKEN_ENV],
        help="bearer token (the server's MINDER_API__TOKEN): changes need it, and reads when "
        "the server protects them",
        show_default=False,
        rich_help_panel="Connection",
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout", min=0.1, help="seconds to wait for the API", rich_help_panel="Connection"
    ),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="table or json")]


@contextmanager
def connect(url: str, token: str | None, timeout: float) -> Iterator[MinderApi]:
    """A client of the API at ``url``; an :class:`ApiError` inside exits 2 with its one line."""
    try:
        with MinderApi(url, token=token, timeout=timeout) as api:
            yield api
    except ApiError as exc:
        raise fail(exc) from None


_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(value: str, option: str, *, now: float | None = None) -> float:
    """Unix seconds from ``1717000000``, an ISO 8601 time (UTC unless it says) or ``2h`` (ago).

    Raises the CLI's one-line exit when ``value`` is none of those.
    """
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _AGO.match(text.lower())
    if match:
        reference = time.time() if now is None else now
        return reference - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise fail(
            f"{option} {one_line(value, 60)!r}: expected unix seconds, an ISO 8601 time "
            "(2024-05-01T12:00:00Z) or a duration ago (30m, 2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def when(ts: float | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` (UTC) of a unix time, ``-`` for none."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def short_json(value: Any, limit: int = 120) -> str:
    """``value`` as compact JSON (strings as they are) on one line, cut to ``limit``."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return one_line(text, limit)
