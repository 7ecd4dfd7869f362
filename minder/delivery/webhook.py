"""Signed webhooks (Standard Webhooks): each outbox row is one POST, signed per endpoint.

Headers follow the Standard Webhooks specification: ``webhook-id`` (the row's stable delivery id:
receivers de-duplicate on it), ``webhook-timestamp`` (unix seconds of this attempt) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256>`` of ``id.timestamp.body``, one per secret,
space-separated, so an endpoint's secret can be rotated without a gap: sign with the new and the
old one until every receiver has the new one). Signing uses the ``standardwebhooks`` package, so
any receiver verifies with its ``Webhook(secret).verify(body, headers)``. The body is the event
payload documented in docs/webhooks.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import orjson
from standardwebhooks.webhooks import Webhook

from minder import __version__
from minder.core.errors import ValidationError
from minder.delivery.worker import MAX_LOGGED_CHARS, DeliveryError
from minder.storage.outbox import Delivery

logger = logging.getLogger(__name__)

# Every failure is retried until the row's time to live runs out (a receiver's 401 or 404 is
# usually a configuration being fixed, and giving up would lose the event), except 410 Gone: the
# receiver says this endpoint is gone for good.
_PERMANENT = frozenset({410})


def signers(secrets: Sequence[str]) -> list[Webhook]:
    """One signer per secret (``whsec_<base64>``, the Standard Webhooks format).

    Raises
    ------
    ValidationError
        A secret that is not base64 after its ``whsec_`` prefix, or empty.
    """
    out = []
    for index, secret in enumerate(secrets):
        try:
            out.append(Webhook(secret))
        except Exception:
            raise ValidationError(
                f"webhook secret #{index + 1} is not usable: expected 'whsec_' followed by "
                "base64 (e.g. from `python -c \"import base64,os;print('whsec_'+"
                'base64.b64encode(os.urandom(32)).decode())"`)'
            ) from None
    return out


def signature_headers(
    delivery_id: str, body: str, secrets: Sequence[Webhook], at: datetime
) -> dict[str, str]:
    """The three Standard Webhooks headers for ``body`` sent at ``at``."""
    headers = {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(at.timestamp())),
    }
    if secrets:
        headers["webhook-signature"] = " ".join(
            signer.sign(msg_id=delivery_id, timestamp=at, data=body) for signer in secrets
        )
    return headers


class WebhookSender:
    """POSTs outbox rows to one endpoint, signed with its secrets.

    Parameters
    ----------
    name
        The endpoint's name: the destination is ``webhook:<name>``.
    url
        Where to POST.
    secrets
        Signing secrets, newest first; empty sends unsigned (logged at start-up).
    timeout_s
        Connect, read and write timeout of one attempt: a receiver that hangs costs at most this.
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        secrets: Sequence[str] = (),
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.destination = f"webhook:{name}"
        self.url = url
        self.timeout_s = timeout_s
        # Errors (kept in the outbox, shown by the API) name the endpoint and its host only:
        # receivers' URLs often carry a secret in their path or query.
        parts = httpx.URL(url)
        self._where = f"{self.destination} ({parts.scheme}://{parts.host}{_port(parts)})"
        self._signers = signers(secrets)
        if not self._signers:
            logger.warning("webhook %s has no secret: its deliveries are not signed", name)
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
            headers={"user-agent": f"minder/{__version__}"},
            follow_redirects=False,
        )

    def send(self, delivery: Delivery) -> None:
        body = orjson.dumps(delivery.payload).decode()
        headers = signature_headers(delivery.delivery_id, body, self._signers, datetime.now(tz=UTC))
        headers["content-type"] = "application/json"
        try:
            response = self._client.post(self.url, content=body.encode(), headers=headers)
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"{self.url}: {type(exc).__name__}: {exc}", transient=True
            ) from None
        if 200 <= response.status_code < 300:
            return
        status = response.status_code
        text = response.text[:MAX_LOGGED_CHARS].replace("\n", " ")
        transient = status not in _PERMANENT
        raise DeliveryError(
            f"{self._where} answered {status}: {text}",
            transient=transient,
            status=status,
            retry_after_s=_retry_after(response),
        )

    def close(self) -> None:
        self._client.close()


def _port(url: httpx.URL) -> str:
    return f":{url.port}" if url.port is not None else ""


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return min(3600.0, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(3600.0, max(0.0, (when - datetime.now(tz=UTC)).total_seconds()))
