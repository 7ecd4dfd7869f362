"""Alert events onto the alerts topic (``minder.alerts.v1``), from the outbox.

Each event is published keyed by job with the ``webhook-id``-style delivery id in a header, and
counts as delivered only once the broker acknowledged it.
"""

from __future__ import annotations

from minder.core.errors import MinderError
from minder.delivery.worker import DeliveryError
from minder.storage.outbox import Delivery
from minder.stream.producer import AlertPublisher


class KafkaSender:
    """Publishes outbox rows to the alerts topic and waits for the broker's acknowledgement."""

    destination = "kafka"

    def __init__(self, publisher: AlertPublisher, *, ack_timeout_s: float = 10.0) -> None:
        self.publisher = publisher
        self.timeout_s = ack_timeout_s

    def send(self, delivery: Delivery) -> None:
        failed_before = self.publisher.stats.failed
        headers = [
            ("minder-delivery-id", delivery.delivery_id.encode()),
            ("minder-event", delivery.event.encode()),
        ]
        if delivery.alert_id:
            headers.append(("minder-alert-id", delivery.alert_id.encode()))
        try:
            self.publisher.publish(delivery.job or "", delivery.payload, headers=headers)
            self.publisher.flush(self.timeout_s)
        except MinderError as exc:
            raise DeliveryError(f"alerts topic: {exc}", transient=True) from None
        if self.publisher.stats.failed > failed_before:
            raise DeliveryError(
                f"alerts topic: the broker refused it ({self.publisher.stats.last_error})",
                transient=True,
            )

    def close(self) -> None:
        self.publisher.close()
