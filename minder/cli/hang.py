"""``minder hang analyze DIR``: whom a hung job's collectives wait on, from the per-rank
flight-recorder dumps copied from it (docs/hangs.md).

The directory holds one ``<prefix><rank>`` dump per rank that could write one (pickle or JSON);
the prefix is inferred from the file names unless ``--prefix`` gives it. Dumps are read with a
restricted unpickler (no code runs), summarised, and analysed across ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.common import OutputFormat, err, fail, out, print_json

hang_app = typer.Typer(
    name="hang",
    help="Hung jobs: whom the stuck collectives wait on, from flight-recorder dumps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@hang_app.callback()
def hang_callback() -> None:
    """Hung jobs: whom the stuck collectives wait on, from flight-recorder dumps."""


@hang_app.command("analyze")
def analyze_command(
    directory: Annotated[
        Path, typer.Argument(help="a directory of <prefix><rank> flight-recorder dumps")
    ],
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", "-p", help="dump file-name prefix (default: inferred)"),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table or json")
    ] = OutputFormat.table,
) -> None:
    """Name the ranks (and machines) a hung job waits on: ranks that never joined the
    collective the others wait in, ranks without a dump, ranks that entered it differently."""
    import time  # noqa: PLC0415

    from collectors.flight_recorder import DumpError, read_dump_dir  # noqa: PLC0415
    from detectors.hangs import analyze  # noqa: PLC0415

    try:
        summaries = read_dump_dir(directory, prefix)
    except DumpError as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(f"{directory}: {exc.strerror or exc}") from None
    analysis = analyze(summaries, now=time.time())

    if output_format is OutputFormat.json:
        print_json({"directory": str(directory), **analysis.to_dict()})
        return

    seen, expected = analysis.ranks_seen, analysis.ranks_expected
    if analysis.hung:
        n = len(analysis.culprits) + analysis.culprits_dropped
        out.print(
            f"[bold red]hung[/]: {n} culprit{'s' if n != 1 else ''}, dumps from {seen} of "
            f"{expected} ranks"
        )
    else:
        out.print(f"[bold green]no hang found[/]: dumps from {seen} of {expected} ranks")
    if analysis.culprits:
        table = Table("rank", "machine", "reason", "group", "op", "seq", "detail", title="culprits")
        for c in analysis.culprits:
            group = f"{c.group} ({c.group_desc})" if c.group_desc else c.group
            table.add_row(
                str(c.rank),
                escape(c.machine),
                c.reason.value,
                escape(group),
                escape(c.op),
                "" if c.seq is None else str(c.seq),
                escape(c.detail),
            )
        out.print(table)
    if analysis.mismatches:
        table = Table("group", "seq", "field", "values (ranks)", title="mismatches")
        for m in analysis.mismatches:
            values = "; ".join(f"{v}: {_ranks(ranks)}" for v, ranks in list(m.values.items())[:4])
            table.add_row(escape(m.group), str(m.seq), m.field, escape(values))
        out.print(table)
    if analysis.groups:
        table = Table("group", "desc", "size", "stuck", "seq", "op", "waiting", "missing")
        for g in analysis.groups:
            table.add_row(
                escape(g.group),
                escape(g.desc),
                str(g.size),
                "yes" if g.stuck else "no",
                "" if g.seq is None else str(g.seq),
                escape(g.op),
                str(g.waiting),
                _ranks(g.missing),
            )
        out.print(table)
    dropped = analysis.culprits_dropped + analysis.mismatches_dropped + analysis.groups_dropped
    if dropped:
        out.print(
            f"not shown: {analysis.culprits_dropped} culprits, {analysis.mismatches_dropped} "
            f"mismatches, {analysis.groups_dropped} groups (--format json lists the same)"
        )
    for note in analysis.notes:
        err.print(f"note: {escape(note)}", soft_wrap=True)


def _ranks(ranks: tuple[int, ...] | list[int], limit: int = 12) -> str:
    head = ", ".join(str(r) for r in ranks[:limit])
    return head + (f" (+{len(ranks) - limit})" if len(ranks) > limit else "")
