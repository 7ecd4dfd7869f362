"""Every `minder` command line in deploy/ uses options that the CLI really has.

The command lines of the compose file, the Kubernetes workloads and the systemd units are
checked against `minder <command> --help` of the installed console script, so that renaming
an option breaks this test rather than a deployment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GLOBAL_OPTIONS = {"--log-level", "--help"}


def _yaml_commands() -> Iterator[tuple[str, list[str]]]:
    compose = yaml.safe_load((REPO / "deploy/compose/docker-compose.yml").read_text("utf-8"))
    for name, service in compose["services"].items():
        if "build" in service and "command" in service:
            yield f"compose {name}", [str(c) for c in service["command"]]
    for path in sorted((REPO / "deploy/kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text("utf-8")):
            if not doc or doc.get("kind") not in {"Deployment", "DaemonSet"}:
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].startswith("minder") and "args" in container:
                    yield f"{path.name} {container['name']}", [str(a) for a in container["args"]]


def _unit_commands() -> Iterator[tuple[str, list[str]]]:
    for path in sorted((REPO / "deploy/systemd").glob("*.service")):
        text = path.read_text("utf-8").replace("\\\n", " ")
        [line] = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
        words = line.removeprefix("ExecStart=").split()
        assert words[0].endswith("/minder"), f"{path.name}: ExecStart does not run minder"
        yield path.name, words[1:]


COMMANDS = [*_yaml_commands(), *_unit_commands()]


def _split(args: list[str]) -> tuple[str, list[str]]:
    """The subcommand and the options after it (global options before it are checked too)."""
    index = next(
        i
        for i, a in enumerate(args)
        if not a.startswith("-") and (i == 0 or args[i - 1] not in GLOBAL_OPTIONS)
    )
    for option in (a for a in args[:index] if a.startswith("--")):
        assert option in GLOBAL_OPTIONS, f"unknown global option {option}"
    return args[index], [a for a in args[index + 1 :] if a.startswith("--")]


_HELP: dict[str, str] = {}


@pytest.fixture
def help_text(
    tool: Callable[[str], str], run: Callable[..., Any], explain: Callable[[Any], str]
) -> Callable[[str], str]:
    """`minder <command> --help` of the installed console script (cached per command)."""

    def get(command: str) -> str:
        if command not in _HELP:
            result = run([tool("minder"), command, "--help"], timeout=60)
            assert result.returncode == 0, explain(result)
            _HELP[command] = result.stdout
        return _HELP[command]

    return get


def test_commands_were_found() -> None:
    sources = {source.split()[0] for source, _ in COMMANDS}
    assert {"compose", "service.yaml", "agent.yaml", "minder-agent.service"} <= sources
    assert "minder-serve.service" in sources


@pytest.mark.parametrize(("source", "args"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_options_exist(source: str, args: list[str], help_text: Callable[[str], str]) -> None:
    command, options = _split(args)
    text = help_text(command)
    known = set(re.findall(r"(--[a-z][a-z0-9-]*)", text))
    unknown = sorted(set(options) - known)
    assert unknown == [], f"{source}: `minder {command}` has no {unknown}"
