"""Tables of a benchmark run: rich tables for the terminal, a markdown section for RESULTS.md."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from minder.benchmark.evaluate import LatencyStats, Scores
from minder.benchmark.runner import BenchResult, VariantResult


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _sec(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _latency(stats: LatencyStats) -> str:
    """``median / p95`` seconds."""
    if stats.n == 0:
        return "—"
    return f"{_sec(stats.median)} / {_sec(stats.p95)}"


def _sig(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    cell: Callable[[VariantResult], str]
    justify: str = "right"


def _row_note(row: VariantResult) -> str:
    parts = []
    if row.skipped:
        parts.append(f"{len(row.skipped)} skipped")
    if row.errors:
        parts.append(f"{len(row.errors)} failed")
    return ", ".join(parts)


def _alert_counts(scores: Scores) -> str:
    return f"{scores.tp_alerts}/{scores.fp_alerts}/{scores.duplicates}"


def _fa(row: VariantResult) -> str:
    fa = row.summary.false_alarms
    if fa.per_1000_machine_hours is None:
        return "—"
    return f"{fa.per_1000_machine_hours:.2f} ({fa.count})"


_OVERALL: tuple[_Column, ...] = (
    _Column("variant", lambda r: r.variant.label, "left"),
    _Column("cases", lambda r: str(r.cases_run)),
    _Column("P", lambda r: _num(r.summary.overall.precision)),
    _Column("R", lambda r: _num(r.summary.overall.recall)),
    _Column("F1", lambda r: _num(r.summary.overall.f1)),
    _Column("alerts (TP/FP/dup)", lambda r: _alert_counts(r.summary.overall)),
    _Column("fail-stop s (med/p95)", lambda r: _latency(r.summary.fail_stop.latency)),
    _Column("fail-slow s (med/p95)", lambda r: _latency(r.summary.fail_slow.latency)),
    _Column("FA/1000 mh", _fa),
    _Column("stray job alerts", lambda r: str(r.summary.stray_job_alerts.count)),
    _Column("CPU s/job-s", lambda r: _sig(r.summary.cpu.per_job_second)),
    _Column("notes", _row_note, "left"),
)


def overall_table(result: BenchResult) -> Table:
    """One row per variant: P, R, F1, latency, false alarms, CPU."""
    table = Table(title=f"minder bench detect — suite {result.options.suite}, overall")
    for column in _OVERALL:
        table.add_column(column.header, justify=column.justify)  # type: ignore[arg-type]
    for row in result.rows:
        table.add_row(*(escape(column.cell(row)) for column in _OVERALL))
    return table


def _fault_rows(result: BenchResult) -> list[tuple[str, VariantResult, Scores]]:
    kinds = sorted({k for row in result.rows for k in row.summary.by_fault})
    return [
        (kind, row, row.summary.by_fault[kind])
        for kind in kinds
        for row in result.rows
        if kind in row.summary.by_fault
    ]


_FAULT_HEADERS = ("fault", "variant", "faults", "detected", "alerts", "P", "R", "F1", "onset s")


def _fault_cells(kind: str, row: VariantResult, scores: Scores) -> tuple[str, ...]:
    return (
        kind,
        row.variant.label,
        str(scores.instances),
        str(scores.detected),
        str(scores.alerts),
        _num(scores.precision),
        _num(scores.recall),
        _num(scores.f1),
        _latency(scores.latency),
    )


def fault_table(result: BenchResult) -> Table:
    """P, R, F1 and onset-to-alert (median / p95) per fault type and variant."""
    table = Table(title="per fault type (precision over the alerts of that type's cases)")
    for i, header in enumerate(_FAULT_HEADERS):
        table.add_column(header, justify="left" if i < 2 else "right")
    previous = None
    for kind, row, scores in _fault_rows(result):
        if previous is not None and kind != previous and len(result.rows) > 1:
            table.add_section()
        previous = kind
        table.add_row(*(escape(c) for c in _fault_cells(kind, row, scores)))
    return table


def _sizes(result: BenchResult) -> list[int]:
    return sorted({s for row in result.rows for s in row.summary.cpu.by_size})


def cpu_table(result: BenchResult) -> Table:
    """CPU seconds of detection per job-second, by job size."""
    sizes = _sizes(result)
    table = Table(title="CPU s of detection per job-second, by job size (machines)")
    table.add_column("variant")
    for size in sizes:
        table.add_column(str(size), justify="right")
    table.add_column("µs/machine-s", justify="right")
    for row in result.rows:
        by = row.summary.cpu.by_size
        table.add_row(
            escape(row.variant.label),
            *(_sig(by.get(s)) for s in sizes),
            _sig(row.summary.cpu.per_machine_second_us),
        )
    return table


def _notes(result: BenchResult) -> list[str]:
    out = list(result.notes)
    for row in result.rows:
        if row.skipped:
            names = ", ".join(s["case"] for s in row.skipped)
            out.append(f"{row.variant.label}: skipped {len(row.skipped)} case(s): {names}")
        for error in row.errors:
            out.append(f"{row.variant.label}: failed on {error['case']}: {error['error']}")
    return out


def _suite_line(result: BenchResult) -> str:
    cases = result.cases
    free = [c for c in cases if c.is_fault_free]
    sizes = sorted({c.machines for c in cases})
    trained = ", ".join(sorted(result.training.get("models", {}))) or "none"
    return (
        f"{len(cases)} cases ({len(cases) - len(free)} faulty, {len(free)} fault-free = "
        f"{sum(c.machine_hours for c in free):.0f} machine-hours), {sizes[0]}-{sizes[-1]} "
        f"machines; seed {result.options.seed}; models trained: {trained}; "
        f"wall {result.wall_s:.0f} s"
    )


def render(result: BenchResult, console: Console) -> None:
    """Print the run's tables and notes."""
    console.print(escape(_suite_line(result)), highlight=False)
    console.print(overall_table(result))
    console.print(fault_table(result))
    console.print(cpu_table(result))
    for line in straggler_lines(result):
        console.print(escape(line), highlight=False)
    for note in _notes(result):
        console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)


def straggler_lines(result: BenchResult) -> list[str]:
    """Per row with straggler faults: steps from onset to alert by type, and the error of the
    alerts' live slowdown against the S the what-if replay measures on the simulated trace (and,
    as cross-checks, against the simulator's closed-form S)."""
    out = []
    for row in result.rows:
        stats = row.summary.stragglers
        if not stats:
            continue
        steps = ", ".join(
            f"{kind} {v['median']:.0f} (max {v['max']:.0f})"
            for kind, v in stats["steps_to_alert"].items()
        )

        def error(err: dict[str, Any] | None, against: str) -> str:
            if not err or not err["n"]:
                return f"no live S to compare with {against}"
            within = round(err["within_5pct"] * err["n"])
            return (
                f"live S error vs {against} median {100 * err['median']:.1f} %, p95 "
                f"{100 * err['p95']:.1f} %, {within} of {err['n']} within 5 %"
            )

        parts = [
            error(stats.get("slowdown_error"), "replayed S (sync)"),
            error(stats.get("slowdown_error_async"), "closed-form S (async)"),
            error(stats.get("slowdown_error_closed_form"), "closed-form S (all)"),
        ]
        agree = stats.get("replay_vs_closed_form") or {}
        if agree.get("n"):
            parts.append(
                f"replayed vs closed-form S median {100 * agree['median']:.2f} %, max "
                f"{100 * agree['max']:.1f} % (n={agree['n']})"
            )
        out.append(f"{row.variant.label}: steps to alert (median): {steps}; " + "; ".join(parts))
    return out


def straggler_table(result: BenchResult) -> str:
    """Markdown: per straggler case of the first row that has them, the live S at the first
    straggler alert and the true S (replayed over the alert's steps and over the whole fault,
    and closed-form)."""

    def cell(value: Any, fmt: str = ".3f") -> str:
        return "—" if value is None else format(value, fmt)

    for row in result.rows:
        cases = (row.summary.stragglers or {}).get("cases") or []
        if not cases:
            continue
        return _md_table(
            [
                "case",
                "fault",
                "live S",
                "replayed S",
                "error",
                "replayed S (fault)",
                "closed-form S",
            ],
            [
                (
                    c["case"],
                    c["fault"] + ("" if c["sync"] else " (async)"),
                    cell(c["live"]),
                    cell(c["replayed"]),
                    "—" if c["error"] is None else f"{100 * c['error']:.1f} %",
                    cell(c["replayed_fault"]),
                    cell(c["closed_form"]),
                )
                for c in cases
            ],
            left=(0, 1),
        )
    return ""


def _md_table(
    headers: tuple[str, ...] | list[str], rows: list[tuple[str, ...]], left: tuple[int, ...] = (0,)
) -> str:
    """A markdown table; the columns in ``left`` (negative: from the end) are text."""

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    text = {i % len(headers) for i in left}
    aligns = ["---" if i in text else "---:" for i in range(len(headers))]
    return "\n".join([line(headers), line(aligns), *(line(r) for r in rows)])


def markdown(result: BenchResult) -> str:
    """A RESULTS.md section: the command, the suite, and the three tables."""
    overall = _md_table(
        [c.header for c in _OVERALL],
        [tuple(c.cell(row) for c in _OVERALL) for row in result.rows],
        left=(0, -1),
    )
    faults = _md_table(
        _FAULT_HEADERS,
        [_fault_cells(kind, row, s) for kind, row, s in _fault_rows(result)],
        left=(0, 1),
    )
    sizes = _sizes(result)
    cpu = _md_table(
        ["variant", *(str(s) for s in sizes), "µs/machine-s"],
        [
            (
                row.variant.label,
                *(_sig(row.summary.cpu.by_size.get(s)) for s in sizes),
                _sig(row.summary.cpu.per_machine_second_us),
            )
            for row in result.rows
        ],
    )
    notes = "\n".join(f"- {n}" for n in [*straggler_lines(result), *_notes(result)])
    parts = [
        f"### Detection benchmark — suite `{result.options.suite}`",
        "",
        f"```\n{result.command}\n```",
        "",
        _suite_line(result) + ".",
        "Onset→alert in seconds (median / p95); FA/1000 mh: alerts on fault-free jobs per 1000 "
        "machine-hours (count); alerts as true positives / false positives / duplicates.",
        "",
        overall,
        "",
        "Per fault type:",
        "",
        faults,
        "",
        "CPU seconds of detection per job-second, by job size (machines):",
        "",
        cpu,
    ]
    if notes:
        parts += ["", "Notes:", "", notes]
    table = straggler_table(result)
    if table:
        parts += ["", "Live S at the first straggler alert against the true S:", "", table]
    return "\n".join(parts) + "\n"
