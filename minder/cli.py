"""The ``minder`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="minder",
    help="Keeps very large GPU training jobs healthy.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Minder: faulty-machine detection and straggler analysis for GPU training jobs."""


def main() -> None:
    """Console-script entry point."""
    app()
