"""Minder's alerts in Prometheus Alertmanager (API v2): pushed while open, ended on resolve.

Alertmanager identifies an alert by its **label set** (its fingerprint): a re-send with the same
labels updates the alert, one with other labels is another alert. So the labels here are only
what stays fixed for an alert's whole life (:func:`alert_labels`); everything that changes
(score, Minder status, devices, evidence) goes into the annotations (:func:`alert_annotations`),
which a re-send overwrites.

Labels
    ``alertname``  ``MinderRule`` | ``MinderSimilarity`` | ``MinderStraggler`` | ``MinderSilence``
    | ``MinderHang`` | ``MinderSuspiciousSource`` (one per :class:`~minder.core.alert.AlertKind`,
    so routes and silences can tell a hard fault from a statistical one, and a report the
    scheduler contradicts from both); ``job_id``, ``machine``, ``kind``, ``metric``;
    ``severity`` (rule, silence and hang: ``critical``, similarity and suspicious_source:
    ``warning``, straggler: ``info``);
    ``alert_id`` (Minder's id: a fault that comes back after its end is a new alert, as in
    Minder); ``domain`` only for a domain-wide alert (then ``machine`` is the domain's name);
    plus the caller's ``extra_labels`` (``cluster``, ``team``...), which may not override these.
    A job-level ``hang`` alert names no machine: it has no ``machine`` label (Alertmanager
    drops empty labels anyway; ``alert_id`` keeps it apart from its culprits' alerts).

    Devices and a machine's domain are *not* labels: Minder's store grows an open alert's
    ``devices`` as more of them deviate and fills in its ``domain`` when a later report has one
    (``minder.storage.alerts.record_alert``); as labels they would fork the alert in
    Alertmanager, and the end would not end the first copy.

Annotations (strings, each truncated)
    ``summary`` (one line), ``description`` (score, onset, devices and the key evidence: the
    deviating metric's last value against the peers' median, z and threshold; the rule, its
    code or count; the silent seconds; a domain's members), ``score``, ``onset``, ``detected``,
    ``devices``, ``domain``, ``minder_status``, ``minder_url`` (``<external_url>/api/v1/alerts/
    <id>``, also the ``generatorURL``) when an external URL is known; once a self-check of the
    alert's drained node gave its answer, ``selfcheck_verdict``, ``selfcheck_reason``,
    ``selfcheck_failing``, ``selfcheck_id`` and ``selfcheck_outcome`` (docs/selfcheck.md). A
    ``confirmed`` alert (its check failed) stays firing; ``cleared_by_selfcheck`` ends it.

Times
    ``startsAt`` is the onset (``alert.first_ts``), RFC 3339 in UTC with milliseconds. The end is
    ``endsAt``: Alertmanager treats an alert whose ``endsAt`` has passed as resolved (its
    receivers get a ``resolved`` notification if they ask for them) and hides it from
    ``GET /api/v2/alerts``. An ``endsAt`` before ``startsAt`` is refused (400), so an end
    earlier than the onset (clock skew between data time and wall time) is sent as the onset.

Keeping an open alert open: the caller must re-send
    Alertmanager ends an alert by itself when its ``endsAt`` passes. An alert posted without
    ``endsAt`` gets ``now + resolve_timeout`` (the server's ``global.resolve_timeout``, 5 m by
    default), so an open alert must be re-sent periodically or Alertmanager declares it resolved.
    :func:`still_open_payload` does what Prometheus does: it sets an explicit ``endsAt`` of
    ``now + valid_for_s`` (default :data:`DEFAULT_VALID_FOR_S` = 4 × :data:`REFRESH_INTERVAL_S`),
    which does not depend on the server's ``resolve_timeout``. Re-send every open alert every
    :data:`REFRESH_INTERVAL_S` (60 s) — ``refresh_interval_s`` well under ``valid_for_s``, so a
    few lost pushes do not end it — and push :func:`to_alertmanager` with ``ended_at`` once when
    the alert is resolved or marked a false positive (retry it while the error is transient). If
    Minder stops, its alerts end by themselves at most ``valid_for_s`` later. Re-sends are
    idempotent: Alertmanager merges them into the one alert (keeping the earliest ``startsAt``)
    and does not notify again before the route's ``repeat_interval``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType, TracebackType
from typing import Any, Final

import httpx

from minder import __version__
from minder.core.alert import Alert, AlertKind, AlertStatus
from minder.core.errors import ValidationError
from minder.delivery.worker import DeliveryError

logger = logging.getLogger(__name__)

ALERTNAMES: Final[Mapping[AlertKind, str]] = MappingProxyType(
    {
        AlertKind.RULE: "MinderRule",
        AlertKind.SIMILARITY: "MinderSimilarity",
        AlertKind.STRAGGLER: "MinderStraggler",
        AlertKind.SILENCE: "MinderSilence",
        AlertKind.HANG: "MinderHang",
        AlertKind.SUSPICIOUS_SOURCE: "MinderSuspiciousSource",
    }
)
"""The ``alertname`` label of each kind."""

SEVERITIES: Final[Mapping[AlertKind, str]] = MappingProxyType(
    {
        AlertKind.RULE: "critical",
        AlertKind.SILENCE: "critical",
        AlertKind.HANG: "critical",
        AlertKind.SIMILARITY: "warning",
        AlertKind.STRAGGLER: "info",
        AlertKind.SUSPICIOUS_SOURCE: "warning",
    }
)
"""The ``severity`` label of each kind."""

MINDER_LABELS: Final = frozenset(
    {"alertname", "job_id", "machine", "kind", "metric", "severity", "alert_id", "domain"}
)
"""Labels Minder sets; ``extra_labels`` may not override them."""

REFRESH_INTERVAL_S: Final = 60.0
"""How often to re-send each open alert."""

DEFAULT_VALID_FOR_S: Final = 4 * REFRESH_INTERVAL_S
"""How long an open alert stays open in Alertmanager after its last push."""

ANNOTATION_CHARS: Final = 200
"""Longest value of a short annotation (summary, devices...)."""

DESCRIPTION_CHARS: Final = 1000
"""Longest ``description``."""

ERROR_TEXT_CHARS: Final = 300
"""Longest part of Alertmanager's error text kept in a :class:`DeliveryError`."""

_FINAL_STATUSES: Final = frozenset(
    {AlertStatus.RESOLVED, AlertStatus.FALSE_POSITIVE, AlertStatus.CLEARED_BY_SELFCHECK}
)
"""Statuses that end the alert in Alertmanager (a confirmed alert stays firing: its node is
out and the fault is real)."""
_LABEL_NAME: Final = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
_MEMBERS_SHOWN: Final = 5
_DEVICES_SHOWN: Final = 8
_RANKS_SHOWN: Final = 8


# -- payloads -------------------------------------------------------------------------------


def rfc3339(ts: float) -> str:
    """Unix seconds as RFC 3339 in UTC with milliseconds (``2024-05-01T12:00:00.250Z``), the
    form Alertmanager answers with."""
    if not math.isfinite(ts):
        raise ValidationError(f"time {ts!r} is not a finite number of unix seconds")
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def alert_url(alert_id: str, external_url: str | None) -> str | None:
    """``<external_url>/api/v1/alerts/<id>``: the alert in Minder's API; None without a URL."""
    if not external_url:
        return None
    return f"{external_url.rstrip('/')}/api/v1/alerts/{alert_id}"


def alert_labels(alert: Alert, extra_labels: Mapping[str, str] = _NO_LABELS) -> dict[str, str]:
    """The labels of ``alert``: fixed for its whole life (see the module's documentation).

    Raises
    ------
    ValidationError
        When an extra label has an invalid name or overrides one of :data:`MINDER_LABELS`.
    """
    labels = {
        "alertname": ALERTNAMES[alert.kind],
        "job_id": alert.job,
        "machine": alert.machine,
        "kind": alert.kind.value,
        "metric": alert.metric,
        "severity": SEVERITIES[alert.kind],
        "alert_id": alert.id,
    }
    if alert.domain and alert.domain == alert.machine:
        labels["domain"] = alert.domain
    for name, value in extra_labels.items():
        if not _LABEL_NAME.match(name):
            raise ValidationError(
                f"extra label name {name!r} is invalid: expected [a-zA-Z_][a-zA-Z0-9_]*"
            )
        if name in MINDER_LABELS:
            raise ValidationError(
                f"extra label {name!r} would override Minder's label: use another name "
                f"(Minder sets {sorted(MINDER_LABELS)})"
            )
        if value:  # Alertmanager drops empty labels: an empty value is no label
            labels[name] = str(value)
    # Alertmanager refuses invalid UTF-8; values are kept whole so they stay stable
    return {name: _utf8(value) for name, value in labels.items() if value}


def alert_annotations(alert: Alert, external_url: str | None) -> dict[str, str]:
    """The annotations of ``alert``: what it is now (see the module's documentation)."""
    devices = ",".join(alert.devices)
    annotations = {
        "summary": _summary(alert),
        "description": _description(alert),
        "score": _num(alert.score),
        "onset": rfc3339(alert.first_ts),
        "detected": rfc3339(alert.detected_ts) if math.isfinite(alert.detected_ts) else "",
        "devices": devices,
        "domain": alert.domain,
        "minder_status": alert.status.value,
        "minder_url": alert_url(alert.id, external_url) or "",
        **_selfcheck_annotations(alert),
    }
    limits = {"description": DESCRIPTION_CHARS}
    return {
        name: _truncate(value, limits.get(name, ANNOTATION_CHARS))
        for name, value in annotations.items()
        if value
    }


def to_alertmanager(
    alert: Alert,
    *,
    ended_at: float | None,
    external_url: str | None,
    extra_labels: Mapping[str, str] = _NO_LABELS,
) -> dict[str, Any]:
    """``alert`` as an Alertmanager v2 ``postableAlert``.

    Parameters
    ----------
    ended_at
        When the alert ended (resolved or false positive), unix seconds: sent as ``endsAt``,
        which ends it in Alertmanager. None while it is open: then no ``endsAt`` is sent and
        Alertmanager keeps it for its ``resolve_timeout`` (see :func:`still_open_payload`).
    external_url
        Minder's API base URL (``https://minder.example.com``) for ``minder_url`` and
        ``generatorURL``; None leaves both out.
    extra_labels
        Static labels to add (``{"cluster": "a3"}``); they must stay the same for the alert's
        whole life too.

    Raises
    ------
    ValidationError
        For a resolved or false-positive alert without ``ended_at`` (it would stay firing), a
        time that is not finite, or an invalid extra label.
    """
    if ended_at is None and alert.status in _FINAL_STATUSES:
        raise ValidationError(
            f"alert {alert.id!r} is {alert.status.value}: give ended_at, else Alertmanager "
            "keeps it firing"
        )
    payload: dict[str, Any] = {
        "labels": alert_labels(alert, extra_labels),
        "annotations": alert_annotations(alert, external_url),
        "startsAt": rfc3339(alert.first_ts),
    }
    if ended_at is not None:
        if math.isfinite(ended_at) and ended_at < alert.first_ts:
            logger.warning(
                "alert %s ends at %.3f, before its onset %.3f: sent as ending at its onset",
                alert.id,
                ended_at,
                alert.first_ts,
            )
            ended_at = alert.first_ts
        payload["endsAt"] = rfc3339(ended_at)
    url = alert_url(alert.id, external_url)
    if url is not None:
        payload["generatorURL"] = url
    return payload


def still_open_payload(
    alert: Alert,
    external_url: str | None,
    *,
    now: float | None = None,
    valid_for_s: float | None = DEFAULT_VALID_FOR_S,
    extra_labels: Mapping[str, str] = _NO_LABELS,
) -> dict[str, Any]:
    """The periodic re-send of an open alert: ``endsAt`` = ``now + valid_for_s``.

    Push it every :data:`REFRESH_INTERVAL_S` while the alert is open; if the pushes stop,
    Alertmanager resolves the alert ``valid_for_s`` after the last one. ``valid_for_s=None``
    sends no ``endsAt`` (the server's ``resolve_timeout`` applies instead).

    Raises
    ------
    ValidationError
        For an alert that is no longer open (send :func:`to_alertmanager` with ``ended_at``),
        or a ``valid_for_s`` that is not positive.
    """
    if alert.status in _FINAL_STATUSES:
        raise ValidationError(
            f"alert {alert.id!r} is {alert.status.value}, not open: end it with "
            "to_alertmanager(alert, ended_at=...)"
        )
    payload = to_alertmanager(
        alert, ended_at=None, external_url=external_url, extra_labels=extra_labels
    )
    if valid_for_s is not None:
        if not (math.isfinite(valid_for_s) and valid_for_s > 0):
            raise ValidationError(f"valid_for_s is {valid_for_s!r}: expected seconds > 0")
        until = (time.time() if now is None else now) + valid_for_s
        payload["endsAt"] = rfc3339(max(until, alert.first_ts))
    return payload


def _selfcheck(alert: Alert) -> Mapping[str, Any] | None:
    """The alert's latest self-check verdict (``evidence["selfcheck"]``), if it has one."""
    found = alert.evidence.get("selfcheck")
    return found if isinstance(found, Mapping) else None


def _selfcheck_annotations(alert: Alert) -> dict[str, str]:
    """``selfcheck_verdict`` (pass, fail, inconclusive), ``selfcheck_reason``,
    ``selfcheck_failing`` (the failed checks), ``selfcheck_id`` and ``selfcheck_outcome`` (what
    was done with the node) of the alert's latest self-check."""
    check = _selfcheck(alert)
    if check is None:
        return {}
    return {
        "selfcheck_verdict": _text(check.get("verdict") or check.get("state") or ""),
        "selfcheck_reason": _text(check.get("reason") or ""),
        "selfcheck_failing": _text(check.get("failing") or ""),
        "selfcheck_id": _text(check.get("check_id") or ""),
        "selfcheck_outcome": _text(check.get("outcome") or ""),
    }


def _summary(alert: Alert) -> str:
    text = _what(alert)
    if alert.status is AlertStatus.CONFIRMED:
        failing = _text((_selfcheck(alert) or {}).get("failing") or "")
        text += " (confirmed by a self-check" + (f": {failing} failed)" if failing else ")")
    elif alert.status is AlertStatus.CLEARED_BY_SELFCHECK:
        text += " (cleared by a self-check: the node was returned)"
    return text


def _what(alert: Alert) -> str:
    where = f" on {_devices(alert.devices)}" if alert.devices else ""
    rule = alert.evidence.get("rule")
    if alert.kind is AlertKind.RULE:
        what = f"{alert.metric} fault{where}" + (f" (rule {rule})" if rule else "")
    elif alert.kind is AlertKind.SIMILARITY:
        of = f" of {_devices(alert.devices)}" if alert.devices else ""
        what = f"{alert.metric}{of} deviates from its peers"
    elif alert.kind is AlertKind.STRAGGLER:
        what = f"slows the job down ({alert.metric}{where})"
    elif alert.kind is AlertKind.SUSPICIOUS_SOURCE:
        said = alert.evidence.get("reason")
        what = f"a {alert.metric} report names it outside its job, not acted on" + (
            f" ({_truncate(_text(said), 160)})" if said else ""
        )
    elif alert.kind is AlertKind.HANG:
        ranks = _ranks(alert.evidence.get("culprit_ranks"))
        if not alert.machine:
            return f"[{alert.job}] the job is hung" + (f": it waits on {ranks}" if ranks else "")
        what = "the job's hang waits on it" + (f" ({ranks})" if ranks else "")
    else:
        what = "stopped reporting while its peers go on"
    return f"[{alert.job}] {alert.machine}: {what}"


def _ranks(value: Any) -> str:
    """``rank 2`` or ``ranks 2, 5, 9…`` of an evidence list of ranks; empty when it has none."""
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        return ""
    shown = ", ".join(_text(r) for r in value[:_RANKS_SHOWN])
    more = "…" if len(value) > _RANKS_SHOWN else ""
    return f"rank{'s' if len(value) > 1 else ''} {shown}{more}"


def _description(alert: Alert) -> str:
    facts = [f"score {_num(alert.score)}", f"onset {rfc3339(alert.first_ts)}"]
    if alert.devices:
        facts.append(f"devices {_devices(alert.devices)}")
    if alert.domain and alert.domain != alert.machine:
        facts.append(f"domain {alert.domain}")
    facts.extend(_evidence_facts(alert))
    return "; ".join(facts)


def _evidence_facts(alert: Alert) -> list[str]:
    """A few key numbers of the evidence, in words; unknown keys are left out."""
    ev = alert.evidence
    facts: list[str] = []
    if ev.get("rule"):
        facts.append(f"rule {_text(ev['rule'])}")
    if ev.get("code") is not None:
        facts.append(f"code {_text(ev['code'])}")
    if ev.get("message"):
        facts.append(f"message {_truncate(_text(ev['message']), 120)!r}")
    own = _last_finite(ev.get("machine_window"))
    median = _last_finite(ev.get("peer_median_window"))
    if own is not None and median is not None:
        facts.append(f"{alert.metric} {_num(own)} vs peers' median {_num(median)}")
    elif ev.get("value") is not None:
        peers = ev.get("peers") if alert.kind is AlertKind.RULE else ev.get("peer_median")
        versus = f" vs peers {_num(peers)}" if peers is not None else ""
        facts.append(f"value {_num(ev['value'])}{versus}")
    if ev.get("z") is not None:
        detail = ", ".join(
            f"{key} {_num(ev[key])}" for key in ("direction", "threshold") if ev.get(key)
        )
        facts.append(f"z {_num(ev['z'])}" + (f" ({detail})" if detail else ""))
    for key, words in (
        ("errors", "errors"),
        ("seconds_with_errors", "seconds with errors"),
        ("window_s", "window s"),
        ("silent_s", "silent s"),
        ("absent_s", "absent s"),
        ("peers_reporting", "peers reporting"),
        ("peers_up", "peers up"),
        ("missing_samples", "missing samples"),
    ):
        if ev.get(key) is not None:
            facts.append(f"{words} {_num(ev[key])}")
    if alert.kind is not AlertKind.RULE and isinstance(ev.get("peers"), int | float):
        facts.append(f"peers {_num(ev['peers'])}")
    members = ev.get("domain_members")
    if isinstance(members, Sequence) and not isinstance(members, str) and members:
        shown = ", ".join(_text(m) for m in members[:_MEMBERS_SHOWN])
        more = "…" if len(members) > _MEMBERS_SHOWN else ""
        size = f" of {_num(ev['domain_size'])}" if ev.get("domain_size") is not None else ""
        facts.append(f"{len(members)}{size} machines of the domain: {shown}{more}")
    machines = ev.get("culprit_machines")
    hang = alert.kind is AlertKind.HANG
    if hang and isinstance(machines, Sequence) and not isinstance(machines, str) and machines:
        shown = ", ".join(_text(m) for m in machines[:_MEMBERS_SHOWN])
        more = "…" if len(machines) > _MEMBERS_SHOWN else ""
        facts.append(f"culprit machines {shown}{more}")
    if ev.get("member_rules"):
        facts.append(f"rules {_truncate(_text(ev['member_rules']), 120)}")
    if ev.get("other_metrics"):
        facts.append(f"also {_truncate(_text(ev['other_metrics']), 120)}")
    check = _selfcheck(alert)
    if check is not None:
        verdict = _text(check.get("verdict") or check.get("state") or "no verdict")
        reason = _truncate(_text(check.get("reason") or ""), 160)
        facts.append(f"self-check {verdict}" + (f": {reason}" if reason else ""))
    return facts


def _devices(devices: Sequence[str]) -> str:
    shown = ",".join(devices[:_DEVICES_SHOWN])
    return shown if len(devices) <= _DEVICES_SHOWN else f"{shown}… ({len(devices)} devices)"


def _last_finite(values: Any) -> float | None:
    if not isinstance(values, Sequence) or isinstance(values, str):
        return None
    for value in reversed(values):
        number = _float(value)
        if number is not None and math.isfinite(number):
            return number
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _num(value: Any) -> str:
    """A number in at most 4 significant digits (integral ones whole); other values as text."""
    number = None if isinstance(value, str | bool) else _float(value)
    if number is None:
        return _text(value)
    if not math.isfinite(number):
        return str(number)
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.4g}"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return ",".join(_text(v) for v in value)
    return str(value)


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def _truncate(text: str, limit: int) -> str:
    text = _utf8(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- client ---------------------------------------------------------------------------------


class AlertmanagerClient:
    """Talks to one Alertmanager's API v2 (for an HA pair, push to each of its members).

    Parameters
    ----------
    url
        The server's base URL, with its route prefix if it has one
        (``http://alertmanager:9093``).
    timeout_s
        Connect, read and write timeout of each request.
    headers
        Extra request headers (a tenant header of a multi-tenant proxy...).
    basic_auth
        ``(user, password)``; not with ``bearer_token``.
    bearer_token
        Sent as ``Authorization: Bearer ...``.
    transport
        An httpx transport in place of the network (tests).

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        basic_auth: tuple[str, str] | None = None,
        bearer_token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValidationError(f"Alertmanager URL {url!r}: expected http:// or https://")
        if basic_auth is not None and bearer_token:
            raise ValidationError("Alertmanager: give basic_auth or bearer_token, not both")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        request_headers = {"Accept": "application/json", "User-Agent": f"minder/{__version__}"}
        request_headers.update(headers or {})
        if bearer_token:
            request_headers["Authorization"] = f"Bearer {bearer_token}"
        self._client = httpx.Client(
            timeout=timeout_s,
            headers=request_headers,
            auth=httpx.BasicAuth(*basic_auth) if basic_auth is not None else None,
            transport=transport,
        )

    def push(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """``POST /api/v2/alerts`` with ``alerts`` (``postableAlert`` objects); nothing to do
        for an empty list.

        Raises
        ------
        DeliveryError
            Not transient for a 400 (Alertmanager's reason included): note that Alertmanager
            still stores the valid alerts of a batch it answers 400 for, so a batch may be
            re-sent alert by alert to find the bad one. Transient when it is unreachable,
            times out, or answers 5xx or 429.
        """
        if not alerts:
            return
        self._request("POST", "/api/v2/alerts", json=list(alerts), what=f"{len(alerts)} alert(s)")
        logger.debug("pushed %d alert(s) to Alertmanager %s", len(alerts), self.url)

    def active(self, filters: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """The active alerts (not silenced or inhibited ones, not resolved ones) whose labels
        equal ``filters``: ``GET /api/v2/alerts?active=true&filter=name="value"``.

        Each item is a ``gettableAlert``: ``labels``, ``annotations``, ``startsAt``, ``endsAt``,
        ``fingerprint``, ``status: {state, silencedBy, inhibitedBy}``...
        """
        params: list[tuple[str, str]] = [
            ("active", "true"),
            ("silenced", "false"),
            ("inhibited", "false"),
        ]
        for name, value in (filters or {}).items():
            if not _LABEL_NAME.match(name):
                raise ValidationError(f"filter label name {name!r} is invalid")
            params.append(("filter", f'{name}="{_quote(value)}"'))
        answer = self._request("GET", "/api/v2/alerts", params=params, what="alerts").json()
        if not isinstance(answer, list):
            raise DeliveryError(
                f"Alertmanager {self.url}: GET /api/v2/alerts answered {type(answer).__name__}, "
                "expected a list",
                transient=False,
            )
        return answer

    def status(self) -> dict[str, Any]:
        """``GET /api/v2/status``: ``versionInfo``, ``uptime``, ``cluster``, ``config`` (a
        reachability check)."""
        answer = self._request("GET", "/api/v2/status", what="status").json()
        if not isinstance(answer, dict):
            raise DeliveryError(
                f"Alertmanager {self.url}: GET /api/v2/status answered {type(answer).__name__}",
                transient=False,
            )
        return answer

    def close(self) -> None:
        """Close the connections."""
        self._client.close()

    def __enter__(self) -> AlertmanagerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, *, what: str, **kwargs: Any) -> httpx.Response:
        where = f"Alertmanager {self.url}: {method} {path} ({what})"
        try:
            response = self._client.request(method, self.url + path, **kwargs)
        except (httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
            raise DeliveryError(f"{where}: {exc}", transient=False) from exc
        except httpx.TransportError as exc:  # connect, read, write, pool, timeouts, proxy
            raise DeliveryError(f"{where}: {type(exc).__name__}: {exc}", transient=True) from exc
        except httpx.HTTPError as exc:  # redirects, decoding
            raise DeliveryError(f"{where}: {exc}", transient=False) from exc
        if response.is_success:
            return response
        status = response.status_code
        transient = status >= 500 or status in (408, 429)
        raise DeliveryError(
            f"{where}: answered {status}: {_error_text(response)}",
            transient=transient,
            status=status,
        )


def _error_text(response: httpx.Response) -> str:
    """Alertmanager's reason: a JSON string (validation) or ``{"code", "message"}`` (a body it
    cannot parse); else the raw body. Truncated to :data:`ERROR_TEXT_CHARS`."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, str):
        text = body
    elif isinstance(body, dict) and isinstance(body.get("message"), str):
        text = body["message"]
    return _truncate(" ".join(text.split()), ERROR_TEXT_CHARS) or response.reason_phrase


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# -- the outbox sender ------------------------------------------------------------------------

BREAKER_ALERTNAME: Final = "MinderActionsBreakerTripped"


class AlertmanagerSender:
    """Sends outbox events to Alertmanager, and keeps open alerts alive there.

    ``alert.opened`` pushes the alert (valid for :data:`DEFAULT_VALID_FOR_S`), the end of an
    alert (resolved, false positive, cleared by a self-check) pushes it with ``endsAt``; a
    self-check that confirmed the alert, or gave no verdict (``selfcheck.inconclusive``), pushes
    it again still firing, with the verdict in its annotations; :meth:`refresh` re-sends every open
    alert (call it every ``refresh_s``), so Alertmanager keeps them while Minder does and ends them
    by itself if Minder stops. A tripped actions breaker is an alert of its own.
    """

    destination = "alertmanager"
    events: Final = frozenset(
        {"alert.opened", "alert.resolved", "alert.false_positive", "alert.confirmed",
         "alert.cleared_by_selfcheck", "selfcheck.inconclusive", "breaker.tripped",
         "breaker.reset"}
    )  # fmt: skip

    def __init__(
        self,
        client: AlertmanagerClient,
        *,
        external_url: str | None = None,
        extra_labels: Mapping[str, str] = _NO_LABELS,
        refresh_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        self.client = client
        self.timeout_s = client.timeout_s
        self.external_url = external_url
        self.extra_labels = dict(extra_labels)
        self.refresh_s = refresh_s
        # Valid for four refreshes: a missed refresh or two does not end an open alert, and an
        # alert ends by itself soon after Minder stops re-sending it.
        self.valid_for_s = 4 * refresh_s

    def send(self, delivery: Any) -> None:
        """Deliver one outbox row (:class:`minder.storage.outbox.Delivery`)."""
        data = delivery.payload.get("data", {})
        if delivery.event.startswith("breaker."):
            self.client.push([self.breaker_payload(data, ended=delivery.event == "breaker.reset",
                                                   at=delivery.created_at)])  # fmt: skip
            return
        alert = Alert.from_dict(data["alert"])
        if alert.status not in _FINAL_STATUSES:
            payload = still_open_payload(
                alert,
                self.external_url,
                valid_for_s=self.valid_for_s,
                extra_labels=self.extra_labels,
            )
        else:
            payload = to_alertmanager(
                alert,
                ended_at=delivery.created_at,
                external_url=self.external_url,
                extra_labels=self.extra_labels,
            )
        self.client.push([payload])

    def refresh(
        self,
        open_alerts: Sequence[Alert],
        breaker_reason: str | None = None,
        breaker_since: float | None = None,
        recently_closed: Sequence[tuple[Alert, float]] = (),
    ) -> None:
        """Re-send every open alert (and a tripped breaker) so Alertmanager keeps them, and the
        end of every alert closed within the validity window (``(alert, closed_at)``): a refresh
        that read an alert as open just before it was resolved must not revive it."""
        payloads = [
            still_open_payload(
                alert,
                self.external_url,
                valid_for_s=self.valid_for_s,
                extra_labels=self.extra_labels,
            )
            for alert in open_alerts
        ]
        payloads += [
            to_alertmanager(
                alert,
                ended_at=closed_at,
                external_url=self.external_url,
                extra_labels=self.extra_labels,
            )
            for alert, closed_at in recently_closed
        ]
        if breaker_reason is not None:
            payloads.append(
                self.breaker_payload(
                    {"reason": breaker_reason}, ended=False, at=breaker_since or time.time()
                )
            )
        for start in range(0, len(payloads), 500):
            self.client.push(payloads[start : start + 500])

    def breaker_payload(self, data: Mapping[str, Any], *, ended: bool, at: float) -> dict[str, Any]:
        """The breaker as an Alertmanager alert."""
        reason = _truncate(str(data.get("reason", "")), 500)
        alert: dict[str, Any] = {
            "labels": {
                **self.extra_labels,
                "alertname": BREAKER_ALERTNAME,
                "severity": "critical",
                "breaker": str(data.get("breaker", "actions")),
            },
            "annotations": {
                "summary": "Minder stopped acting on the scheduler: its circuit breaker tripped",
                "description": f"{reason} Reset it with `minder breaker reset` once checked.",
            },
            "startsAt": rfc3339(at),
        }
        if ended:
            alert["endsAt"] = rfc3339(time.time())
        else:
            alert["endsAt"] = rfc3339(time.time() + self.valid_for_s)
        return alert

    def close(self) -> None:
        self.client.close()
