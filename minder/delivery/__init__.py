"""Delivery of alert events: outbox workers, Kafka, signed webhooks, Alertmanager."""
