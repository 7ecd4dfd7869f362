"""Tables of an independent-suite run, kept apart from the tuned suites' report: per cadence
precision, recall, false alarms per 1000 fault-free machine-hours and onset-to-alert, and the
recall of every fault class at every cadence."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from minder.benchmark.independent.cases import INDEPENDENT_STREAM
from minder.benchmark.independent.run import IndependentResult

_CADENCE_HEADERS = (
    "variant",
    "interval s",
    "cases",
    "P",
    "R",
    "F1",
    "alerts (TP/FP/dup)",
    "FA/1000 mh (count)",
    "stray job alerts",
    "onset s (median)",
    "onset samples",
    "notes",
)


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _cadence_cells(result: IndependentResult) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for row, figures in zip(result.rows, result.per_cadence(), strict=True):
        overall = row.summary.overall
        fa = figures["false_alarms_per_1000_machine_hours"]
        notes = []
        if row.skipped:
            notes.append(f"{len(row.skipped)} skipped")
        if row.errors:
            notes.append(f"{len(row.errors)} failed")
        out.append(
            (
                row.variant.label,
                str(figures["interval_s"]),
                str(row.cases_run),
                _num(figures["precision"]),
                _num(figures["recall"]),
                _num(figures["f1"]),
                f"{overall.tp_alerts}/{overall.fp_alerts}/{overall.duplicates}",
                "—" if fa is None else f"{fa:.1f} ({figures['false_alarms']})",
                str(figures["stray_job_alerts"]),
                _num(figures["onset_to_alert_median_s"], 0),
                _num(figures["onset_to_alert_median_samples"], 1),
                ", ".join(notes),
            )
        )
    return out


def _class_cells(result: IndependentResult) -> tuple[list[str], list[tuple[str, ...]]]:
    """Headers (class, then one column per row) and per class ``detected/instances``."""
    figures = result.per_cadence()
    kinds = sorted({k for f in figures for k in f["recall_by_fault"]})
    headers = ["fault class", *(f["variant"] for f in figures)]
    rows = []
    for kind in kinds:
        cells = [kind]
        for f in figures:
            hit = f["recall_by_fault"].get(kind)
            cells.append("—" if hit is None else f"{hit['detected']}/{hit['instances']}")
        rows.append(tuple(cells))
    return headers, rows


def suite_lines(result: IndependentResult) -> list[str]:
    """One line per interval: the cases and fault-free machine-hours; the seed stream."""
    out = [
        f"suite {result.options.suite}, seed {result.options.seed}, stream "
        f"{INDEPENDENT_STREAM} (never used for tuning); detection by "
        f"detectors.offline.detect_table; models trained: "
        f"{', '.join(sorted(result.training.get('models', {}))) or 'none'}; wall "
        f"{result.wall_s:.0f} s"
    ]
    for interval, cases in result.cases.items():
        free = [c for c in cases if c.is_fault_free]
        sizes = sorted({c.machines for c in cases}) or [0]
        out.append(
            f"@{interval}s: {len(cases)} cases ({len(cases) - len(free)} faulty, {len(free)} "
            f"fault-free = {sum(c.machine_hours for c in free):.0f} machine-hours), "
            f"{sizes[0]}-{sizes[-1]} machines"
        )
    return out


def _notes(result: IndependentResult) -> list[str]:
    out = list(result.notes)
    for row in result.rows:
        for error in row.errors:
            out.append(f"{row.variant.label}: failed on {error['case']}: {error['error']}")
    return out


def render_independent(result: IndependentResult, console: Console) -> None:
    """Print the run's tables and notes."""
    for line in suite_lines(result):
        console.print(escape(line), highlight=False)
    table = Table(title=f"minder bench detect — suite {result.options.suite}, per cadence")
    for i, header in enumerate(_CADENCE_HEADERS):
        table.add_column(header, justify="left" if i in (0, len(_CADENCE_HEADERS) - 1) else "right")
    for cells in _cadence_cells(result):
        table.add_row(*(escape(c) for c in cells))
    console.print(table)
    headers, rows = _class_cells(result)
    classes = Table(title="recall per fault class (detected/instances)")
    for i, header in enumerate(headers):
        classes.add_column(header, justify="left" if i == 0 else "right")
    for cells in rows:
        classes.add_row(*(escape(c) for c in cells))
    console.print(classes)
    for note in _notes(result):
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)


def _md_table(headers: list[str] | tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    def line(cells: Any) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    text = {0, len(headers) - 1} if headers[-1] == "notes" else {0}
    aligns = ["---" if i in text else "---:" for i in range(len(headers))]
    return "\n".join([line(headers), line(aligns), *(line(r) for r in rows)])


def markdown_independent(result: IndependentResult) -> str:
    """A RESULTS.md section: the command, the suite, the per-cadence and per-class tables."""
    headers, rows = _class_cells(result)
    parts = [
        f"### Detection benchmark — independent suite `{result.options.suite}`",
        "",
        f"```\n{result.command}\n```",
        "",
        *(f"{line}." for line in suite_lines(result)),
        "",
        "Onset→alert: median over detected faults, in seconds and in samples; FA/1000 mh: alerts "
        "on fault-free jobs per 1000 machine-hours (count); alerts as true positives / false "
        "positives / duplicates; stray job alerts: hangs no fault explains (a checkpoint the "
        "loop did not report), apart from the machine alerts.",
        "",
        _md_table(_CADENCE_HEADERS, _cadence_cells(result)),
        "",
        "Recall per fault class (detected / instances):",
        "",
        _md_table(headers, rows),
    ]
    notes = _notes(result)
    if notes:
        parts += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    return "\n".join(parts) + "\n"
