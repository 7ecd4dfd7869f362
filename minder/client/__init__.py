"""Clients of Minder's own systems for other programs: :mod:`minder.client.api`, a small typed
client of the HTTP API (``/api/v1``) that the operator commands use. It imports httpx only when a
client is made, and nothing of FastAPI, Kafka or storage."""
