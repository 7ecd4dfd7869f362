"""Logging configuration, called only by entry points (CLI, service main)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.logging import RichHandler


class LazyRichHandler(logging.Handler):
    """Writes through rich's :class:`~rich.logging.RichHandler` on stderr, built (and rich's
    console, logging and traceback modules imported, about 50 ms) at the first record: a CLI
    command that logs nothing at its level does not pay for it."""

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._inner: RichHandler | None = None
        self._building = False

    def _handler(self) -> logging.Handler:
        """Called under the handler's own (re-entrant) lock, from :meth:`handle`."""
        if self._inner is not None:
            return self._inner
        if self._building:  # a record logged while rich loads: plain stderr, no recursion
            return logging.lastResort or logging.StreamHandler()
        self._building = True
        try:
            from rich.console import Console  # noqa: PLC0415  (see the class)
            from rich.logging import RichHandler  # noqa: PLC0415
            from rich.traceback import Traceback  # noqa: F401, PLC0415  (now, not at EMFILE)

            # stderr, so that a command's output (tables, --format json) stays clean.
            inner = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=True)
            inner.setFormatter(self.formatter)
            self._inner = inner
        finally:
            self._building = False
        return inner

    def setFormatter(self, fmt: logging.Formatter | None) -> None:  # noqa: N802  (logging's name)
        super().setFormatter(fmt)
        if self._inner is not None:
            self._inner.setFormatter(fmt)

    def emit(self, record: logging.LogRecord) -> None:
        # A handler never raises into the code that logs (logging's contract): rich imports its
        # traceback module at the first record with an exception, which fails when the process
        # is out of files, and that error ended the API's event loop.
        try:
            self._handler().handle(record)
        except Exception:
            self.handleError(record)


def configure_logging(level: str = "INFO", *, rich: bool = True) -> None:
    """Configure the root logger once; libraries only call ``logging.getLogger(__name__)``."""
    handler: logging.Handler = LazyRichHandler() if rich else logging.StreamHandler()
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
