"""The wire formats of a node batch, by name (docs/architecture.md §3.2).

Apart from :mod:`minder.core.encode`, which encodes them (with msgpack), and
:mod:`minder.core.codec`, which decodes them (with numpy), so that a command's ``--help`` can list
them without importing either.
"""

from __future__ import annotations

from enum import StrEnum


class WireFormat(StrEnum):
    """Encodings the codec writes."""

    MSGPACK = "msgpack"
    """Schema 1 in msgpack: every sample named (what consumers before schema 2 read)."""
    JSON = "json"
    """Schema 1 in JSON."""
    PACKED = "packed"
    """Schema 2: layout id and float32 values in a msgpack envelope."""


DEFAULT_FORMAT = WireFormat.MSGPACK
"""Format of :func:`minder.core.codec.encode_batch` (stateless: schema 1 unless asked)."""
AGENT_FORMAT = WireFormat.PACKED
"""Format the node agent and :class:`~minder.stream.producer.BatchProducer` write by default."""
