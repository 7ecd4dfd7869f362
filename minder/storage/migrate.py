"""Alembic migrations, driven from code (no ``alembic.ini`` in the working directory)."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from minder.core.errors import StorageError
from minder.storage.engine import create_engine_for, normalise_url

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

_LOCK_KEY = 0x4D494E444552  # "MINDER": the advisory lock that serialises migrations


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic config for Minder's migrations, for any ``alembic.command``.

    With ``url``, commands that open their own connection (``current``, ``upgrade``,
    ``revision --autogenerate``) use it.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        rendered = normalise_url(url).render_as_string(hide_password=False)
        # the config is a ConfigParser: '%' would start an interpolation
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade_database(url_or_engine: str | URL | Engine, revision: str = "head") -> None:
    """Bring the schema of a database to ``revision`` (the latest by default); idempotent."""
    engine = (
        url_or_engine if isinstance(url_or_engine, Engine) else create_engine_for(url_or_engine)
    )
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                # two processes starting at once (API, service) must not both create the tables;
                # SQLite gets the same from BEGIN IMMEDIATE
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    except DBAPIError as exc:
        # One line naming the database (without its password) and the driver's first line, not
        # SQLAlchemy's multi-line message with its background link.
        where = engine.url.render_as_string(hide_password=True)
        reason = (
            str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
        )
        raise StorageError(
            f"cannot use the database {where}: {reason}; check MINDER_DATABASE__URL"
        ) from None
    else:
        logger.info(
            "database %s at revision %s",
            engine.url.render_as_string(hide_password=True),
            revision,
        )
    finally:
        if engine is not url_or_engine:
            engine.dispose()


@cache
def head_revisions() -> frozenset[str]:
    """The head revision(s) of the migration scripts."""
    return frozenset(ScriptDirectory.from_config(alembic_config()).get_heads())


def current_revisions(engine: Engine) -> frozenset[str]:
    """The revision(s) the database is at (empty when it was never migrated)."""
    with engine.connect() as connection:
        return frozenset(MigrationContext.configure(connection).get_current_heads())


def schema_is_current(engine: Engine) -> bool:
    """Whether the database is migrated to the head revision."""
    return current_revisions(engine) == head_revisions()
