"""The node's side of a self-check's report: where it goes and posting it (docs/selfcheck.md).

``minder selfcheck run`` on the suspect node posts its report to
``POST {MINDER_SELFCHECK_REPORT_URL}/api/v1/selfchecks/{MINDER_SELFCHECK_CHECK_ID}/report`` with
``Authorization: Bearer {MINDER_SELFCHECK_TOKEN}``: the check's one-time token, read from the
environment only, never logged, never in a message. :class:`ReportTarget` gathers the three;
:func:`post_report` posts, retrying what may pass on a second try (no answer, 429, 5xx) a few
times with back-off (tenacity), and nothing else: a refused token (401), a replay or a report
after the check's timeout (409), an unknown check (404) or a refused report (422) are final.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from collectors.selfcheck.base import CHECK_ID_ENV, REPORT_URL_ENV, TOKEN_ENV
from minder.client.api import (
    DEFAULT_TIMEOUT_S,
    ApiConflictError,
    ApiError,
    ApiUnauthorizedError,
    ApiUnreachableError,
    MinderApi,
    SelfCheckOut,
    normalise_url,
    one_line,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import SelfCheckReport

if TYPE_CHECKING:
    import httpx
    from tenacity import RetryCallState

logger = logging.getLogger(__name__)

POST_ATTEMPTS = 4
"""Tries of a report post in all (the first and three retries)."""
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
"""HTTP statuses a post is retried on (besides no answer at all)."""


@dataclass(frozen=True, slots=True)
class ReportTarget:
    """Where a report goes, and the token that lets it in (kept out of ``repr``)."""

    url: str
    check_id: str
    token: str = field(repr=False)

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str],
        *,
        url: str | None = None,
        check_id: str | None = None,
    ) -> ReportTarget | None:
        """The target of ``url`` and ``check_id`` (else ``MINDER_SELFCHECK_REPORT_URL`` and
        ``MINDER_SELFCHECK_CHECK_ID``) with the token of ``MINDER_SELFCHECK_TOKEN``; None when
        neither a URL nor a check id is given (a run by hand reports nowhere).

        Raises
        ------
        ValidationError
            Only one of the URL and the check id, a URL that is not http(s), or no token.
        """
        url = (url if url is not None else environ.get(REPORT_URL_ENV, "")).strip() or None
        check_id = (
            check_id if check_id is not None else environ.get(CHECK_ID_ENV, "")
        ).strip() or None
        if url is None and check_id is None:
            return None
        if url is None or check_id is None:
            given, missing = (
                ("a check id", f"--report-url or {REPORT_URL_ENV}")
                if url is None
                else ("a report URL", f"--check-id or {CHECK_ID_ENV}")
            )
            raise ValidationError(
                f"{given} without {missing}: expected both, to post the report, or neither"
            )
        try:
            base = normalise_url(url)
        except ApiError as exc:
            raise ValidationError(f"report URL: {exc}") from None
        token = environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise ValidationError(
                f"{TOKEN_ENV} is not set: expected the check's one-time token to post its "
                f"report to {base}"
            )
        return cls(base, check_id, token)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiUnreachableError):
        return True
    return isinstance(exc, ApiError) and exc.status in RETRY_STATUSES


def post_report(
    target: ReportTarget,
    report: SelfCheckReport,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    attempts: int = POST_ATTEMPTS,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> SelfCheckOut:
    """Post ``report`` to ``target``; the service's record of the check as it answered.

    Retries no answer, 429 and 5xx up to ``attempts`` tries in all, waiting 0.5, 1, 2 … s
    (at most 8) in between.

    Raises
    ------
    ApiError
        The post failed for good; one line that never holds the token.
    """
    from tenacity import (  # noqa: PLC0415 - only a suspect that reports needs it
        Retrying,
        retry_if_exception,
        stop_after_attempt,
        wait_exponential,
    )

    tries = 0

    def note(state: RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome is not None else None
        logger.warning(
            "selfcheck: posting the report of check %s failed (try %d of %d): %s; retrying",
            target.check_id,
            state.attempt_number,
            attempts,
            one_line(str(failure), 160),
        )

    try:
        with MinderApi(target.url, token=target.token, timeout=timeout, transport=transport) as api:
            for attempt in Retrying(
                stop=stop_after_attempt(max(1, attempts)),
                wait=wait_exponential(multiplier=0.5, max=8),
                retry=retry_if_exception(_transient),
                reraise=True,
                sleep=sleep,
                before_sleep=note,
            ):
                with attempt:
                    tries += 1
                    return api.report_selfcheck(target.check_id, report.to_dict())
    except ApiUnauthorizedError as exc:
        raise ApiError(
            f"the service refused the token of {TOKEN_ENV} for self-check {target.check_id} "
            f"(HTTP 401: {one_line(_detail(exc), 120)})",
            401,
        ) from None
    except ApiConflictError as exc:
        earlier = (
            " (an earlier try may have reached it before its answer was lost)" if tries > 1 else ""
        )
        raise ApiError(
            f"the service refused the report of self-check {target.check_id}: "
            f"{one_line(str(exc), 160)}{earlier}",
            409,
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover - Retrying returns or raises


def _detail(exc: ApiError) -> str:
    text = str(exc)
    start = text.find("(HTTP 401: ")
    return text[start + len("(HTTP 401: ") : -1] if start >= 0 else text
