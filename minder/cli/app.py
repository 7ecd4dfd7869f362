"""The root ``minder`` command: one module per command or command group, loaded when used.

``minder --help`` and ``minder whatif analyze --help`` must not import the detection engine, the
benchmark, the agent's collectors or torch: each command module is imported only when its command
runs (or its own help is asked for). The root lists them from :data:`COMMANDS` without importing
them. Command modules import :mod:`minder.cli.common` and what they use, never each other or this
module, so there is no import cycle. Typer converts option values with pydantic; the groups here
process their ``--help`` and the root's ``--log-level`` without it, so that a command's
``--help`` does not import pydantic either (tests/minder/cli/test_cli_imports.py checks all of it).
"""

from __future__ import annotations

import importlib
import os
from typing import Annotated, Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from minder.logging_setup import LOG_FORMATS, configure_logging


class LazyCommand(NamedTuple):
    """Where a command lives, and its one-line help for ``minder --help``."""

    module: str
    attribute: str
    help: str


COMMANDS: dict[str, LazyCommand] = {
    "demo": LazyCommand(
        "minder.cli.demo",
        "demo_command",
        "Run broker, service, API and a simulated 64-machine job with an injected fault.",
    ),
    "serve": LazyCommand(
        "minder.cli.serve",
        "serve_command",
        "Run the detection service and its HTTP API (settings from MINDER_* variables).",
    ),
    "agent": LazyCommand(
        "minder.cli.agent", "agent_command", "Run the node agent: collect, spool, send to Kafka."
    ),
    "detect": LazyCommand(
        "minder.cli.detect",
        "detect_command",
        "Detect faulty machines in a canonical metric table (docs/architecture.md §3.3).",
    ),
    "simulate": LazyCommand(
        "minder.cli.simulate",
        "simulate_command",
        "Simulate a cluster from a scenario file: write the metric table or publish to Kafka.",
    ),
    "import": LazyCommand(
        "minder.cli.importer",
        "import_app",
        "Import a canonical metric table from Prometheus (dcgm-exporter, node_exporter, agents).",
    ),
    "train": LazyCommand(
        "minder.cli.train",
        "train_command",
        "Train a detector model (denoisers, metric priorities) from a labelled metric table.",
    ),
    "whatif": LazyCommand(
        "minder.cli.whatif",
        "whatif_app",
        "What-if straggler analysis of job traces (canonical Parquet or Kineto JSON).",
    ),
    "bench": LazyCommand(
        "minder.cli.bench", "bench_app", "Benchmarks of the detectors on labelled simulated jobs."
    ),
    "dashboards": LazyCommand(
        "minder.cli.dashboards", "dashboards_app", "Minder's Grafana dashboards: list, push."
    ),
    "alerts": LazyCommand(
        "minder.cli.alerts",
        "alerts_app",
        "List, show and review alerts (ack, resolve, false-positive) over the API.",
    ),
    "actions": LazyCommand(
        "minder.cli.actions", "actions_app", "The audit trail of scheduler actions, over the API."
    ),
    "breaker": LazyCommand(
        "minder.cli.actions",
        "breaker_app",
        "The actions circuit breaker: status, reset (over the API).",
    ),
    "keys": LazyCommand(
        "minder.cli.keys",
        "keys_app",
        "Signing keys of the node agents: create, rotate, retire, hand out (docs/security.md).",
    ),
    "hang": LazyCommand(
        "minder.cli.hang",
        "hang_app",
        "Hung jobs: whom the stuck collectives wait on, from flight-recorder dumps.",
    ),
    "labels": LazyCommand(
        "minder.cli.labels",
        "labels_app",
        "Export reviewed alerts as training labels for minder train --labels.",
    ),
    "selfcheck": LazyCommand(
        "minder.cli.selfcheck",
        "selfcheck_app",
        "Self-checks of drained nodes: run one on this node; list, show, request (over the API).",
    ),
}


class _PlainOption(TyperOption):
    """An option whose value needs no conversion: text as given (checked by its command), or a
    flag (``--help``: ``None`` when left out).

    Typer builds a pydantic ``TypeAdapter`` to convert every option it processes, even a flag
    left out whose value it then leaves ``None``; importing pydantic (about 0.1 s) for the root's
    ``--log-level`` and each group's ``--help`` would make every command's ``--help`` pay for it.
    """

    def process_value(self, ctx: Any, value: Any) -> Any:
        if value is not None and not isinstance(value, str | bool):
            # anything else (a click sentinel for a missing value, say): typer's own handling
            return super().process_value(ctx, value)
        if self.callback is not None:
            value = self.callback(ctx, self, value)
        return value


class QuickGroup(TyperGroup):
    """A typer group whose ``--help`` option is processed without a conversion (see
    :class:`_PlainOption`)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if type(option) is TyperOption:
            option.__class__ = _PlainOption  # the same flag, processed without pydantic
        return option


def load_command(name: str) -> TyperCommand | TyperGroup:
    """Import the module of command ``name`` and return its click command."""
    spec = COMMANDS[name]
    target = getattr(importlib.import_module(spec.module), spec.attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
        if type(command) is TyperGroup:
            command.__class__ = QuickGroup  # its --help without pydantic when a subcommand runs
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name=name)(target)
        command = typer.main.get_command(single)
    command.name = name
    assert isinstance(command, TyperCommand | TyperGroup)
    return command


class _Deferred(TyperCommand):
    """Stands for a command in listings; becomes the real one when it is invoked."""

    def __init__(self, name: str) -> None:
        super().__init__(name, help=COMMANDS[name].help, short_help=COMMANDS[name].help)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Any = None,
        **extra: Any,
    ) -> Any:
        # ``Any``: typer vendors click, whose Context type is private to typer
        # The group then invokes ``sub_ctx.command``: the real command.
        assert self.name is not None
        return load_command(self.name).make_context(info_name, args, parent=parent, **extra)


class LazyGroup(QuickGroup):
    """A typer group whose subcommands are imported on first use."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for param in self.params:
            if param.name == "log_level" and type(param) is TyperOption:
                param.__class__ = _PlainOption  # checked by the root callback

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> TyperCommand | TyperGroup | None:
        if cmd_name in COMMANDS:
            return _Deferred(cmd_name)
        found = super().get_command(ctx, cmd_name)
        assert found is None or isinstance(found, TyperCommand | TyperGroup)
        return found


app = typer.Typer(
    name="minder",
    cls=LazyGroup,
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
    # MINDER_LOG__FORMAT for every command, read here without the settings (pydantic): a bad
    # value is the settings' to refuse, in one line, when the command loads them.
    chosen = os.environ.get("MINDER_LOG__FORMAT", "auto").strip().lower()
    configure_logging(log_level, chosen if chosen in LOG_FORMATS else "auto")


def main() -> None:
    """Console-script entry point."""
    app()
