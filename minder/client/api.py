"""A small typed client of Minder's HTTP API (``/api/v1``), used by the operator commands.

The response types mirror :mod:`minder.api.schemas` as :class:`~typing.TypedDict` (plain JSON
data: it prints as is with ``--format json``), so the CLI never imports FastAPI or pydantic's
models. Every failure is an :class:`ApiError` with a one-line message: the API cannot be reached,
refused the token, has no such entity, forbids a status change, or answered something that is not
Minder's JSON. The client never puts the token in a message.

What the operator commands share (their connection options, turning an :class:`ApiError` into
the CLI's one-line error) is in :mod:`minder.cli.api_options`.

httpx is imported when a client is made, not with this module, so ``minder alerts --help`` stays
fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypedDict, TypeVar
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    import httpx

API_PREFIX = "/api/v1"
DEFAULT_API_URL = "http://127.0.0.1:8080"
API_URL_ENV = "MINDER_API_URL"
API_TOKEN_ENV = "MINDER_API_TOKEN"
SERVER_TOKEN_ENV = "MINDER_API__TOKEN"
"""The server's own token variable (``minder serve``); read too, after :data:`API_TOKEN_ENV`."""
DEFAULT_TIMEOUT_S = 10.0
MAX_PAGE = 500
"""Largest page the API serves (its ``limit`` bound)."""
MAX_TEXT = 200
"""Characters of an unexpected answer kept in an error message."""

T = TypeVar("T")
Params = list[tuple[str, str | int | float | bool | None]]


# -- what the API returns (minder.api.schemas) ------------------------------------------------


class AlertOut(TypedDict):
    """A stored alert (``AlertOut``)."""

    id: str
    key: str
    job: str
    machine: str
    devices: list[str]
    kind: str
    metric: str
    score: float
    first_ts: float
    detected_ts: float
    last_seen_ts: float
    occurrences: int
    domain: str
    status: str
    evidence: dict[str, Any]
    created_at: float
    updated_at: float


class DeliveryOut(TypedDict):
    """One outbox row (``DeliveryOut``)."""

    id: int
    delivery_id: str
    destination: str
    event: str
    alert_id: str | None
    job: str | None
    status: str
    attempts: int
    created_at: float
    next_attempt_at: float
    expires_at: float
    delivered_at: float | None
    last_error: str | None


class AuditOut(TypedDict):
    """One action decision of the audit trail (``AuditOut``)."""

    id: int
    created_at: float
    alert_id: str | None
    job: str | None
    machine: str | None
    node: str | None
    target: str
    operation: str
    mode: str
    outcome: str
    detail: str
    delivery_id: str | None


class BreakerOut(TypedDict):
    """The actions circuit breaker (``BreakerOut``)."""

    name: str
    tripped: bool
    tripped_at: float | None
    reason: str | None
    reset_at: float | None
    reset_by: str | None


class CheckResultOut(TypedDict):
    """One check's outcome in a node's report (``CheckResult.to_dict()``)."""

    name: str
    status: str
    summary: str
    measurements: dict[str, Any]
    duration_s: float


class SelfCheckReportOut(TypedDict):
    """A node's self-check report (``SelfCheckReport.to_dict()``)."""

    schema_version: int
    check_id: str | None
    node: str
    started_ts: float
    finished_ts: float
    verdict: str
    reason: str
    checks: list[CheckResultOut]


class SelfCheckOut(TypedDict):
    """A self-check the service scheduled on a drained node (``SelfCheckRecord.to_dict()``)."""

    id: str
    alert_id: str
    job: str
    machine: str
    node: str
    target: str
    state: str
    attempt: int
    partners: list[str]
    created_ts: float
    started_ts: float | None
    finished_ts: float | None
    drained_ts: float | None
    returned_ts: float | None
    scheduler_ref: str | None
    detail: str
    verdict: str | None
    report: SelfCheckReportOut | None


class Page(TypedDict, Generic[T]):
    """One page of a listing, newest first, with the total over all pages."""

    items: list[T]
    total: int
    limit: int
    offset: int


# -- errors -----------------------------------------------------------------------------------


class ApiError(Exception):
    """A request failed; ``str(error)`` is one line for humans.

    Attributes
    ----------
    status
        The HTTP status, or ``None`` when no answer came.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(one_line(message, 400))
        self.status = status


class ApiUnreachableError(ApiError):
    """No answer: refused, unknown host, timed out, TLS failure."""


class ApiUnauthorizedError(ApiError):
    """401: the endpoint needs a (valid) bearer token."""


class ApiForbiddenError(ApiError):
    """403: changes are disabled on the server (no token, not open), or refused for the request."""


class ApiNotFoundError(ApiError):
    """404: no such alert (or job, report); the message is the API's detail."""


class ApiConflictError(ApiError):
    """409: the alert life cycle forbids the change.

    Attributes
    ----------
    current, requested
        The alert's status and the one asked for.
    allowed
        The statuses it may move to (empty for a final status).
    """

    def __init__(
        self, message: str, current: str | None, requested: str | None, allowed: list[str]
    ) -> None:
        super().__init__(message, 409)
        self.current = current
        self.requested = requested
        self.allowed = allowed


def one_line(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _detail(body: Any) -> str | None:
    """The ``detail`` of an error body: a string, or FastAPI's list of validation errors."""
    if not isinstance(body, Mapping):
        return None
    detail = body.get("detail")
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        parts = []
        for item in detail:
            if isinstance(item, Mapping):
                where = ".".join(str(p) for p in item.get("loc", ()) if p != "body")
                parts.append(f"{where}: {item.get('msg', '')}" if where else str(item.get("msg")))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return None


# -- the client -------------------------------------------------------------------------------


def normalise_url(url: str) -> str:
    """The API's base URL: ``http(s)://host[:port][/prefix]`` without ``/api/v1`` or a slash.

    Raises
    ------
    ApiError
        When ``url`` is not an http(s) URL with a host.
    """
    base = url.strip().rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ApiError(
            f"API URL {one_line(url, 80)!r} is not an http(s) URL: expected e.g. {DEFAULT_API_URL}"
        )
    if base.endswith(API_PREFIX):
        base = base[: -len(API_PREFIX)]
    return base


class MinderApi:
    """A client of one Minder API; use it as a context manager (it closes its connections).

    Parameters
    ----------
    url
        Where the API answers (``http://host:8080``; a trailing ``/api/v1`` is accepted).
    token
        The bearer token (the server's ``MINDER_API__TOKEN``), sent with every request: a server
        with a token needs it for changes and reads alike.
    timeout
        Seconds to wait for connecting and for each answer.
    transport
        An httpx transport to use instead of the network (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        import httpx  # noqa: PLC0415

        from minder import __version__  # noqa: PLC0415

        self.url = normalise_url(url)
        self.token = token or None
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX,
            timeout=timeout,
            transport=transport,
            headers={"User-Agent": f"minder-cli/{__version__}", "Accept": "application/json"},
        )

    def __enter__(self) -> MinderApi:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # -- alerts --

    def alerts(
        self,
        *,
        job: str | None = None,
        machine: str | None = None,
        kinds: Sequence[str] = (),
        statuses: Sequence[str] = (),
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[AlertOut]:
        """One page of alerts matching every filter, newest detected first.

        ``since`` (included) and ``until`` (excluded) bound the detection time, unix seconds.
        """
        params: Params = [("limit", limit), ("offset", offset)]
        params += [(name, value) for name, value in (("job", job), ("machine", machine)) if value]
        params += [("kind", k) for k in kinds] + [("status", s) for s in statuses]
        params += [(n, v) for n, v in (("since", since), ("until", until)) if v is not None]
        page: Page[AlertOut] = self._request("GET", "/alerts", params=params)
        return page

    def iter_alerts(
        self,
        *,
        offset: int = 0,
        page_size: int = MAX_PAGE,
        on_page: Callable[[int, int], None] | None = None,
        **filters: Any,
    ) -> Iterator[AlertOut]:
        """Every alert matching ``filters`` (those of :meth:`alerts`) from ``offset`` on, page
        after page.

        ``on_page(fetched, expected)`` is called after each page. An alert pushed onto the next
        page while they are fetched (a newer one came) is given once.
        """
        yield from self._pages(
            lambda limit, start: self.alerts(limit=limit, offset=start, **filters),
            offset,
            page_size,
            on_page,
        )

    def alert(self, alert_id: str) -> AlertOut:
        """One alert with its evidence."""
        found: AlertOut = self._request("GET", f"/alerts/{_segment(alert_id, 'alert')}")
        return found

    def change_alert_status(self, alert_id: str, status: str, by: str | None) -> AlertOut:
        """Move an alert along its life cycle (needs the token when the API has one)."""
        changed: AlertOut = self._request(
            "PATCH", f"/alerts/{_segment(alert_id, 'alert')}", body={"status": status, "by": by}
        )
        return changed

    # -- deliveries and actions --

    def deliveries(
        self,
        *,
        alert_id: str | None = None,
        status: str | None = None,
        destination: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[DeliveryOut]:
        """Outbox rows, newest first."""
        params: Params = [("limit", limit), ("offset", offset)]
        for name, value in (
            ("alert_id", alert_id),
            ("status", status),
            ("destination", destination),
        ):
            if value:
                params.append((name, value))
        page: Page[DeliveryOut] = self._request("GET", "/deliveries", params=params)
        return page

    def actions(
        self,
        *,
        alert_id: str | None = None,
        machine: str | None = None,
        job: str | None = None,
        outcome: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[AuditOut]:
        """The action audit trail, newest first."""
        params: Params = [("limit", limit), ("offset", offset)]
        filters = (("alert_id", alert_id), ("machine", machine), ("job", job), ("outcome", outcome))
        params += [(name, value) for name, value in filters if value]
        page: Page[AuditOut] = self._request("GET", "/actions", params=params)
        return page

    def breaker(self) -> BreakerOut:
        """The actions circuit breaker."""
        state: BreakerOut = self._request("GET", "/breaker")
        return state

    def reset_breaker(self, by: str) -> BreakerOut:
        """Let Minder act again (needs the token when the API has one; idempotent)."""
        state: BreakerOut = self._request("POST", "/breaker/reset", body={"by": by})
        return state

    # -- self-checks --

    def selfchecks(
        self,
        *,
        states: Sequence[str] = (),
        node: str | None = None,
        alert_id: str | None = None,
        job: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[SelfCheckOut]:
        """One page of self-checks matching every filter, newest first."""
        params: Params = [("limit", limit), ("offset", offset)]
        params += [("state", state) for state in states]
        filters = (("node", node), ("alert_id", alert_id), ("job", job))
        params += [(name, value) for name, value in filters if value]
        page: Page[SelfCheckOut] = self._request("GET", "/selfchecks", params=params)
        return page

    def iter_selfchecks(
        self,
        *,
        offset: int = 0,
        page_size: int = MAX_PAGE,
        on_page: Callable[[int, int], None] | None = None,
        **filters: Any,
    ) -> Iterator[SelfCheckOut]:
        """Every self-check matching ``filters`` (those of :meth:`selfchecks`) from ``offset``
        on, page after page (``on_page`` as for :meth:`iter_alerts`)."""
        yield from self._pages(
            lambda limit, start: self.selfchecks(limit=limit, offset=start, **filters),
            offset,
            page_size,
            on_page,
        )

    def selfcheck(self, check_id: str) -> SelfCheckOut:
        """One self-check, with the node's report once it came."""
        found: SelfCheckOut = self._request(
            "GET", f"/selfchecks/{_segment(check_id, 'self-check')}"
        )
        return found

    def request_selfcheck(self, alert_id: str, by: str) -> SelfCheckOut:
        """Ask the service to check the node an alert's action drained (needs the token when the
        API has one); the answer is the new pending check."""
        created: SelfCheckOut = self._request(
            "POST", "/selfchecks", body={"alert_id": alert_id, "by": by}
        )
        return created

    def cancel_selfcheck(self, check_id: str, by: str | None = None) -> SelfCheckOut:
        """Stop a pending or running self-check (needs the token when the API has one)."""
        cancelled: SelfCheckOut = self._request(
            "POST",
            f"/selfchecks/{_segment(check_id, 'self-check')}/cancel",
            body=None if by is None else {"by": by},
        )
        return cancelled

    def report_selfcheck(self, check_id: str, report: Mapping[str, Any]) -> SelfCheckOut:
        """Post a node's report (``SelfCheckReport.to_dict()``); this client's token must be the
        check's own one-time token, not the API's."""
        recorded: SelfCheckOut = self._request(
            "POST", f"/selfchecks/{_segment(check_id, 'self-check')}/report", body=dict(report)
        )
        return recorded

    # -- plumbing --

    @staticmethod
    def _pages(
        fetch: Callable[[int, int], Page[T]],
        start: int,
        page_size: int,
        on_page: Callable[[int, int], None] | None,
    ) -> Iterator[T]:
        seen: set[Any] = set()
        offset = start
        while True:
            page = fetch(page_size, offset)
            items = page["items"]
            for item in items:
                key = item.get("id") if isinstance(item, Mapping) else None
                if key is None or key not in seen:
                    seen.add(key)
                    yield item
            offset += len(items)
            expected = max(page["total"] - start, 0)
            if on_page is not None:
                on_page(min(offset - start, expected), expected)
            if not items or offset >= page["total"]:
                return

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        import httpx  # noqa: PLC0415

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        where = f"{self.url}{API_PREFIX}{path}"
        try:
            response = self._http.request(method, path, params=params, json=body, headers=headers)
        except httpx.TimeoutException:
            raise ApiUnreachableError(
                f"the Minder API at {self.url} did not answer within {self.timeout:g} s "
                "(--timeout to wait longer)"
            ) from None
        except httpx.HTTPError as exc:
            reason = one_line(str(exc) or type(exc).__name__, 160)
            raise ApiUnreachableError(
                f"cannot reach the Minder API at {self.url}: {reason}"
            ) from None
        if response.is_success:
            try:
                return response.json()
            except ValueError:
                raise ApiError(
                    f"HTTP {response.status_code} from {method} {where} is not JSON: "
                    f"{one_line(response.text) or '(empty)'}",
                    response.status_code,
                ) from None
        self._raise(method, where, response)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise(self, method: str, where: str, response: httpx.Response) -> NoReturn:
        status = response.status_code
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        detail = _detail(body)
        shown = one_line(detail) if detail else one_line(response.text) or "(empty answer)"
        if status == 401:
            if self.token is None:
                raise ApiUnauthorizedError(
                    f"{method} {where} needs --token / {API_TOKEN_ENV} (HTTP 401: {shown})", status
                )
            raise ApiUnauthorizedError(
                f"the API refused the token of --token / {API_TOKEN_ENV} (HTTP 401: {shown})",
                status,
            )
        if status == 403:
            raise ApiForbiddenError(f"the API refused {method} {where} (HTTP 403): {shown}", status)
        if status == 400 and response.text.strip() == "Invalid host header":
            raise ApiError(
                f"the API refused the host name of {self.url} (HTTP 400: invalid Host): use a "
                "name the server accepts, or add it to the server's MINDER_API__ALLOWED_HOSTS",
                status,
            )
        if status == 404 and detail and detail != "Not Found":
            raise ApiNotFoundError(detail, status)
        if status == 404:
            raise ApiNotFoundError(
                f"HTTP 404 from {method} {where}: is {self.url} Minder's API (--api)?", status
            )
        if status == 409 and isinstance(body, Mapping):
            allowed = [str(s) for s in body.get("allowed") or ()]
            current, requested = body.get("current"), body.get("requested")
            raise ApiConflictError(
                detail or f"HTTP 409 from {method} {where}",
                None if current is None else str(current),
                None if requested is None else str(requested),
                allowed,
            )
        if status == 422 and detail:
            raise ApiError(f"the API refused the request: {detail}", status)
        raise ApiError(f"HTTP {status} from {method} {where}: {shown}", status)


def _segment(value: str, what: str) -> str:
    """``value`` as one path segment of ``what`` (an id with ``/`` cannot reach another
    endpoint: the server decodes ``%2F`` before routing, so no such entity can be addressed)."""
    if value in ("", ".", "..") or "/" in value:
        raise ApiNotFoundError(f"no {what} with id {value!r}", 404)
    return quote(value, safe="")
