"""``minder whatif``: what-if straggler analysis of job traces."""

from __future__ import annotations

import functools
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer

from minder.core.errors import MinderError

if TYPE_CHECKING:  # the analysis (pandas, numpy) is imported only when a command runs
    from rich.console import Console

    from whatif import Trace

whatif_app = typer.Typer(
    name="whatif",
    help="What-if straggler analysis of job traces (canonical Parquet or Kineto JSON).",
    no_args_is_help=True,
    add_completion=False,
)


@functools.cache
def _err() -> Console:
    """The stderr console, built at first use: a report written as JSON needs no rich."""
    from rich.console import Console  # noqa: PLC0415

    return Console(stderr=True)


def _escape(text: str) -> str:
    from rich.markup import escape  # noqa: PLC0415

    return escape(text)


_TIMELINE_DEFAULT_LIMIT = 1_000_000
"""Without --step, a larger job exports only its first two steps."""


class OutputFormat(StrEnum):
    """Report formats of ``minder whatif analyze``."""

    table = "table"
    json = "json"
    html = "html"


TraceArg = Annotated[
    list[Path],
    typer.Argument(
        help="A canonical trace (.parquet, meta YAML beside it), or the Kineto JSON(.gz) traces "
        "of the job's ranks (files, a directory or a glob).",
        show_default=False,
    ),
]
MetaOpt = Annotated[
    Path | None,
    typer.Option("--meta", help="Job meta YAML (dp_size, pp_size, tp_size, dsp_size, …)."),
]


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress bar on stderr, fed by the analysis' ``progress`` callback."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} replays"),
        TimeElapsedColumn(),
        console=_err(),
        transient=True,
    ) as bar:
        task = bar.add_task("replaying", total=None)

        def update(phase: str, done: int, total: int) -> None:
            bar.update(task, description=phase, completed=done, total=total)

        yield update


def _fail(exc: Exception) -> typer.Exit:
    _err().print(f"[red]error:[/red] {_escape(str(exc))}", highlight=False)
    return typer.Exit(code=2)


class Replay(StrEnum):
    """Replays ``minder whatif timeline`` exports (``whatif.timeline.KINDS``)."""

    actual = "actual"
    original = "original"
    ideal = "ideal"


def _load(trace: list[Path], meta: Path | None) -> Trace:
    from whatif import load_trace  # noqa: PLC0415

    sources = [str(p) for p in trace]
    return load_trace(sources[0] if len(sources) == 1 else sources, meta)


@whatif_app.command("analyze")
def analyze_command(
    trace: TraceArg,
    meta: MetaOpt = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="Report format.")
    ] = OutputFormat.table,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the report here (default: stdout).")
    ] = None,
    what_if: Annotated[
        list[str] | None,
        typer.Option(
            "--what-if",
            "-w",
            help="A custom what-if, e.g. 'stage=3,dp=1:faster=20%' or 'pp-comm:free' (repeatable).",
        ),
    ] = None,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar on stderr.")
    ] = True,
) -> None:
    """Replay the trace, estimate the slowdown S, attribute it and give a root-cause verdict."""
    from whatif import analyze  # noqa: PLC0415

    try:
        loaded = _load(trace, meta)
        with _progress(progress and sys.stderr.isatty()) as update:
            report = analyze(loaded, what_ifs=what_if or (), progress=update)
    except (MinderError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    if output_format is OutputFormat.json:
        text = orjson.dumps(
            report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
        ).decode()
    elif output_format is OutputFormat.html:
        from whatif.render import render_html  # noqa: PLC0415

        text = render_html(report)
    else:
        from rich.console import Console  # noqa: PLC0415

        from whatif.render import render_table  # noqa: PLC0415

        if output is None:
            Console().print(render_table(report))
            return
        console = Console(record=True, width=120, file=io.StringIO())
        console.print(render_table(report))
        text = console.export_text()
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        _err().print(f"wrote {_escape(str(output))}", highlight=False)


@whatif_app.command("timeline")
def timeline_command(
    trace: TraceArg,
    meta: MetaOpt = None,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Output prefix: writes PREFIX-actual.json(.gz), PREFIX-ideal.json(.gz), ….",
        ),
    ] = Path("timeline.json.gz"),
    kinds: Annotated[
        list[Replay] | None,
        typer.Option("--kind", "-k", help="Replays to export (repeatable)."),
    ] = None,
    steps: Annotated[
        list[int] | None, typer.Option("--step", help="Step ids to export (default: all).")
    ] = None,
    dp_ranks: Annotated[
        list[int] | None, typer.Option("--dp", help="DP ranks to export (default: all).")
    ] = None,
) -> None:
    """Export replayed timelines (actual and ideal by default) as Perfetto/Chrome trace JSON."""
    from whatif import build_model  # noqa: PLC0415
    from whatif.timeline import timeline_events, write_timeline  # noqa: PLC0415

    chosen = [k.value for k in kinds] if kinds else ["actual", "ideal"]
    try:
        model = build_model(_load(trace, meta))
        if steps is None and model.n_ops_total > _TIMELINE_DEFAULT_LIMIT:
            steps = [int(s) for s in model.steps[:2]]
            _err().print(
                f"{model.n_ops_total:,} ops is more than a viewer can open: exporting steps "
                f"{steps} (choose with --step)"
            )
        name = output.name
        suffix = ".json.gz" if name.endswith(".json.gz") else ".json"
        stem = name.removesuffix(".gz").removesuffix(".json")
        for kind in chosen:
            data = timeline_events(model, kind, steps=steps, dp_ranks=dp_ranks)
            path = write_timeline(data, output.with_name(f"{stem}-{kind}{suffix}"))
            _err().print(
                f"wrote {_escape(str(path))} ({len(data['traceEvents']):,} events)", highlight=False
            )
    except (MinderError, FileNotFoundError) as exc:
        raise _fail(exc) from None


@whatif_app.command("convert")
def convert_command(
    trace: TraceArg,
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Canonical Parquet to write (meta YAML beside).")
    ],
    meta: MetaOpt = None,
) -> None:
    """Convert Kineto traces of a job's ranks into the canonical Parquet + meta YAML."""
    from whatif import write_canonical  # noqa: PLC0415

    try:
        loaded = _load(trace, meta)
        parquet, meta_path = write_canonical(loaded, output)
    except (MinderError, FileNotFoundError) as exc:
        raise _fail(exc) from None
    for note in loaded.notes:
        _err().print(f"note: {_escape(note)}", highlight=False)
    _err().print(f"wrote {_escape(str(parquet))} and {_escape(str(meta_path))}", highlight=False)
