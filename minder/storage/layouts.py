"""Wire layouts (schema 2) shared by every worker through the database (docs/architecture.md §3.2).

A worker saves each layout it learns from a node's announcement (insert-if-absent: replicas
racing on the same layout both succeed, the first row stays) and looks up a layout it does not
know before refusing a batch, so a worker that restarts or takes a partition over decodes the
nodes' batches at once instead of dead-lettering them until the nodes re-announce.
:class:`SqlLayoutStore` is the :class:`minder.core.codec.LayoutStore` the service gives its
decoder.
"""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import Table, select
from sqlalchemy.orm import Session

from minder.core.errors import ValidationError
from minder.storage.engine import SessionFactory, read_only
from minder.storage.jobs import _upsert_construct
from minder.storage.jsonsafe import json_safe
from minder.storage.models import WireLayoutRow

_LAYOUTS = cast(Table, WireLayoutRow.__table__)


def layout_key(layout_id: int) -> str:
    """The stored key of a layout id: its 16 lower-case hex digits."""
    if isinstance(layout_id, bool) or not isinstance(layout_id, int) or not 0 <= layout_id < 2**64:
        raise ValidationError(
            f"layout id {layout_id!r}: expected a layout id (an integer in [0, 2**64))"
        )
    return f"{layout_id:016x}"


def save_layout(
    session: Session, layout_id: int, definition: dict[str, Any], *, now: float | None = None
) -> bool:
    """Store ``definition`` under ``layout_id`` unless a row is there already (``INSERT … ON
    CONFLICT DO NOTHING``: safe under replicas racing). Returns whether this call inserted it.

    The definition is not validated against the id here: readers validate what they load
    (``minder.core.codec``), so a wrong row is refused, never used.
    """
    key = layout_key(layout_id)
    if not isinstance(definition, dict):
        raise ValidationError(
            f"layout 0x{key} definition is {type(definition).__name__}: expected a map "
            "(minder.core.codec.layout_definition)"
        )
    upsert = _upsert_construct(session)
    stmt = (
        upsert(_LAYOUTS)
        .values(
            id=key,
            definition=json_safe(definition, "$.layout_def"),
            first_seen_at=time.time() if now is None else now,
        )
        .on_conflict_do_nothing(index_elements=[_LAYOUTS.c.id])
        .returning(_LAYOUTS.c.id)
    )
    return session.execute(stmt).first() is not None


def load_layout(session: Session, layout_id: int) -> dict[str, Any] | None:
    """The definition stored under ``layout_id``, or ``None``."""
    definition = session.execute(
        select(_LAYOUTS.c.definition).where(_LAYOUTS.c.id == layout_key(layout_id))
    ).scalar_one_or_none()
    return cast("dict[str, Any] | None", definition)


class SqlLayoutStore:
    """The layout store of a service (:class:`minder.core.codec.LayoutStore`): one short
    transaction per call. Errors propagate; the decoder counts them and decodes on."""

    def __init__(self, sessions: SessionFactory) -> None:
        self.sessions = sessions

    def load(self, layout_id: int) -> dict[str, Any] | None:
        with self.sessions() as session:
            return load_layout(read_only(session), layout_id)

    def save(self, layout_id: int, definition: dict[str, Any]) -> None:
        with self.sessions.begin() as session:
            save_layout(session, layout_id, definition)
