"""Logging configuration, called only by entry points (CLI, service main).

Three formats, one handler on stderr (``MINDER_LOG__FORMAT``, docs/operations.md, *Logs*):

- ``rich``: coloured and aligned, for a person at a terminal;
- ``plain``: one line per record, ``2026-11-28T01:56:45.123Z INFO minder.service.engine: …``,
  for journald, ``kubectl logs`` and grep (line breaks of a message or traceback are written
  ``\\n``);
- ``json``: one JSON object per record: ``time``, ``level``, ``logger``, ``message``, and ``job``
  and ``machine`` where known (:func:`context_of`), ``exception`` with a traceback;
- ``auto`` (the default): ``rich`` when stderr is a terminal, ``plain`` otherwise.

Libraries (kafka-python, uvicorn, httpx, alembic) log through the same handler at WARNING and
above; kafka-python's connection errors, a dozen a second while a broker is away, are shown once
a minute with the count of those left out (:class:`KafkaConnectionErrors`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.logging import RichHandler

LOG_FORMATS: tuple[str, ...] = ("auto", "rich", "plain", "json")
"""What ``MINDER_LOG__FORMAT`` takes."""

THIRD_PARTY: tuple[str, ...] = (
    "kafka",
    "uvicorn",
    "httpx",
    "httpcore",
    "alembic",
    "urllib3",
    "kubernetes",
    "asyncio",
    "multipart",
)
"""Libraries whose loggers pass WARNING and above only, through Minder's handler."""

CONTEXT_FIELDS: tuple[str, ...] = ("job", "machine")
"""Attributes of a record (``extra=``) that the JSON format carries as fields of their own."""


def iso_time(created: float) -> str:
    """``2026-11-28T01:56:45.123Z``: ISO 8601, UTC, milliseconds."""
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _one_line(text: str) -> str:
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")


def context_of(record: logging.LogRecord) -> dict[str, str]:
    """``job`` and ``machine`` of a record: its attributes (``extra={"job": …}``), else the
    job of a message that begins ``"job %s"``, the service's convention."""
    found = {}
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            found[name] = str(value)
    if (
        "job" not in found
        and isinstance(record.msg, str)
        and record.msg.startswith("job %s")
        and isinstance(record.args, tuple)
        and record.args
    ):
        found["job"] = str(record.args[0])
    return found


class PlainFormatter(logging.Formatter):
    """One line per record: ISO 8601 time, level, logger, message (and traceback), line breaks
    written ``\\n`` so that a record never spans two lines of a journal."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        return f"{iso_time(record.created)} {record.levelname} {record.name}: {_one_line(text)}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, then ``job`` and
    ``machine`` when the record has them, ``exception`` when it carries one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(context_of(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class KafkaConnectionErrors(logging.Filter):
    """Shows kafka-python's connection errors at most once per ``window_s``.

    While a broker is away (a restart, a network cut), kafka-python logs every failed attempt of
    every connection, three or four records each, ERROR: about a hundred lines for a ten-second
    restart. The first is shown; the others in the next ``window_s`` are counted, and the next
    one shown says how many were left out. A request cancelled because its client closes (a
    clean stop) is no error: kafka-python's fetcher logs it at INFO, its metadata refresh at
    ERROR; it is left out. Other kafka-python records pass unchanged.
    """

    CANCELLED = re.compile(r"\bCancelled\b")

    PATTERN = re.compile(
        r"KafkaConnectionError|NodeNotReady|No node available|socket disconnected|"
        r"Connection (?:lost|failed|refused)|ECONNREFUSED|ECONNRESET|coordinator dead|"
        r"Coordinator(?:NotAvailable| unknown)|KafkaTimeoutError|Request timed out|"
        r"Unable to connect|Error sending \w+Request|\[Errno \d+\]",
        re.IGNORECASE,
    )

    def __init__(self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._shown_at: float | None = None
        self._hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == "kafka" or record.name.startswith("kafka.")):
            return True
        message = record.getMessage()
        if self.CANCELLED.search(message):
            return False
        if not self.PATTERN.search(message):
            return True
        with self._lock:
            now = self._clock()
            if self._shown_at is not None and now - self._shown_at < self.window_s:
                self._hidden += 1
                return False
            hidden, self._hidden, self._shown_at = self._hidden, 0, now
        note = f"Kafka connection errors are shown once per {self.window_s:g} s"
        if hidden:
            note += f"; {hidden} left out since the last one"
        record.msg, record.args = f"{message} ({note})", None
        return True


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
            inner = RichHandler(
                console=Console(stderr=True),
                show_path=False,
                rich_tracebacks=True,
                log_time_format="[%Y-%m-%d %H:%M:%S]",
            )
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


def resolve_format(chosen: str, stream: TextIO | None = None) -> str:
    """``rich``, ``plain`` or ``json``: ``auto`` is ``rich`` on a terminal, else ``plain``.

    Raises
    ------
    ValueError
        ``chosen`` is not one of :data:`LOG_FORMATS`.
    """
    kind = chosen.strip().lower()
    if kind not in LOG_FORMATS:
        raise ValueError(f"log format {chosen[:40]!r}: expected {', '.join(LOG_FORMATS)}")
    if kind != "auto":
        return kind
    target = sys.stderr if stream is None else stream
    try:
        return "rich" if target.isatty() else "plain"
    except (AttributeError, ValueError):  # a closed or unusual stream
        return "plain"


def _through_ours(logger: logging.Logger, level: int) -> None:
    """``logger`` at ``level``, without handlers of its own: its records reach the root's."""
    logger.setLevel(level)
    logger.propagate = True
    for own in list(logger.handlers):
        logger.removeHandler(own)


def configure_logging(level: str = "INFO", format: str = "auto") -> None:
    """Configure the root logger (again: the last call wins); libraries only call
    ``logging.getLogger(__name__)``.

    Raises
    ------
    ValueError
        An unknown level or format (the settings check both before).
    """
    kind = resolve_format(format)
    handler: logging.Handler
    if kind == "rich":
        handler = LazyRichHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if kind == "json" else PlainFormatter())
    handler.addFilter(KafkaConnectionErrors())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    floor = max(logging.WARNING, logging.getLogger().level)
    existing = [name for name in logging.root.manager.loggerDict if "." in name]
    for name in THIRD_PARTY:
        for child in [n for n in existing if n.startswith(name + ".")]:
            _through_ours(logging.getLogger(child), logging.NOTSET)  # the library's floor
        _through_ours(logging.getLogger(name), floor)
    # The detection handler runs inside the consumer's poll on purpose (offsets are committed
    # after processing), which kafka-python's selector reports as a blocked event loop.
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    # An exception that ends a thread, or that a finaliser (__del__) cannot raise, is printed by
    # Python on stderr past any handler: make it a record like the others (one line in plain).
    threading.excepthook = _log_thread_exception
    sys.unraisablehook = _log_unraisable


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):
        return
    try:
        name = args.thread.name if args.thread is not None else "?"
        logging.getLogger("minder").error(
            "uncaught exception in thread %s",
            name,
            exc_info=args.exc_value if args.exc_value is not None else False,
        )
    except Exception:  # logging torn down (interpreter shutdown): Python's own printing
        threading.__excepthook__(args)


def _log_unraisable(unraisable: sys.UnraisableHookArgs) -> None:
    try:
        try:
            where = repr(unraisable.object)[:200]
        except Exception:
            where = type(unraisable.object).__name__
        logging.getLogger("minder").error(
            "%s %s",
            unraisable.err_msg or "Exception ignored in",
            where,
            exc_info=unraisable.exc_value if unraisable.exc_value is not None else False,
        )
    except Exception:
        sys.__unraisablehook__(unraisable)


def log_status(message: str, name: str = "minder") -> bool:
    """Write ``message`` as an INFO record of logger ``name``, whatever the level, when the plain
    or JSON format is on: a long-running command's status lines (serving on…, stopping) then
    read like its log. ``False`` under rich, where the caller prints it."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, PlainFormatter | JsonFormatter):
            record = logging.getLogger(name).makeRecord(
                name, logging.INFO, "(status)", 0, message, (), None
            )
            handler.handle(record)
            return True
    return False
