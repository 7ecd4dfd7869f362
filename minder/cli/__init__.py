"""The ``minder`` command line: :mod:`minder.cli.app` registers one module per command group."""

from minder.cli.app import app, main

__all__ = ["app", "main"]
