"""``minder bench``: benchmarks (registered by ``minder/cli/app.py``).

``minder bench detect`` runs detection methods over a labelled suite of simulated jobs and
reports precision, recall, F1, onset-to-alert latency, false alarms per 1000 machine-hours and
CPU cost (see :mod:`minder.benchmark`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from minder.cli.common import OutputFormat, err, out

if TYPE_CHECKING:
    from minder.benchmark.runner import BenchOptions

# The benchmark's defaults, written out so that ``--help`` need not import the benchmark (its
# simulator, detectors, numpy and pandas); tests/minder/cli/test_cli_imports.py checks them
# against minder.benchmark.replay.DEFAULT_GRACE_S and minder.benchmark.runner.DEFAULT_MAX_MACHINES.
DEFAULT_GRACE_S = 2
DEFAULT_MAX_MACHINES_FOR = "pairwise=512,lof=512,iforest=512"

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks of the detectors on labelled simulated jobs.",
    no_args_is_help=True,
    add_completion=False,
)


class Suite(StrEnum):
    """Suites of ``minder bench detect``."""

    quick = "quick"
    standard = "standard"
    full = "full"
    stragglers = "stragglers"
    realism = "realism"
    independent = "independent"
    independent_large = "independent-large"


INDEPENDENT_SUITES = (Suite.independent, Suite.independent_large)
"""Suites of the independent generator (minder.benchmark.independent), never used for tuning:
run and reported apart from the simulator's."""


@bench_app.callback()
def _bench() -> None:
    """Benchmarks of the detectors on labelled simulated jobs."""


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_limits(text: str) -> dict[str, int]:
    """``pairwise=512,lof=256`` → ``{"pairwise": 512, "lof": 256}``; ``none`` → no limit."""
    if text.strip().lower() in ("", "none"):
        return {}
    out: dict[str, int] = {}
    for part in _split(text):
        method, sep, value = part.partition("=")
        try:
            limit = int(value)
        except ValueError:
            limit = -1
        if not sep or limit < 0:
            raise typer.BadParameter(
                f"{part!r} is not METHOD=MACHINES: expected e.g. 'pairwise=512,lof=256' or 'none'"
            )
        out[method.strip()] = limit
    return out


def _intervals(text: str) -> tuple[int, ...]:
    """``1,5,15,60`` → ``(1, 5, 15, 60)``."""
    try:
        return tuple(int(part) for part in _split(text))
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a list of whole seconds: expected e.g. '1,5,15,60'"
        ) from None


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str, float, int], None] | None]:
    """A rich progress bar on stderr: one step per case and variant."""
    if not enabled:
        yield None
        return
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=None)

        def update(description: str, done: float, total: int) -> None:
            bar.update(task, description=escape(description), completed=done, total=total)

        yield update


@bench_app.command("detect")
def detect_command(
    suite: Annotated[
        Suite,
        typer.Option(
            help="Scenario suite; 'independent' and 'independent-large' are jobs of a second "
            "generator, never used for tuning, reported per --intervals cadence (e.g. "
            "--intervals 1,5,10,15,30,60)."
        ),
    ] = Suite.standard,
    methods: Annotated[
        str,
        typer.Option(
            help="Comma-separated: minder, pairwise, mahalanobis, iforest, ecod, copod, lof."
        ),
    ] = "minder",
    ablations: Annotated[
        bool,
        typer.Option(
            "--ablations", help="Add minder rows without denoiser, continuity, prioritisation."
        ),
    ] = False,
    denoisers: Annotated[
        str,
        typer.Option(help="Add a 'minder [DENOISER]' row for each (mean, median, ewma, pca, …)."),
    ] = "",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the suite and training suite.")] = 0,
    train: Annotated[
        bool, typer.Option("--train/--no-train", help="Train the engine's model first.")
    ] = True,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="Print tables or JSON.")
    ] = OutputFormat.table,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write the JSON results here.")
    ] = None,
    markdown_file: Annotated[
        Path | None,
        typer.Option("--markdown", help="Write a markdown section (tables + command) here."),
    ] = None,
    max_machines_for: Annotated[
        str,
        typer.Option(
            help="Largest job per slow method, METHOD=MACHINES,… ('none': no limit); bigger "
            "cases are skipped and reported."
        ),
    ] = DEFAULT_MAX_MACHINES_FOR,
    grace: Annotated[
        int, typer.Option(min=0, help="Seconds each second waits for late samples.")
    ] = DEFAULT_GRACE_S,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr.")
    ] = True,
    intervals: Annotated[
        str,
        typer.Option(
            help="Comma-separated sampling intervals (s) to run every row at, e.g. 1,5,15,60: "
            "the suite as a scrape at that interval sees it."
        ),
    ] = "1",
) -> None:
    """Run detection methods over a labelled suite and report P/R/F1, latency, false alarms
    and CPU cost."""
    from minder.benchmark.report import markdown, render  # noqa: PLC0415
    from minder.benchmark.runner import BenchOptions, run_benchmark  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    try:
        options = BenchOptions(
            suite=suite.value,
            seed=seed,
            methods=_split(methods),
            ablations=ablations,
            denoisers=_split(denoisers),
            train=train,
            max_machines=parse_limits(max_machines_for),
            grace_s=grace,
            intervals=_intervals(intervals),
        )
    except ValueError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=2) from None
    if suite in INDEPENDENT_SUITES:
        _independent(options, output_format, output, markdown_file, progress)
        return
    try:
        with _progress(progress and err.is_terminal) as update:
            result = run_benchmark(options, progress=update)
    except MinderError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=1) from None
    _write(result.to_dict(), output, markdown_file, lambda: markdown(result))
    if output_format is OutputFormat.json:
        sys.stdout.write(_json(result.to_dict()) + "\n")
    else:
        render(result, out)


def _json(data: dict[str, Any]) -> str:
    import orjson  # noqa: PLC0415

    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()


def _write(
    data: dict[str, Any],
    output: Path | None,
    markdown_file: Path | None,
    markdown_text: Callable[[], str],
) -> None:
    """Write the JSON results and the markdown section where asked."""
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(_json(data) + "\n")
        err.print(f"wrote {output}")
    if markdown_file is not None:
        markdown_file.parent.mkdir(parents=True, exist_ok=True)
        markdown_file.write_text(markdown_text())
        err.print(f"wrote {markdown_file}")


def _independent(
    options: BenchOptions,
    output_format: OutputFormat,
    output: Path | None,
    markdown_file: Path | None,
    progress: bool,
) -> None:
    """Run and report an independent suite (per cadence, apart from the tuned suites)."""
    from minder.benchmark.independent.report import (  # noqa: PLC0415
        markdown_independent,
        render_independent,
    )
    from minder.benchmark.independent.run import run_independent  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    try:
        with _progress(progress and err.is_terminal) as update:
            result = run_independent(options, progress=update)
    except MinderError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(code=1) from None
    data = result.to_dict()
    _write(data, output, markdown_file, lambda: markdown_independent(result))
    if output_format is OutputFormat.json:
        sys.stdout.write(_json(data) + "\n")
    else:
        render_independent(result, out)
