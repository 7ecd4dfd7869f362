"""Logging configuration, called only by entry points (CLI, service main)."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler


def configure_logging(level: str = "INFO", *, rich: bool = True) -> None:
    """Configure the root logger once; libraries only call ``logging.getLogger(__name__)``."""
    handler: logging.Handler = (
        # stderr, so that a command's output (tables, --format json) stays clean on stdout.
        RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=True)
        if rich
        else logging.StreamHandler()
    )
    logging.basicConfig(
        level=level.upper(),
        format="%(message)s" if rich else "%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[handler],
        force=True,
    )
    # kafka-python logs every reconnect attempt at INFO/WARNING; keep the console readable.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    # Alembic narrates every migration step at INFO; the service logs the resulting revision.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))
    # httpx logs every request at INFO (the Prometheus source polls every step).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    # The detection handler runs inside the consumer's poll on purpose (offsets are committed
    # after processing), which kafka-python's selector reports as a blocked event loop.
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
