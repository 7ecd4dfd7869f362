"""What every command of the ``minder`` CLI shares: consoles, output formats, errors, progress.

It imports nothing of the command modules, so any command module can use it without a cycle.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from collectors.sim.scenario import Scenario
    from minder.config import Settings
    from minder.core.alert import Alert

# Piped output gets a wide console so tables stay readable in logs and files.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


class OutputFormat(StrEnum):
    """How results are printed."""

    table = "table"
    json = "json"


def fail(exc: object) -> typer.Exit:
    """Print ``error: …`` on one line on stderr and return the exit (status 2) to raise."""
    err.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True)
    return typer.Exit(code=2)


def load_settings() -> Settings:
    """The settings from ``MINDER_*`` variables; a bad value exits 2 with one line naming it."""
    from minder.config import Settings, SettingsError  # noqa: PLC0415

    try:
        return Settings.load()
    except SettingsError as exc:
        raise fail(exc) from None


def progress() -> Progress:
    """A transient progress display on stderr."""
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


def alerts_table(alerts: list[Alert], title: str = "Alerts") -> Table:
    """A readable table of alerts."""
    table = Table(title=title, show_lines=False)
    for column in ("job", "machine", "kind", "metric", "devices", "score", "onset", "detected"):
        table.add_column(column, justify="right" if column == "score" else "left")
    for a in alerts:
        table.add_row(
            escape(a.job),
            escape(a.machine),
            a.kind.value,
            a.metric,
            escape(",".join(a.devices)) or "-",
            f"{a.score:.2f}",
            clock(a.first_ts),
            f"{clock(a.detected_ts)} (+{a.detected_ts - a.first_ts:.0f}s)",
        )
    return table


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def load_scenario(name: str) -> Scenario:
    """A scenario file, or the name of a bundled one; exits 2 when it cannot be read."""
    from collectors.sim.scenario import bundled_scenario, load_scenario  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    path = Path(name)
    try:
        if not path.exists() and not name.endswith((".yaml", ".yml")):
            path = bundled_scenario(name)
        return load_scenario(path)
    except (MinderError, FileNotFoundError) as exc:
        raise fail(exc) from None


def scenario_machines(scenario: Scenario) -> int:
    """Machines of all the scenario's jobs."""
    return sum(job.machines for job in scenario.jobs)
