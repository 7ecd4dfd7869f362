"""What every command of the ``minder`` CLI shares: consoles, output formats, errors, progress.

It imports nothing of the command modules, so any command module can use it without a cycle.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from collectors.sim.scenario import Scenario
    from minder.config import Settings
    from minder.core.alert import Alert

# Piped output gets a wide console so tables stay readable in logs and files.
out = Console(width=None if sys.stdout.isatty() else 160)
# A line on stderr that is not a terminal (journald, kubectl logs, a file) is one line: no wrap.
err = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


class OutputFormat(StrEnum):
    """How results are printed."""

    table = "table"
    json = "json"


def fail(exc: object) -> typer.Exit:
    """Print ``error: …`` on one line on stderr and return the exit (status 2) to raise."""
    err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
    return typer.Exit(code=2)


def status(message: str) -> None:
    """A status line of a long-running command (serving on…, stopping): under the plain and
    JSON log formats a log record like the others (shown whatever the level), else a line."""
    from minder.logging_setup import log_status  # noqa: PLC0415

    if not log_status(message):
        err.print(escape(message))


def load_settings() -> Settings:
    """The settings from ``MINDER_*`` variables; a bad value exits 2 with one line naming it."""
    from minder.config import Settings, SettingsError  # noqa: PLC0415

    try:
        return Settings.load()
    except SettingsError as exc:
        raise fail(exc) from None


# -- Kafka connection options (agent --kafka, simulate --kafka, serve) ------------------------

KafkaSecurityProtocolOption = Annotated[
    str | None,
    typer.Option(
        "--kafka-security-protocol",
        help="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (default: "
        "MINDER_KAFKA__SECURITY_PROTOCOL, else PLAINTEXT)",
        show_default=False,
    ),
]
KafkaCaFileOption = Annotated[
    Path | None,
    typer.Option(
        "--kafka-ca-file",
        help="PEM CA certificates of the brokers (default: MINDER_KAFKA__SSL_CAFILE, else the "
        "system's)",
        show_default=False,
    ),
]
KafkaCertFileOption = Annotated[
    Path | None,
    typer.Option(
        "--kafka-cert-file",
        help="PEM client certificate for mutual TLS (MINDER_KAFKA__SSL_CERTFILE); the key's "
        "password only from MINDER_KAFKA__SSL_PASSWORD",
        show_default=False,
    ),
]
KafkaKeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--kafka-key-file",
        help="PEM private key of --kafka-cert-file, if not in it (MINDER_KAFKA__SSL_KEYFILE)",
        show_default=False,
    ),
]
KafkaSaslMechanismOption = Annotated[
    str | None,
    typer.Option(
        "--kafka-sasl-mechanism",
        help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (MINDER_KAFKA__SASL_MECHANISM)",
        show_default=False,
    ),
]
KafkaSaslUsernameOption = Annotated[
    str | None,
    typer.Option(
        "--kafka-sasl-username",
        help="SASL user name (MINDER_KAFKA__SASL_USERNAME)",
        show_default=False,
    ),
]
KafkaSaslPasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        "--kafka-sasl-password-file",
        help="file holding the SASL password (one line); else MINDER_KAFKA__SASL_PASSWORD. "
        "Never on the command line",
        show_default=False,
    ),
]


@dataclass(frozen=True, slots=True)
class KafkaFlags:
    """The Kafka connection options given on a command line (``None``: not given)."""

    security_protocol: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_file: Path | None = None

    # field of KafkaFlags -> (field of KafkaSettings, command line option)
    OPTIONS: ClassVar[dict[str, tuple[str, str]]] = {
        "security_protocol": ("security_protocol", "--kafka-security-protocol"),
        "ca_file": ("ssl_cafile", "--kafka-ca-file"),
        "cert_file": ("ssl_certfile", "--kafka-cert-file"),
        "key_file": ("ssl_keyfile", "--kafka-key-file"),
        "sasl_mechanism": ("sasl_mechanism", "--kafka-sasl-mechanism"),
        "sasl_username": ("sasl_username", "--kafka-sasl-username"),
        "sasl_password_file": ("sasl_password", "--kafka-sasl-password-file"),
    }

    def given(self) -> list[str]:
        """The command line options given, e.g. ``["--kafka-ca-file"]``."""
        return [flag for name, (_, flag) in self.OPTIONS.items() if getattr(self, name) is not None]


def load_settings_with_kafka(flags: KafkaFlags, bootstrap: str | None = None) -> Settings:
    """:func:`load_settings` with the Kafka options given (``bootstrap``: ``--kafka``) over their
    ``MINDER_KAFKA__*`` variables, all checked together.

    A bad value exits 2 with one line naming the option, or the variable when it came from the
    environment, and what is expected; secrets are hidden.
    """
    from minder.config import ENV_DELIMITER, ENV_PREFIX, Settings, SettingsError  # noqa: PLC0415

    changes: dict[str, Any] = {}
    names: dict[str, str] = {}
    if bootstrap is not None:
        changes["bootstrap"], names["bootstrap"] = bootstrap, "--kafka"
    for name, (field, flag) in KafkaFlags.OPTIONS.items():
        value = getattr(flags, name)
        if value is not None:
            changes[field] = _read_password(value, flag) if field == "sasl_password" else value
            names[field] = flag
    try:
        return Settings.load(kafka=changes) if changes else Settings.load()
    except SettingsError as exc:
        message = str(exc)
        for field, flag in names.items():  # a value given as an option is named by the option
            message = message.replace(
                f"{ENV_PREFIX}KAFKA{ENV_DELIMITER}{field.upper()}=", f"{flag}="
            )
        raise fail(message) from None


def _read_password(path: Path, flag: str) -> str:
    """The first line of ``path`` (a password file: its line break is not part of it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise fail(
            f"{flag} {path}: cannot be read ({why}): expected a readable text file"
        ) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise fail(f"{flag} {path}: its first line is empty: expected the password")
    return password


def progress() -> Progress:
    """A transient progress display on stderr."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


def job_reporter(bar: Progress) -> Callable[[str, int, int], None]:
    """``report(job, seconds_done, seconds_total)`` that keeps one bar per job."""
    tasks: dict[str, TaskID] = {}

    def report(job: str, done: int, total: int) -> None:
        if job not in tasks:
            tasks[job] = bar.add_task(f"job {escape(job)}", total=total)
        bar.update(tasks[job], completed=done)

    return report


def clock(ts: float) -> str:
    """``HH:MM:SS`` (UTC) of a unix time."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S")


def alerts_table(
    alerts: list[Alert],
    title: str = "Alerts",
    times: Mapping[str, tuple[float, float]] | None = None,
) -> Table:
    """A readable table of alerts: each one's onset and when it was detected (data time, the
    seconds in between). With ``times`` (``(onset, alerted)`` by alert id: ``minder demo``'s
    end-to-end view), the onset and the time the alert was received instead, the seconds in
    between to a tenth, as the demo's summary gives them."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=title, show_lines=False)
    last = "detected" if times is None else "alerted"
    for column in ("job", "machine", "kind", "metric", "devices", "score", "onset", last):
        table.add_column(column, justify="right" if column == "score" else "left")
    for a in alerts:
        if times is None or a.id not in times:
            onset, when, delay = a.first_ts, a.detected_ts, f"{a.detected_ts - a.first_ts:.0f}"
        else:
            onset, when = times[a.id]
            delay = f"{round(when - onset, 1):.1f}"
        table.add_row(
            escape(a.job),
            escape(a.machine),
            a.kind.value,
            a.metric,
            escape(",".join(a.devices)) or "-",
            f"{a.score:.2f}",
            clock(onset),
            f"{clock(when)} (+{delay}s)",
        )
    return table


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def load_scenario(name: str) -> Scenario:
    """:func:`collectors.sim.scenario.resolve_scenario` (a scenario file, or the name of a bundled
    one); exits 2 when it cannot be read."""
    from collectors.sim.scenario import resolve_scenario  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    try:
        return resolve_scenario(name)
    except (MinderError, FileNotFoundError) as exc:
        raise fail(exc) from None
