"""deploy/systemd: the agent and service units, their environment files, the system user.

`systemd-analyze verify` needs the ExecStart binary to exist, so it checks copies whose
/usr/local/bin/minder points at a stub executable in a temporary directory; it exits 0 on
ignored (unknown or misspelt) settings, so any warning naming a unit fails the test too.
`systemd-analyze security --offline` scores the hardening; `systemd-sysusers --root` creates
the user in a scratch root.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deploy" / "systemd"
UNITS = ["minder-agent.service", "minder-serve.service"]
BINARY = "/usr/local/bin/minder"
# systemd-analyze security's exposure score is 0-100 here (it prints it divided by 10).
MAX_EXPOSURE = 30


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file: key -> every value (continuation lines joined)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"setting outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", line)
        assert match, f"{path.name}:{number}: not KEY=value: {raw!r}"
        assert not line.startswith("export "), f"{path.name}:{number}: no `export` in systemd"
        values[match.group(1)] = match.group(2)
    return values


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    return parse_unit((SYSTEMD / name).read_text(encoding="utf-8"))


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key)
    assert values, f"{key} is not set"
    return values[-1]


@pytest.fixture
def stub_units(tmp_path: Path) -> Path:
    """Copies of the units whose ExecStart runs a stub that exists on this machine."""
    stub = tmp_path / "bin" / "minder"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for name in UNITS:
        text = (SYSTEMD / name).read_text(encoding="utf-8")
        assert f"ExecStart={BINARY} " in text, f"{name}: ExecStart must run {BINARY}"
        (units / name).write_text(text.replace(BINARY, str(stub)), encoding="utf-8")
    return units


def test_systemd_analyze_verify(
    stub_units: Path,
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
) -> None:
    paths = [stub_units / name for name in UNITS]
    result = run([tool("systemd-analyze"), "verify", "--man=no", *paths], cwd=stub_units)
    assert result.returncode == 0, explain(result)
    output = result.stdout + result.stderr
    complaints = [line for line in output.splitlines() if any(name in line for name in UNITS)]
    assert complaints == [], explain(result)


def test_systemd_analyze_verify_catches_a_bad_setting(
    stub_units: Path,
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
) -> None:
    # The check above must be able to fail: a misspelt value is reported (with exit 0).
    path = stub_units / "minder-agent.service"
    path.write_text(
        path.read_text(encoding="utf-8").replace("ProtectSystem=strict", "ProtectSystem=strikt"),
        encoding="utf-8",
    )
    result = run([tool("systemd-analyze"), "verify", "--man=no", path], cwd=stub_units)
    assert "minder-agent.service" in result.stdout + result.stderr, explain(result)


@pytest.mark.parametrize("name", UNITS)
def test_hardening_score(
    name: str,
    stub_units: Path,
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
) -> None:
    result = run(
        [
            tool("systemd-analyze"),
            "security",
            "--offline=yes",
            f"--threshold={MAX_EXPOSURE}",
            "--no-pager",
            stub_units / name,
        ],
        cwd=stub_units,
    )
    if "--offline" in result.stderr and "unrecognized option" in result.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    assert result.returncode == 0, explain(result)


@pytest.mark.parametrize("name", UNITS)
def test_common_service_settings(name: str) -> None:
    sections = unit(name)
    service = sections["Service"]
    assert one(service, "Type") == "simple"
    assert one(service, "Restart") == "on-failure"
    assert one(service, "User") == "minder"
    assert one(service, "StateDirectory") == "minder"
    assert one(service, "WorkingDirectory") == "/var/lib/minder"
    for key, value in {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ReadWritePaths": "/var/lib/minder",
        "CapabilityBoundingSet": "",
    }.items():
        assert one(service, key) == value, key
    assert one(sections["Install"], "WantedBy") == "multi-user.target"
    assert "network-online.target" in one(sections["Unit"], "After")


def test_agent_unit() -> None:
    service = unit("minder-agent.service")["Service"]
    exec_start = one(service, "ExecStart")
    assert exec_start.startswith(f"{BINARY} ")
    words = exec_start.split()
    assert words.count("--kafka") == 1
    assert words[words.index("--kafka") + 1] == "${MINDER_KAFKA}"
    assert words[words.index("--spool-dir") + 1] == "/var/lib/minder/agent-spool"
    assert words[words.index("--metrics-addr") + 1] == "${MINDER_METRICS_ADDR}"
    assert one(service, "KillSignal") == "SIGTERM"
    assert service["EnvironmentFile"][0] == "/etc/minder/minder-agent.env"
    # /sys must stay readable and NVML needs /dev/nvidia*: no PrivateDevices, no InaccessiblePaths.
    assert service.get("PrivateDevices", ["no"])[-1] == "no"
    assert "InaccessiblePaths" not in service and "TemporaryFileSystem" not in service


def test_serve_unit() -> None:
    service = unit("minder-serve.service")["Service"]
    assert one(service, "ExecStart") == f"{BINARY} serve"
    # `minder serve` stops cleanly on SIGTERM (tests/minder/cli/test_cli_serve.py).
    assert one(service, "KillSignal") == "SIGTERM"
    assert service["EnvironmentFile"] == ["/etc/minder/minder-serve.env"]


def test_serve_unit_gives_the_api_files_for_its_connections() -> None:
    """The API bounds its connections below the soft open-file limit: the unit raises it above
    systemd's 1,024 (and `minder serve` exits non-zero when its API stops: Restart= acts)."""
    from minder.api.server import MAX_CONNECTIONS_CAP, resolve_max_connections

    service = unit("minder-serve.service")["Service"]
    limit = int(one(service, "LimitNOFILE"))
    assert limit >= 8192
    assert resolve_max_connections(None, limit) == MAX_CONNECTIONS_CAP
    assert one(service, "Restart") == "on-failure"


@pytest.mark.parametrize(
    ("unit_name", "env_name"),
    [("minder-agent.service", "minder-agent.env"), ("minder-serve.service", "minder-serve.env")],
)
def test_env_files_define_what_the_units_use(unit_name: str, env_name: str) -> None:
    env = parse_env_file(SYSTEMD / env_name)
    exec_start = one(unit(unit_name)["Service"], "ExecStart")
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", exec_start))
    assert used - env.keys() == set(), f"{env_name} lacks {sorted(used - env.keys())}"
    for key in env:
        assert key.startswith("MINDER_"), f"{env_name}: {key} is not a Minder variable"


def test_serve_env_file_configures_the_service() -> None:
    env = parse_env_file(SYSTEMD / "minder-serve.env")
    assert env["MINDER_API__HOST"] == "0.0.0.0"
    assert env["MINDER_DATABASE__URL"].startswith("postgresql+psycopg://")
    assert {"MINDER_KAFKA__BOOTSTRAP", "MINDER_KAFKA__GROUP_ID", "MINDER_API__TOKEN"} <= env.keys()


def test_sysusers_creates_the_user(
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
    tmp_path: Path,
) -> None:
    (tmp_path / "etc").mkdir()
    conf = SYSTEMD / "minder.sysusers.conf"
    result = run([tool("systemd-sysusers"), f"--root={tmp_path}", conf])
    assert result.returncode == 0, explain(result)
    passwd = (tmp_path / "etc" / "passwd").read_text(encoding="utf-8")
    [entry] = [line for line in passwd.splitlines() if line.startswith("minder:")]
    fields = entry.split(":")
    assert int(fields[2]) < 1000, "expected a system user"
    assert fields[5] == "/var/lib/minder" and fields[6] == "/usr/sbin/nologin"
