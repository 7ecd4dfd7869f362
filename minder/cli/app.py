"""The root ``minder`` command: one module per command or command group, registered here.

Command modules import :mod:`minder.cli.common` and what they use, never each other or this
module, so there is no import cycle.
"""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from minder.cli.agent import agent_command
from minder.cli.bench import bench_app
from minder.cli.demo import demo_command
from minder.cli.detect import detect_command
from minder.cli.serve import serve_command
from minder.cli.simulate import simulate_command
from minder.cli.train import train_command
from minder.cli.whatif import whatif_app
from minder.logging_setup import configure_logging

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="minder",
    help="Keeps very large GPU training jobs healthy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "WARNING",
) -> None:
    """Minder: faulty-machine detection and straggler analysis for GPU training jobs."""
    if log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise typer.BadParameter(
            f"{log_level[:40]!r}: expected DEBUG, INFO, WARNING or ERROR", param_hint="--log-level"
        )
    configure_logging(log_level)


app.command(name="demo")(demo_command)
app.command(name="serve")(serve_command)
app.command(name="detect")(detect_command)
app.command(name="simulate")(simulate_command)
app.command(name="train")(train_command)
app.command(name="agent")(agent_command)
app.add_typer(whatif_app, name="whatif")
app.add_typer(bench_app, name="bench")


def main() -> None:
    """Console-script entry point."""
    app()
