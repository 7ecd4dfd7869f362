"""Readiness checks of the database, for the API's ``/ready``."""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from minder.storage.engine import SessionFactory, read_only
from minder.storage.migrate import schema_is_current

logger = logging.getLogger(__name__)


def database_status(factory: SessionFactory) -> dict[str, bool]:
    """``{"database": reachable, "schema": migrated to head}``, never raising.

    A failure is logged with its reason (the API answers only true/false).
    """
    try:
        with factory() as session:
            read_only(session).execute(text("SELECT 1"))
            bind = session.get_bind()
    except SQLAlchemyError as exc:
        logger.warning("database unreachable: %s", exc)
        return {"database": False, "schema": False}
    engine = bind if isinstance(bind, Engine) else bind.engine
    try:
        current = schema_is_current(engine)
    except SQLAlchemyError as exc:
        logger.warning("cannot read the schema revision: %s", exc)
        current = False
    if not current:
        logger.warning("database schema is not at the latest revision: run the migrations")
    return {"database": True, "schema": current}
