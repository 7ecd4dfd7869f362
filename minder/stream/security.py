"""The connection options every Kafka client of Minder shares: security protocol, TLS, SASL.

They come from :meth:`minder.config.KafkaSettings.client_options` (entry points build them; this
layer never reads the environment) and go, unchanged, to every producer, consumer and admin
client: :func:`connection_config` checks that they hold nothing else, since a producer setting
would break a consumer and the other way round.

kafka-python's admin client logs its whole configuration at DEBUG, passwords included; a filter
on that logger hides every ``*password*`` value (installed when this module is imported).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from minder.core.errors import ValidationError

CONNECTION_OPTIONS: frozenset[str] = frozenset(
    key
    for key in set(KafkaProducer.DEFAULT_CONFIG)
    & set(KafkaConsumer.DEFAULT_CONFIG)
    & set(KafkaAdminClient.DEFAULT_CONFIG)
    if key == "security_protocol" or key.startswith(("ssl_", "sasl_"))
)
"""Keys :func:`connection_config` accepts: security settings every kafka-python client takes."""

HIDDEN = "<hidden>"


def connection_config(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` (``{}`` for ``None``) after checking each key is a connection option.

    Raises
    ------
    ValidationError
        A key outside :data:`CONNECTION_OPTIONS`, e.g. a producer-only setting.
    """
    unknown = sorted(set(options or {}) - CONNECTION_OPTIONS)
    if unknown:
        raise ValidationError(
            f"Kafka client options {unknown}: expected only connection settings "
            "(security_protocol, ssl_*, sasl_*) that every client takes"
        )
    return dict(options or {})


def redacted(value: object) -> object:
    """``value`` with every mapping entry whose key names a password replaced by ``<hidden>``."""
    if isinstance(value, Mapping):
        return {
            key: HIDDEN if "password" in str(key).lower() and item is not None else redacted(item)
            for key, item in value.items()
        }
    if isinstance(value, tuple):
        return tuple(redacted(item) for item in value)
    return value


class _HidePasswords(logging.Filter):
    """Rewrites the arguments of a log record so that no password is formatted into it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, Mapping):  # logging unpacks a lone mapping argument
            record.args = redacted(record.args)  # type: ignore[assignment]
        elif record.args:
            record.args = tuple(redacted(arg) for arg in record.args)
        return True


_HIDE_PASSWORDS = _HidePasswords()
logging.getLogger("kafka.admin.client").addFilter(_HIDE_PASSWORDS)
