"""``minder selfcheck``: ``run`` on this node (the checks really run: a CPU matmul, the disks, the
clock …), its exit statuses and errors, and the operator's ``request``, ``list``, ``status`` and
``cancel`` plus the report's post, all against the real API (``create_app`` on a migrated SQLite
file, served by uvicorn on a loopback port, as in test_cli_operator.py).

A drained node is what the actions executor leaves: an alert and the audit row of its applied
drain. A launched check is what the service does before launching: ``mark_launching`` with the
digest of the check's token. The node's post then goes through the CLI's real HTTP path.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine
from typer.testing import CliRunner

from collectors.selfcheck.base import CHECK_NAMES
from minder.api import create_app
from minder.cli import app
from minder.cli.selfcheck import (
    EXIT_ERROR,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    CheckName,
    CheckState,
)
from minder.core.alert import Alert, AlertKind
from minder.core.selfcheck import SelfCheckState
from minder.storage import SessionFactory, record_alert, session_factory
from minder.storage.actions import audit
from minder.storage.selfchecks import get_selfcheck, mark_launching, token_digest
from minder.storage.testing import clear_tables, scratch_database

API_TOKEN = "operator-token"
CHECK_TOKEN = "check-token-4be1d07a"
T0 = 1_763_700_000.0
runner = CliRunner()


def _clean_env() -> dict[str, str | None]:
    """No variable of the caller's shell that the commands read leaks into them."""
    env: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith(("MINDER_SELFCHECK_", "MINDER_API"))
    }
    env.update({"SLURMD_NODENAME": None, "USER": "tester", "USERNAME": None})
    return env


def cli(args: list[str], **env: str | None) -> Any:
    result = runner.invoke(app, ["selfcheck", *args], env={**_clean_env(), **env})
    assert "Traceback" not in result.output, result.output
    return result


def one_line_error(args: list[str], **env: str | None) -> str:
    result = cli(args, **env)
    assert result.exit_code == EXIT_ERROR, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def _tool(folder: Path, name: str, script: str) -> str:
    """An executable ``name`` in ``folder`` (a PATH to put first) running ``script``."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{script}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def test_the_written_out_names_are_the_checks_and_states() -> None:
    assert [c.value for c in CheckName] == list(CHECK_NAMES)
    assert [s.value for s in CheckState] == [s.value for s in SelfCheckState]
    assert (EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_INCONCLUSIVE) == (0, 1, 2, 3)


# -- run on this node ------------------------------------------------------------------------


def test_run_checks_this_node_and_passes() -> None:
    result = cli(["run"], MINDER_SELFCHECK_NODE="n-here")
    assert result.exit_code == EXIT_PASS, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert "Self-check of n-here" in lines[0]
    for name in CHECK_NAMES:
        assert name in result.stdout
    assert lines[-1] == "pass"


def test_run_writes_the_json_report(tmp_path: Path) -> None:
    saved = tmp_path / "report.json"
    result = cli(
        ["run", "--check", "gpu.matmul", "--check", "host.disk", "-f", "json", "-o", str(saved)],
        MINDER_SELFCHECK_NODE="n-here",
        MINDER_SELFCHECK_MATMUL_SIZE_CPU="256",
    )
    assert result.exit_code == EXIT_PASS, result.output
    report = json.loads(result.stdout)
    assert report == json.loads(saved.read_text())
    assert [c["name"] for c in report["checks"]] == ["gpu.matmul", "host.disk"]
    assert report["node"] == "n-here" and report["verdict"] == "pass"
    assert report["checks"][0]["measurements"]["size"] == 256
    assert result.stderr.strip().splitlines()[-1] == "pass"


def test_a_baseline_the_machine_cannot_reach_fails_the_run(tmp_path: Path) -> None:
    baselines = tmp_path / "baselines.json"
    baselines.write_text(json.dumps({"cpu": 1_000_000}))
    result = cli(
        ["run", "--check", "gpu.matmul", "--baseline-file", str(baselines)],
        MINDER_SELFCHECK_MATMUL_SIZE_CPU="256",
    )
    assert result.exit_code == EXIT_FAIL, result.output
    assert result.stdout.strip().splitlines()[-1] == "fail: gpu.matmul"
    by_variable = cli(
        ["run", "--check", "gpu.matmul", "--format", "json"],
        MINDER_SELFCHECK_MATMUL_SIZE_CPU="256",
        MINDER_SELFCHECK_BASELINE_CPU="1000000",
    )
    assert by_variable.exit_code == EXIT_FAIL
    assert json.loads(by_variable.stdout)["verdict"] == "fail"


def test_a_check_that_gives_no_answer_makes_the_run_inconclusive(tmp_path: Path) -> None:
    # DCGM is not installed here: a dcgmi that crashes as a broken installation does
    path = _tool(
        tmp_path / "bin", "dcgmi", "import sys\nprint('Segmentation fault')\nsys.exit(139)\n"
    )
    result = cli(["run", "--check", "gpu.dcgm"], PATH=path)
    assert result.exit_code == EXIT_INCONCLUSIVE, result.output
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("inconclusive: gpu.dcgm gave no answer: dcgmi diag -r 1 gave no")


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ["run"],
            {"MINDER_SELFCHECK_MATMUL_MIN_FRACTION": "most"},
            "MINDER_SELFCHECK_MATMUL_MIN_FRACTION='most': expected a number",
        ),
        (
            ["run"],
            {"MINDER_SELFCHECK_TIMEOUT_S": "-1"},
            "MINDER_SELFCHECK_TIMEOUT_S='-1': expected a positive number",
        ),
        (["run", "--check-id", "c1"], {}, "a check id without --report-url"),
        (
            ["run", "--report-url", "http://127.0.0.1:9", "--check-id", "c1"],
            {},
            "MINDER_SELFCHECK_TOKEN is not set",
        ),
        (["run", "--check", "host.disk", "--skip", "host.disk"], {}, "leave no check to run"),
        (
            ["run", "--baseline-file", "/nonexistent/b.json"],
            {},
            "baseline file /nonexistent/b.json: cannot be read",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exits_2(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    assert expected in one_line_error(args, **env)


def test_an_unknown_check_name_is_refused() -> None:
    result = cli(["run", "--check", "gpu.bogus"])
    assert result.exit_code == EXIT_ERROR
    assert "gpu.bogus" in result.output


def test_a_partner_lends_its_collective_only_and_does_not_report() -> None:
    result = cli(
        ["run", "--format", "json"],
        MINDER_SELFCHECK_NODE="n3",
        MINDER_SELFCHECK_SUSPECT="n7",
        MINDER_SELFCHECK_REPORT_URL="http://127.0.0.1:9",  # nothing listens: no post is tried
        MINDER_SELFCHECK_CHECK_ID="c1",
        MINDER_SELFCHECK_TOKEN=CHECK_TOKEN,
    )
    report = json.loads(result.stdout)
    assert [c["name"] for c in report["checks"]] == ["collective.allreduce"]
    assert report["check_id"] == "c1" and report["node"] == "n3"
    assert "partner of n7: ran collective.allreduce only" in result.stderr
    assert "posted" not in result.stderr
    # a world of one: the collective is skipped; the verdict is the suspect's in any case
    assert report["verdict"] == "inconclusive"
    assert result.exit_code == EXIT_PASS


def test_a_partner_that_finds_the_suspect_slow_still_exits_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank of the collective carries the same judgement of the suspect. A partner that
    exited 1 with it would end the check job (srun --kill-on-bad-exit, a failed Kubernetes Job)
    before the suspect posted its report, and the straggler would never be confirmed. The real
    multi-rank judgement is tested in tests/collectors/selfcheck/test_collective.py; here the
    collective's result is given."""
    from collectors.selfcheck import runner
    from minder.core.selfcheck import CheckResult, CheckStatus

    def slow_suspect(self: object, context: object) -> CheckResult:
        return CheckResult(
            "collective.allreduce", CheckStatus.FAIL, "suspect n7 slow in both rounds"
        )

    monkeypatch.setattr(runner.CollectiveCheck, "run", slow_suspect)
    partner = cli(
        ["run", "--format", "json"], MINDER_SELFCHECK_NODE="n3", MINDER_SELFCHECK_SUSPECT="n7"
    )
    assert json.loads(partner.stdout)["verdict"] == "fail"
    assert partner.exit_code == EXIT_PASS
    suspect = cli(
        ["run", "--format", "json", "--check", "collective.allreduce"],
        MINDER_SELFCHECK_NODE="n7",
        MINDER_SELFCHECK_SUSPECT="n7",
    )
    assert suspect.exit_code == EXIT_FAIL


# -- against the real API --------------------------------------------------------------------


@dataclass
class Api:
    url: str
    sessions: SessionFactory

    def drained(self, machine: str, node: str) -> str:
        """An alert whose node Minder drained (the actions executor's audit row)."""
        alert = Alert(
            job="j1",
            machine=machine,
            kind=AlertKind.RULE,
            metric="gpu_xid_count",
            score=9.0,
            first_ts=T0,
            detected_ts=T0 + 5,
            devices=("gpu3",),
            evidence={"rule": "xid", "xid": 79},
        )
        with self.sessions.begin() as session:
            record_alert(session, alert)
            audit(
                session,
                target="slurm",
                operation="drain",
                mode="enforce",
                outcome="applied",
                detail=f"scontrol update NodeName={node} State=DRAIN",
                alert_id=alert.id,
                job=alert.job,
                machine=alert.machine,
                node=node,
                now=T0 + 10,
            )
        return alert.id

    def launched(self, check_id: str, token: str = CHECK_TOKEN) -> None:
        """What the service does before it launches a check: running, with its token."""
        with self.sessions.begin() as session:
            assert mark_launching(
                session, check_id, token_sha256=token_digest(token), partners=[], now=time.time()
            )

    def state(self, check_id: str) -> SelfCheckState:
        with self.sessions() as session:
            return get_selfcheck(session, check_id).state


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with scratch_database("sqlite", tmp_path_factory.mktemp("db")) as migrated:
        yield migrated


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[Api]:
    sessions = session_factory(engine)
    # An enforcing self-check service to wake: without one the API refuses operators' requests.
    api_app = create_app(
        sessions, registry=CollectorRegistry(), api_token=API_TOKEN, selfcheck_wake=lambda: None
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(api_app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Api(f"http://127.0.0.1:{port}", sessions)
    finally:
        uv.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture
def api(server: Api, engine: Engine) -> Iterator[Api]:
    yield server
    clear_tables(engine)


def operator(api: Api, args: list[str]) -> Any:
    result = cli([*args, "--api", api.url], MINDER_API_TOKEN=API_TOKEN)
    assert result.exit_code == 0, result.output
    return result


def test_request_list_status_and_cancel(api: Api) -> None:
    first = api.drained("m1", "n1")
    second = api.drained("m2", "n2")
    asked = operator(api, ["request", first, "--by", "alice"])
    assert "of node n1 (alert" in asked.stdout and "pending" in asked.stdout
    record = json.loads(operator(api, ["request", second, "--format", "json"]).stdout)
    assert (record["node"], record["state"], record["attempt"]) == ("n2", "pending", 1)
    again = cli(["request", second, "--api", api.url], MINDER_API_TOKEN=API_TOKEN)
    assert again.exit_code == EXIT_ERROR and "pending already" in again.stderr

    page = json.loads(operator(api, ["list", "--format", "json"]).stdout)
    assert page["total"] == 2 and [c["node"] for c in page["items"]] == ["n2", "n1"]
    only = json.loads(operator(api, ["list", "--node", "n1", "--format", "json"]).stdout)
    assert [c["alert_id"] for c in only["items"]] == [first]
    table = operator(api, ["list", "--state", "pending", "--limit", "1"]).stdout
    assert "Self-checks" in table and "1 of 2 self-check(s) (--offset 1 for more)" in table

    shown = operator(api, ["status", record["id"]]).stdout
    assert f"Self-check {record['id']}" in shown and "pending" in shown and "n2 (slurm)" in shown
    cancelled = operator(api, ["cancel", record["id"], "--by", "alice"]).stdout
    assert "cancelled" in cancelled
    assert api.state(record["id"]) is SelfCheckState.CANCELLED
    missing = cli(["status", "nope", "--api", api.url], MINDER_API_TOKEN=API_TOKEN)
    assert missing.exit_code == EXIT_ERROR and "no self-check with id 'nope'" in missing.stderr


def _node_run(api: Api, check_id: str, token: str, *args: str, **env: str) -> Any:
    """``minder selfcheck run`` as the launcher starts it on the suspect n1."""
    return cli(
        ["run", "--check", "gpu.matmul", "--check", "host.disk", *args],
        MINDER_SELFCHECK_NODE="n1",
        MINDER_SELFCHECK_SUSPECT="n1",
        MINDER_SELFCHECK_NODES="n1",
        MINDER_SELFCHECK_REPORT_URL=api.url,
        MINDER_SELFCHECK_CHECK_ID=check_id,
        MINDER_SELFCHECK_TOKEN=token,
        MINDER_SELFCHECK_MATMUL_SIZE_CPU="256",
        **env,
    )


def _requested(api: Api, machine: str, node: str) -> str:
    alert_id = api.drained(machine, node)
    record = json.loads(operator(api, ["request", alert_id, "--format", "json"]).stdout)
    check_id: str = record["id"]
    return check_id


def test_the_suspect_posts_its_report_once(api: Api) -> None:
    check_id = _requested(api, "m1", "n1")
    api.launched(check_id)
    result = _node_run(api, check_id, CHECK_TOKEN)
    assert result.exit_code == EXIT_PASS, result.output
    assert f"report posted to {api.url}: self-check {check_id} is passed" in result.stderr
    assert api.state(check_id) is SelfCheckState.PASSED
    shown = operator(api, ["status", check_id]).stdout
    assert "Report of n1" in shown and "gpu.matmul" in shown and "host.disk" in shown
    record = json.loads(operator(api, ["status", check_id, "--format", "json"]).stdout)
    assert record["verdict"] == "pass" and record["report"]["check_id"] == check_id

    replay = _node_run(api, check_id, CHECK_TOKEN)
    assert replay.exit_code == EXIT_ERROR
    assert "the report was not posted" in replay.stderr
    assert f"refused the report of self-check {check_id}" in replay.stderr
    assert api.state(check_id) is SelfCheckState.PASSED


def test_a_wrong_token_is_refused_and_never_shown(api: Api, tmp_path: Path) -> None:
    check_id = _requested(api, "m1", "n1")
    api.launched(check_id, token="the-right-one-91c2")
    forged = _node_run(api, check_id, CHECK_TOKEN)
    assert forged.exit_code == EXIT_ERROR
    assert "refused the token of MINDER_SELFCHECK_TOKEN" in forged.stderr
    assert CHECK_TOKEN not in forged.output and "the-right-one" not in forged.output
    assert api.state(check_id) is SelfCheckState.RUNNING

    baselines = tmp_path / "baselines.json"
    baselines.write_text(json.dumps({"cpu": 1_000_000}))
    failing = _node_run(api, check_id, "the-right-one-91c2", "--baseline-file", str(baselines))
    assert failing.exit_code == EXIT_FAIL, failing.output
    assert f"self-check {check_id} is failed" in failing.stderr
    assert api.state(check_id) is SelfCheckState.FAILED
    shown = operator(api, ["status", check_id]).stdout
    assert shown.strip().splitlines()[-1] == "fail: gpu.matmul"
