"""The Slurm self-check launcher: parsing without a cluster, then the whole mechanism (a ``MAINT``
reservation, the node resumed inside it, the check job, release by the verdict) against a real
one-host Slurm cluster (tests/minder/actions/slurm_cluster.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from slurm_cluster import ONE_HOST_COLLECTIVE, SlurmCluster, skip_reason

from minder.actions.base import ActionError, mark_for
from minder.actions.selfcheck import CheckLaunch, LauncherOptions, LaunchState, SelfCheckLauncher
from minder.actions.selfcheck_targets import build_selfcheck_launcher
from minder.actions.slurm import SlurmActuator, carries_mark
from minder.actions.slurm_selfcheck import (
    JOB_STATES,
    NAME_PREFIX,
    SlurmSelfCheckLauncher,
    batch_script,
    gres_gpus,
    parse_job,
    parse_nodes,
    parse_ref,
    parse_reservations,
)

NODES = ("sc-n01", "sc-n02", "sc-n03", "sc-n04")
SUSPECT, P1, P2, P3 = NODES
NOBODY = 65534

# ``scontrol show node`` of Slurm 22.05 (trimmed): a drained node whose OS string and reason hold
# text that looks like fields, and a node in a MAINT reservation.
SHOW_NODES = """\
NodeName=gpu-01 Arch=x86_64 CoresPerSocket=1
   NodeAddr=10.0.0.1 NodeHostName=gpu-01 Port=6818 Version=22.05.8
   OS=Linux 6.1.0 NodeAddr=6.6.6.6 Partitions=evil
   Gres=gpu:8
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu,debug
   Reason=minder:a1 gpu_xid Partitions=x [root@2026-11-29T08:29:18]

NodeName=gpu-02 Arch=x86_64 CoresPerSocket=1
   NodeAddr=10.0.0.2 NodeHostName=gpu-02 Port=6818 Version=22.05.8
   Gres=gpu:a100:4(S:0-1)
   State=IDLE+MAINTENANCE+RESERVED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu

NodeName=gpu-03 Arch=x86_64 CoresPerSocket=1
   NodeAddr=10.0.0.3 NodeHostName=gpu-03 Port=6818 Version=22.05.8
   Gres=(null)
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=(null)
"""

SHOW_RESERVATIONS = """\
ReservationName=minder-selfcheck-x1 StartTime=2026-11-29T08:29:18 EndTime=2027-11-29T08:29:18 Duration=365-00:00:00
   Nodes=n[1-2] NodeCnt=2 CoreCnt=2 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES
   TRES=cpu=2
   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a
   MaxStartDelay=(null)

ReservationName=lic StartTime=2026-11-29T08:29:18 EndTime=2027-11-29T08:29:18 Duration=365-00:00:00
   Nodes=(null) NodeCnt=0 CoreCnt=0 Features=(null) PartitionName=(null) Flags=
   Users=root Groups=(null) Accounts=(null) Licenses=a:1 State=ACTIVE BurstBuffer=(null) Watts=n/a
"""

SHOW_JOB = """\
JobId=12 JobName=JobState=COMPLETED
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
   Comment=JobState=RUNNING ExitCode=0:0
"""

WORKER = """\
import json, os, sys, time
out = sys.argv[1]
record = {k: v for k, v in os.environ.items() if k.startswith(("MINDER_", "SLURM_JOB_RESERVATION"))}
record["uid"] = os.getuid()
name = os.environ["MINDER_SELFCHECK_NODE"]
with open(os.path.join(out, name + ".json"), "w") as handle:
    json.dump(record, handle)
time.sleep(float(sys.argv[3]))
sys.exit(int(sys.argv[2]))
"""


# -- without a cluster ---------------------------------------------------------------------------


def test_parse_nodes_reads_address_and_partitions_only_from_their_own_lines() -> None:
    nodes = parse_nodes(SHOW_NODES)
    assert list(nodes) == ["gpu-01", "gpu-02", "gpu-03"]
    first = nodes["gpu-01"]
    assert first.address == "10.0.0.1"
    assert first.partitions == ("gpu", "debug")
    assert first.state.flags == {"IDLE", "DRAIN"}
    assert carries_mark(first.state.reason, "a1")
    assert not first.idle
    assert nodes["gpu-02"].state.flags == {"IDLE", "MAINTENANCE", "RESERVED"}
    assert not nodes["gpu-02"].idle
    assert nodes["gpu-03"].idle and nodes["gpu-03"].partitions == ()
    assert (first.gpus, nodes["gpu-02"].gpus, nodes["gpu-03"].gpus) == (8, 4, None)
    with pytest.raises(ValueError, match="expected NodeName="):
        parse_nodes("Partitions=gpu\n")


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:8", 8),
        ("gpu:h100:8(S:0-1)", 8),
        ("gpu:a100:4,gpu:v100:2", 6),
        ("gpu:a100:4(S:0),mps:400", 4),
        ("(null)", None),
        ("", None),
        ("mps:400", None),
    ],
)
def test_gres_gpus_counts_the_gpu_entries(gres: str, gpus: int | None) -> None:
    assert gres_gpus(gres) == gpus


def test_parse_reservations_and_jobs() -> None:
    assert parse_reservations(SHOW_RESERVATIONS) == {"minder-selfcheck-x1": "n[1-2]", "lic": ""}
    assert parse_reservations("No reservations in the system\n") == {}
    with pytest.raises(ValueError, match="ReservationName="):
        parse_reservations("Nodes=x\n")
    job = parse_job(SHOW_JOB, "12")
    assert (job.state, job.exit_code, job.reason) == ("FAILED", "1:0", "NonZeroExitCode")
    assert not job.active
    assert str(job) == "job 12 FAILED exit 1:0 (NonZeroExitCode)"
    with pytest.raises(ValueError, match="no record of job 13"):
        parse_job(SHOW_JOB, "13")
    assert JOB_STATES["COMPLETED"] is LaunchState.SUCCEEDED
    assert JOB_STATES["TIMEOUT"] is LaunchState.FAILED
    assert JOB_STATES["COMPLETING"] is LaunchState.RUNNING


@pytest.mark.parametrize(
    "ref",
    ["12", "12:other", "x:minder-selfcheck-a", "12:minder-selfcheck-", "0:minder-selfcheck-a"],
)
def test_a_ref_this_launcher_did_not_make_is_refused(ref: str) -> None:
    with pytest.raises(ActionError, match="scheduler ref") as info:
        parse_ref(ref)
    assert not info.value.transient
    assert parse_ref("12:minder-selfcheck-c.1") == ("12", "minder-selfcheck-c.1")
    assert parse_ref(":minder-selfcheck-c.1") == ("", "minder-selfcheck-c.1")


def test_ref_for_names_the_check_without_a_job_id() -> None:
    launcher = SlurmSelfCheckLauncher(SlurmActuator(scontrol="/nonexistent/scontrol"))
    assert launcher.ref_for("c.1") == ":minder-selfcheck-c.1"
    assert parse_ref(launcher.ref_for("c.1")) == ("", "minder-selfcheck-c.1")
    with pytest.raises(ActionError, match="check id 'a b'") as info:
        launcher.ref_for("a b")
    assert not info.value.transient


def test_batch_script_runs_the_command_once_per_task_with_its_rank(tmp_path: Path) -> None:
    """The script through ``sh`` with a stand-in ``srun`` that runs the task as task 1 of 3:
    the argv arrives intact (spaces, quotes, ``$``) and the rank variables are set."""
    srun = tmp_path / "srun"
    srun.write_text(
        '#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift\n'
        'SLURM_PROCID=1 SLURM_NTASKS=3 SLURMD_NODENAME=n7 exec "$@"\n'
    )
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "argv.json"
    argv = (
        sys.executable,
        "-c",
        "import json, os, sys; json.dump([sys.argv[1:], os.environ['MINDER_SELFCHECK_RANK'],"
        " os.environ['MINDER_SELFCHECK_WORLD'], os.environ['MINDER_SELFCHECK_NODE']],"
        f" open({str(out)!r}, 'w'))",
        "a b",
        "it's",
        "$HOME",
        '"q"',
    )
    script = batch_script(argv, str(srun))
    assert script.startswith("#!/bin/sh\n")
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_NUM_NODES": "3"}
    subprocess.run(["/bin/sh", "-s"], input=script, text=True, env=env, check=True, timeout=30)
    assert json.loads(out.read_text()) == [["a b", "it's", "$HOME", '"q"'], "1", "3", "n7"]


@pytest.mark.parametrize(("suspect", "token"), [("n7", "s3cr3t-QZ"), ("n1", None)])
def test_batch_script_gives_the_token_to_the_suspects_task_only(
    tmp_path: Path, suspect: str, token: str | None
) -> None:
    srun = tmp_path / "srun"
    srun.write_text(
        '#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift\n'
        'SLURM_PROCID=1 SLURM_NTASKS=3 SLURMD_NODENAME=n7 exec "$@"\n'
    )
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "token.json"
    argv = (
        sys.executable,
        "-c",
        "import json, os; json.dump(os.environ.get('MINDER_SELFCHECK_TOKEN'),"
        f" open({str(out)!r}, 'w'))",
    )
    script = batch_script(argv, str(srun))
    assert "s3cr3t-QZ" not in script
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_NUM_NODES": "3",
        "MINDER_SELFCHECK_SUSPECT": suspect,
        "MINDER_SELFCHECK_TOKEN": "s3cr3t-QZ",
    }
    subprocess.run(["/bin/sh", "-s"], input=script, text=True, env=env, check=True, timeout=30)
    assert json.loads(out.read_text()) == token


def _launch(**changes: object) -> CheckLaunch:
    fields: dict[str, object] = {
        "check_id": "c1",
        "alert_id": "a1",
        "node": "n1",
        "partners": ("n2",),
        "command": ("minder", "selfcheck", "run"),
        "env": {},
        "timeout_s": 60.0,
    }
    fields.update(changes)
    return CheckLaunch(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"check_id": "a b"}, "check id"),
        ({"check_id": "x" * 65}, "check id"),
        ({"alert_id": "a;b"}, "alert id"),
        ({"node": "n[1-2]"}, "not a single Slurm node name"),
        ({"partners": ("n1",)}, "repeat a node"),
        ({"partners": ("n2", "n2")}, "repeat a node"),
        ({"command": ()}, "command"),
        ({"command": ("minder", "")}, "command"),
        ({"env": {"A,B": "x"}}, "environment name"),
        ({"env": {"1X": "x"}}, "environment name"),
        ({"timeout_s": 0.0}, "timeout"),
        ({"timeout_s": float("nan")}, "timeout"),
    ],
)
def test_a_bad_launch_is_refused_before_slurm_is_asked(
    changes: dict[str, object], message: str
) -> None:
    launcher = SlurmSelfCheckLauncher(SlurmActuator(scontrol="/nonexistent/scontrol"))
    with pytest.raises(ActionError, match=message) as info:
        launcher.launch(_launch(**changes))
    assert not info.value.transient


def test_options_are_checked_and_clients_sit_next_to_scontrol() -> None:
    actuator = SlurmActuator(scontrol="/opt/slurm/bin/scontrol")
    launcher = SlurmSelfCheckLauncher(actuator)
    assert (launcher.sbatch, launcher.scancel, launcher.sacct) == (
        "/opt/slurm/bin/sbatch",
        "/opt/slurm/bin/scancel",
        "/opt/slurm/bin/sacct",
    )
    assert SlurmSelfCheckLauncher(SlurmActuator()).sbatch == "sbatch"
    checked: SelfCheckLauncher = launcher
    assert checked.name == "slurm"
    with pytest.raises(ValueError, match="check_user"):
        SlurmSelfCheckLauncher(actuator, LauncherOptions(check_user="a b"))
    with pytest.raises(ValueError, match="master_port"):
        SlurmSelfCheckLauncher(actuator, LauncherOptions(master_port=0))
    with pytest.raises(ValueError, match="partition"):
        SlurmSelfCheckLauncher(actuator, LauncherOptions(partition="a,b"))
    with pytest.raises(ValueError, match="work_dir"):
        SlurmSelfCheckLauncher(actuator, work_dir="relative")
    with pytest.raises(ValueError, match="'exclusive' is not an sbatch option"):
        SlurmSelfCheckLauncher(actuator, LauncherOptions(sbatch_args=("exclusive",)))
    with pytest.raises(ValueError, match="'--export=ALL' is set by the launcher"):
        SlurmSelfCheckLauncher(actuator, LauncherOptions(sbatch_args=("--export=ALL",)))
    assert launcher.squeue == "/opt/slurm/bin/squeue"
    assert LauncherOptions().sbatch_args == ("--exclusive",)


def test_build_selfcheck_launcher_picks_the_target() -> None:
    actuator = SlurmActuator(scontrol="/opt/slurm/bin/scontrol")
    launcher = build_selfcheck_launcher(actuator, LauncherOptions(master_port=29700))
    assert isinstance(launcher, SlurmSelfCheckLauncher)
    assert launcher.actuator is actuator and launcher.options.master_port == 29700

    class Elsewhere:
        name = "none"

    assert build_selfcheck_launcher(Elsewhere(), LauncherOptions()) is None  # type: ignore[arg-type]


# -- against a real cluster ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    """A real cluster of four nodes, for this module (a suspect and up to three partners)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster(nodes=NODES) as started:
        yield started


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's cluster, every node plain IDLE again after the test (its jobs cancelled,
    reservations deleted, nodes resumed)."""
    yield cluster
    for node in NODES:
        cluster.client("scancel", f"--nodelist={node}", check=False)
    for line in cluster.reservations().splitlines():
        if line.startswith("ReservationName="):
            cluster.delete_reservation(line.split()[0].removeprefix("ReservationName="))
    for node in NODES:
        cluster.scontrol("update", f"NodeName={node}", "State=RESUME", check=False)
    for node in NODES:
        cluster.wait_idle(node, timeout_s=60)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """Where the worker writes each node's environment."""
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


def _worker(tmp_path: Path) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    script.chmod(0o755)
    return script


def _launcher(cluster: SlurmCluster, work_dir: Path, **kwargs: object) -> SlurmSelfCheckLauncher:
    """A launcher for ``cluster`` whose jobs write their output into ``work_dir``."""
    options = kwargs.pop("options", None) or LauncherOptions(master_port=29591)
    assert isinstance(options, LauncherOptions)
    actuator = SlurmActuator(scontrol=cluster.scontrol_path, slurm_conf=cluster.conf_path)
    return SlurmSelfCheckLauncher(
        actuator,
        options,
        work_dir=str(work_dir),
        end_wait_s=30.0,
        **kwargs,  # type: ignore[arg-type]
    )


def _drain(launcher: SlurmSelfCheckLauncher, node: str = SUSPECT) -> str:
    alert_id = secrets.token_hex(8)
    outcome = launcher.actuator.apply(node, alert_id=alert_id, reason="gpu_xid gpu5 xid=79")
    assert outcome.changed
    return alert_id


def _wait_status(
    launcher: SlurmSelfCheckLauncher, ref: str, states: set[LaunchState], timeout_s: float = 60.0
) -> LaunchState:
    deadline = time.monotonic() + timeout_s
    while True:
        status = launcher.status(ref)
        if status.state in states:
            return status.state
        assert time.monotonic() < deadline, f"check {ref} still {status}"
        time.sleep(0.3)


def _check(
    alert_id: str,
    worker: Path,
    out_dir: Path,
    partners: tuple[str, ...],
    *,
    exit_code: int = 0,
    sleep_s: float = 0.0,
    token: str = "tok-" + "s3cr3t" * 4,
    check_id: str | None = None,
) -> CheckLaunch:
    return CheckLaunch(
        check_id=check_id or secrets.token_hex(6),
        alert_id=alert_id,
        node=SUSPECT,
        partners=partners,
        command=(sys.executable, str(worker), str(out_dir), str(exit_code), str(sleep_s)),
        env={
            "MINDER_SELFCHECK_TOKEN": token,
            "MINDER_SELFCHECK_REPORT_URL": "http://127.0.0.1:9/",
        },
        timeout_s=120.0,
    )


def test_ready_only_for_minders_own_drain_of_a_node_without_a_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    launcher = _launcher(slurm, tmp_path)
    assert "not drained by Minder" in (launcher.ready(SUSPECT, alert_id="a1") or "")
    slurm.drain(SUSPECT, "hardware: PSU")
    why = launcher.ready(SUSPECT, alert_id="a1") or ""
    assert "someone else" in why and "PSU" in why
    slurm.scontrol("update", f"NodeName={SUSPECT}", "State=RESUME")
    slurm.wait_idle(SUSPECT)

    job = slurm.submit_sleep(SUSPECT, seconds=300)
    alert_id = _drain(launcher)
    why = launcher.ready(SUSPECT, alert_id=alert_id) or ""
    assert "still runs a job" in why and "DRAINED" in why
    assert "another alert" in (launcher.ready(SUSPECT, alert_id="other") or "")
    slurm.cancel_job(job)
    slurm.wait_for_state(SUSPECT, lambda flags: flags == {"IDLE", "DRAIN"})
    assert launcher.ready(SUSPECT, alert_id=alert_id) is None


def test_partners_are_idle_unreserved_nodes_of_the_partition(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    launcher = _launcher(slurm, tmp_path)
    assert launcher.partners(SUSPECT, 5) == (P1, P2, P3)
    assert launcher.partners(SUSPECT, 2) == (P1, P2)
    assert launcher.partners(SUSPECT, 0) == ()
    job = slurm.submit_sleep(P1, seconds=300)  # allocated: runs a job
    slurm.drain(P2, "operator: cabling")  # drained
    assert launcher.partners(SUSPECT, 5) == (P3,)
    slurm.create_reservation("someone-elses", [P3])  # reserved, before its flags show
    assert launcher.partners(SUSPECT, 5) == ()
    slurm.cancel_job(job)
    slurm.wait_idle(P1)
    assert launcher.partners(SUSPECT, 5) == (P1,)
    other = _launcher(slurm, tmp_path, options=LauncherOptions(partition="nosuch"))
    assert other.partners(SUSPECT, 5) == ()


def test_a_passing_check_runs_on_every_node_then_returns_the_node(
    slurm: SlurmCluster, tmp_path: Path, out_dir: Path
) -> None:
    # sbatch through a wrapper that records its argv: the token must not be on it.
    argv_log = tmp_path / "sbatch-argv"
    wrapper = tmp_path / "sbatch"
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" >> {argv_log}\nexec {shutil.which("sbatch")} "$@"\n'
    )
    wrapper.chmod(0o755)
    launcher = _launcher(slurm, tmp_path, sbatch=str(wrapper))
    alert_id = _drain(launcher)
    partners = launcher.partners(SUSPECT, 2)
    assert partners == (P1, P2)
    token = "tok-" + secrets.token_urlsafe(24)
    launch = _check(alert_id, _worker(tmp_path), out_dir, partners, token=token)

    ref = launcher.launch(launch)
    job_id, reservation = parse_ref(ref)
    assert reservation == NAME_PREFIX + launch.check_id
    assert _wait_status(launcher, ref, {LaunchState.SUCCEEDED, LaunchState.FAILED}) is (
        LaunchState.SUCCEEDED
    )
    # Slurm's own view: the job completed on the three nodes, in the reservation.
    assert slurm.job_state(job_id) == "COMPLETED"
    assert slurm.job_field(job_id, "Reservation") == reservation
    assert slurm.job_field(job_id, "ExitCode") == "0:0"
    shown = slurm.show_job(job_id) + slurm.show_job(job_id, details=True)
    assert mark_for(alert_id) in shown  # the comment names the alert whose drain it replaces
    assert token not in shown
    assert token not in slurm.batch_script(job_id)
    assert token not in argv_log.read_text() and "--reservation=" + reservation in (
        argv_log.read_text().splitlines()
    )
    assert "--exclusive" in argv_log.read_text().splitlines()  # LauncherOptions.sbatch_args
    assert not any(a.startswith("--gres") for a in argv_log.read_text().splitlines())

    # Each node ran the command once, with its rank and the rendezvous.
    records = {node: json.loads((out_dir / f"{node}.json").read_text()) for node in NODES[:3]}
    assert sorted(r["MINDER_SELFCHECK_RANK"] for r in records.values()) == ["0", "1", "2"]
    for node, record in records.items():
        assert record["MINDER_SELFCHECK_NODE"] == node
        assert record["MINDER_SELFCHECK_WORLD"] == "3"
        assert record["MINDER_SELFCHECK_NODES"] == f"{SUSPECT},{P1},{P2}"
        assert record["MINDER_SELFCHECK_SUSPECT"] == SUSPECT
        assert record["MINDER_SELFCHECK_MASTER"] == "127.0.0.1:29591"
        assert record["MINDER_SELFCHECK_CHECK_ID"] == launch.check_id
        assert record["MINDER_SELFCHECK_TIMEOUT_S"] == "120"
        # Only the suspect posts the report: the partners never see the token.
        assert record.get("MINDER_SELFCHECK_TOKEN") == (token if node == SUSPECT else None)
        assert "MINDER_SELFCHECK_EXPECTED_GPUS" not in record  # these nodes have no Gres
        assert record["SLURM_JOB_RESERVATION"] == reservation
        assert record["uid"] == 0
    assert not (out_dir / f"{P3}.json").exists()

    # The check is over but not released: the reservation still holds the suspect, which is no
    # longer drained. A job without the reservation waits; another user may not use it.
    flags, reason = slurm.wait_for_state(SUSPECT, lambda f: "MAINTENANCE" in f)
    assert "DRAIN" not in flags and reason == ""
    waiting = slurm.job_id_of(slurm.submit(f"--nodelist={SUSPECT}", "--wrap=true"))
    refused = slurm.submit(
        f"--reservation={reservation}", f"--nodelist={SUSPECT}", "--wrap=true", user=NOBODY,
        check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and "access denied" in refused.stderr.lower()
    time.sleep(3)
    assert slurm.job_state(waiting) == "PENDING"

    outcome = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert outcome.changed and outcome.operation == "resume"
    assert f"deleted reservation {reservation}" in outcome.detail
    assert reservation not in slurm.reservations()
    slurm.wait_job(waiting, {"COMPLETED"})  # the node is back in service
    assert slurm.job_field(waiting, "NodeList") == SUSPECT
    again = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert not again.changed and "already" in again.detail
    assert slurm.node_state(SUSPECT) == (frozenset({"IDLE"}), "")


def test_a_failing_check_keeps_the_node_drained_with_minders_mark(
    slurm: SlurmCluster, tmp_path: Path, out_dir: Path
) -> None:
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    launch = _check(alert_id, _worker(tmp_path), out_dir, (P1,), exit_code=1)
    ref = launcher.launch(launch)
    job_id, reservation = parse_ref(ref)
    assert _wait_status(launcher, ref, {LaunchState.SUCCEEDED, LaunchState.FAILED}) is (
        LaunchState.FAILED
    )
    assert slurm.job_state(job_id) == "FAILED"
    assert "FAILED" in launcher.status(ref).detail
    # A job waiting for the suspect must never start: the drain comes before the reservation goes.
    waiting = slurm.job_id_of(slurm.submit(f"--nodelist={SUSPECT}", "--wrap=true"))
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="failed: gpu.matmul"
    )
    assert outcome.changed and outcome.operation == "drain"
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags
    assert reason.startswith(f"{mark_for(alert_id)} selfcheck failed: gpu.matmul")
    assert reservation not in slurm.reservations()
    time.sleep(3)
    assert slurm.job_state(waiting) == "PENDING"
    again = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="failed: gpu.matmul"
    )
    assert not again.changed
    # The partner is back in service.
    slurm.wait_idle(P1)
    # A later pass of the same alert lifts Minder's drain (and only Minder's).
    back = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert back.changed
    slurm.wait_job(waiting, {"COMPLETED"})


def test_a_pass_does_not_return_a_node_someone_else_drained_meanwhile(
    slurm: SlurmCluster, tmp_path: Path, out_dir: Path
) -> None:
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    ref = launcher.launch(_check(alert_id, _worker(tmp_path), out_dir, ()))
    _wait_status(launcher, ref, {LaunchState.SUCCEEDED})
    slurm.drain(SUSPECT, "operator: replace DIMM")
    outcome = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert "someone else" in outcome.detail
    assert not outcome.changed  # not returned: the service must not count it as a return
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags and reason == "operator: replace DIMM"


def test_cancel_stops_a_hanging_check(slurm: SlurmCluster, tmp_path: Path, out_dir: Path) -> None:
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    ref = launcher.launch(_check(alert_id, _worker(tmp_path), out_dir, (P1,), sleep_s=600))
    job_id, _ = parse_ref(ref)
    assert _wait_status(launcher, ref, {LaunchState.RUNNING}) is LaunchState.RUNNING
    launcher.cancel(ref)
    assert _wait_status(launcher, ref, {LaunchState.FAILED}) is LaunchState.FAILED
    assert slurm.job_state(job_id) == "CANCELLED"
    launcher.cancel(ref)  # again: nothing to cancel, no error
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="timed out"
    )
    assert outcome.changed
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags and reason.startswith(f"{mark_for(alert_id)} selfcheck timed out")


def test_release_ends_a_check_still_running(
    slurm: SlurmCluster, tmp_path: Path, out_dir: Path
) -> None:
    """Slurm will not delete a reservation in use: release cancels the job first."""
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    ref = launcher.launch(_check(alert_id, _worker(tmp_path), out_dir, (), sleep_s=600))
    job_id, reservation = parse_ref(ref)
    _wait_status(launcher, ref, {LaunchState.RUNNING})
    outcome = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert f"cancelled job {job_id}" in outcome.detail
    assert reservation not in slurm.reservations()
    slurm.wait_idle(SUSPECT)


def test_a_failed_submission_puts_the_drain_back(slurm: SlurmCluster, tmp_path: Path) -> None:
    launcher = _launcher(slurm, tmp_path, options=LauncherOptions(partition="nosuch"))
    alert_id = _drain(launcher)
    with pytest.raises(ActionError, match="sbatch") as info:
        launcher.launch(_check(alert_id, _worker(tmp_path), tmp_path, ()))
    assert not info.value.transient
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags and carries_mark(reason, alert_id)
    assert "gpu_xid gpu5 xid=79" in reason
    assert NAME_PREFIX not in slurm.reservations()


def test_a_gpu_node_asks_for_its_gres_and_tells_the_check_how_many(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The suspect's ``scontrol show node`` says ``Gres=gpu:2`` (added by a wrapper: the test
    nodes have no GPU): the job asks for ``--gres=gpu:2`` and gets
    ``MINDER_SELFCHECK_EXPECTED_GPUS=2``. The real controller then refuses a GPU this cluster
    does not have ("Invalid generic resource"), and the launch puts the drain back."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        f'#!/bin/sh\nif [ "$1" = show ] && [ "$2" = node ]; then\n'
        f'  {slurm.scontrol_path} "$@" | sed "s/^\\( *\\)Gres=[^ ]*/\\1Gres=gpu:2/"\n'
        f'else\n  exec {slurm.scontrol_path} "$@"\nfi\n'
    )
    scontrol.chmod(0o755)
    log = tmp_path / "sbatch-log"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" "EXPECTED=$MINDER_SELFCHECK_EXPECTED_GPUS" >> {log}\n'
        f'exec {shutil.which("sbatch")} "$@"\n'
    )
    sbatch.chmod(0o755)
    actuator = SlurmActuator(scontrol=str(scontrol), slurm_conf=slurm.conf_path)
    clients = {name: shutil.which(name) for name in ("scancel", "sacct", "squeue")}
    launcher = SlurmSelfCheckLauncher(
        actuator,
        LauncherOptions(master_port=29591),
        sbatch=str(sbatch),
        work_dir=str(tmp_path),
        **clients,  # type: ignore[arg-type]
    )
    alert_id = _drain(launcher)
    with pytest.raises(ActionError, match="generic resource"):
        launcher.launch(_check(alert_id, _worker(tmp_path), tmp_path, (P1,)))
    lines = log.read_text().splitlines()
    assert "--gres=gpu:2" in lines and "--exclusive" in lines
    assert "EXPECTED=2" in lines
    assert "MINDER_SELFCHECK_EXPECTED_GPUS" in next(a for a in lines if a.startswith("--export="))
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags and carries_mark(reason, alert_id)
    assert NAME_PREFIX not in slurm.reservations()
    # An explicit --gres in sbatch_args wins (a GRES of another name, a share of the GPUs).
    log.unlink()
    slurm.wait_for_state(SUSPECT, lambda flags: flags == {"IDLE", "DRAIN"})  # pinged again
    other = SlurmSelfCheckLauncher(
        actuator,
        LauncherOptions(master_port=29591, sbatch_args=("--gres=gpu:h100:1",)),
        sbatch=str(sbatch),
        work_dir=str(tmp_path),
        **clients,  # type: ignore[arg-type]
    )
    with pytest.raises(ActionError, match="generic resource"):
        other.launch(_check(alert_id, _worker(tmp_path), tmp_path, ()))
    lines = log.read_text().splitlines()
    assert [a for a in lines if a.startswith("--gres")] == ["--gres=gpu:h100:1"]
    assert "--exclusive" not in lines and "EXPECTED=2" in lines


def test_launch_refuses_a_busy_partner_and_someone_elses_drain(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    job = slurm.submit_sleep(P1, seconds=300)
    with pytest.raises(ActionError, match="no longer idle") as info:
        launcher.launch(_check(alert_id, _worker(tmp_path), tmp_path, (P1,)))
    assert info.value.transient
    slurm.cancel_job(job)
    slurm.drain(SUSPECT, "operator: firmware")  # replaces Minder's reason
    with pytest.raises(ActionError, match="someone else") as info:
        launcher.launch(_check(alert_id, _worker(tmp_path), tmp_path, ()))
    assert not info.value.transient  # someone else's drain never becomes Minder's
    assert slurm.node_state(SUSPECT) == (frozenset({"IDLE", "DRAIN"}), "operator: firmware")
    assert NAME_PREFIX not in slurm.reservations()


def test_the_check_runs_as_the_check_user(slurm: SlurmCluster) -> None:
    """``check_user`` other than Minder's: the reservation admits only them and the job runs as
    them (``sbatch --uid/--gid``, Minder being root)."""
    # nobody reaches neither pytest's tmp_path nor this venv (under /root): a shell command
    # writing into a directory of its own, also the job's working directory.
    shared = Path(tempfile.mkdtemp(prefix="minder-selfcheck-test-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        launcher = _launcher(
            slurm, shared, options=LauncherOptions(check_user="nobody", master_port=29592)
        )
        alert_id = _drain(launcher)
        launch = CheckLaunch(
            check_id=secrets.token_hex(6),
            alert_id=alert_id,
            node=SUSPECT,
            partners=(P1,),
            command=("/bin/sh", "-c", 'id -u > "$0/$MINDER_SELFCHECK_NODE.uid"', str(shared)),
            timeout_s=60.0,
        )
        ref = launcher.launch(launch)
        _, reservation = parse_ref(ref)
        assert _wait_status(launcher, ref, {LaunchState.SUCCEEDED, LaunchState.FAILED}) is (
            LaunchState.SUCCEEDED
        )
        for node in (SUSPECT, P1):
            assert (shared / f"{node}.uid").read_text().strip() == str(NOBODY)
        assert "Users=nobody" in slurm.reservations()
        refused = slurm.submit(
            f"--reservation={reservation}", f"--nodelist={SUSPECT}", "--wrap=true", check=False
        )
        assert refused.returncode != 0  # root is not the reservation's user
        launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_an_interrupted_launch_is_cleaned_up_with_ref_for(
    slurm: SlurmCluster, tmp_path: Path, out_dir: Path
) -> None:
    """The launch reached Slurm but its ref was never stored (Minder died, or the database
    refused it): ``ref_for`` finds the job by its name and release fails the node cleanly."""
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    launch = _check(alert_id, _worker(tmp_path), out_dir, (P1,), sleep_s=600)
    stored = launcher.launch(launch)  # the ref the service failed to record
    job_id, reservation = parse_ref(stored)
    ref = launcher.ref_for(launch.check_id)
    assert ref == f":{reservation}"
    assert _wait_status(launcher, ref, {LaunchState.RUNNING}) is LaunchState.RUNNING
    assert job_id in launcher.status(ref).detail
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="launch interrupted"
    )
    assert outcome.changed and f"cancelled job {job_id}" in outcome.detail
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags
    assert reason.startswith(f"{mark_for(alert_id)} selfcheck launch interrupted")
    assert reservation not in slurm.reservations()
    assert slurm.job_state(job_id) == "CANCELLED"
    assert not slurm.client("squeue", "--noheader", f"--name={reservation}").stdout.strip()
    launcher.cancel(ref)  # nothing left to cancel: no error
    again = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="launch interrupted"
    )
    assert not again.changed
    slurm.wait_idle(P1)


def test_a_launch_interrupted_after_the_reservation_is_cleaned_up(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Only the reservation was made (and the node resumed inside it) when the launch died:
    release by ``ref_for`` drains the node again with Minder's mark and deletes the reservation,
    and no job is left."""
    launcher = _launcher(slurm, tmp_path)
    alert_id = _drain(launcher)
    check_id = secrets.token_hex(6)
    reservation = NAME_PREFIX + check_id
    ref = launcher.ref_for(check_id)
    slurm.create_reservation(reservation, [SUSPECT], "Flags=MAINT")
    assert launcher.actuator.undo(SUSPECT, alert_id=alert_id).changed  # as launch resumes it
    status = launcher.status(ref)
    assert status.state is LaunchState.GONE and reservation in status.detail
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="launch interrupted"
    )
    assert outcome.changed and f"deleted reservation {reservation}" in outcome.detail
    flags, reason = slurm.node_state(SUSPECT)
    assert "DRAIN" in flags and carries_mark(reason, alert_id)
    assert reservation not in slurm.reservations()
    assert not slurm.client("squeue", "--noheader", f"--nodelist={SUSPECT}").stdout.strip()


def test_status_of_a_forgotten_job_is_gone(slurm: SlurmCluster, tmp_path: Path) -> None:
    launcher = _launcher(slurm, tmp_path)
    status = launcher.status("999999:minder-selfcheck-nothing")
    assert status.state is LaunchState.GONE  # no accounting here: sacct cannot say more
    outcome = launcher.release(
        "999999:minder-selfcheck-nothing", node=SUSPECT, alert_id="a1", passed=True, reason="x"
    )
    assert not outcome.changed


# -- the real ``minder selfcheck run`` ----------------------------------------------------------


class _ReportSink:
    """Where the check posts its report: ``POST /api/v1/selfchecks/{id}/report`` with the check's
    token, answered as the API's contract says (200 with the record, 401 for a wrong token). A
    stand-in for Minder's API, which the service's own end-to-end tests run for real."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.reports: list[dict[str, object]] = []
        self.refused = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                parts = self.path.strip("/").split("/")
                if self.headers.get("Authorization") != f"Bearer {sink.token}":
                    sink.refused += 1
                    self._answer(401, {"detail": "wrong or missing self-check token"})
                elif parts[:3] != ["api", "v1", "selfchecks"] or parts[4:] != ["report"]:
                    self._answer(404, {"detail": "not found"})
                else:
                    sink.reports.append(body)
                    verdict = body.get("verdict")
                    state = {"pass": "passed", "fail": "failed"}.get(str(verdict), "inconclusive")
                    self._answer(200, {"id": parts[3], "state": state, "report": body})

            def _answer(self, code: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _ReportSink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _minder_selfcheck(sink: _ReportSink, check_id: str, *checks: str) -> tuple[str, ...]:
    minder = Path(sys.executable).with_name("minder")
    options = [part for name in checks for part in ("--check", name)]
    return (
        *ONE_HOST_COLLECTIVE, str(minder), "selfcheck", "run", *options, "--format", "json",
        "--report-url", sink.url, "--check-id", check_id,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("minder.cli.selfcheck") is None,
    reason="minder selfcheck run is not there yet (minder/cli/selfcheck.py)",
)
def test_the_real_minder_selfcheck_run_reports_pass_and_fail(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The real command on the suspect and two partners (the collective over gloo among three
    ranks, rendezvous on the suspect's NodeAddr), its report posted with the token; then a run
    forced to fail (a matmul baseline no machine reaches)."""
    launcher = _launcher(slurm, tmp_path, options=LauncherOptions(master_port=29593))
    token = "tok-" + secrets.token_urlsafe(24)
    with _ReportSink(token) as sink:
        alert_id = _drain(launcher)
        check_id = secrets.token_hex(6)
        launch = CheckLaunch(
            check_id=check_id,
            alert_id=alert_id,
            node=SUSPECT,
            partners=launcher.partners(SUSPECT, 2),
            command=_minder_selfcheck(sink, check_id, "collective.allreduce", "host.disk"),
            env={"MINDER_SELFCHECK_TOKEN": token, "MINDER_SELFCHECK_REPORT_URL": sink.url},
            timeout_s=300.0,
        )
        ref = launcher.launch(launch)
        state = _wait_status(launcher, ref, {LaunchState.SUCCEEDED, LaunchState.FAILED}, 240)
        job_id, _ = parse_ref(ref)
        output = next(tmp_path.glob(f"{NAME_PREFIX}{check_id}-{job_id}.out")).read_text()
        assert state is LaunchState.SUCCEEDED, output
        assert slurm.job_state(job_id) == "COMPLETED"
        (report,) = sink.reports  # the suspect alone posts
        assert sink.refused == 0
        assert (report["node"], report["check_id"], report["verdict"]) == (
            SUSPECT, check_id, "pass",
        )  # fmt: skip
        checks = {c["name"]: c for c in report["checks"]}  # type: ignore[attr-defined]
        assert checks["collective.allreduce"]["status"] == "pass", checks["collective.allreduce"]
        assert token not in output
        outcome = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True,
                                   reason=str(report["reason"]))  # fmt: skip
        assert outcome.changed
        slurm.wait_idle(SUSPECT)

        alert_id = _drain(launcher)
        check_id = secrets.token_hex(6)
        launch = CheckLaunch(
            check_id=check_id,
            alert_id=alert_id,
            node=SUSPECT,
            partners=(),
            command=_minder_selfcheck(sink, check_id, "gpu.matmul", "host.disk"),
            env={
                "MINDER_SELFCHECK_TOKEN": token,
                "MINDER_SELFCHECK_BASELINE_CPU": "1000000",  # TFLOP/s: no CPU does this
            },
            timeout_s=300.0,
        )
        ref = launcher.launch(launch)
        state = _wait_status(launcher, ref, {LaunchState.SUCCEEDED, LaunchState.FAILED}, 240)
        assert state is LaunchState.FAILED  # the command exits 1 on a fail
        report = sink.reports[-1]
        assert (report["check_id"], report["verdict"]) == (check_id, "fail")
        assert "gpu.matmul" in str(report["reason"])
        launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=False,
                         reason=str(report["reason"]))  # fmt: skip
        flags, reason = slurm.node_state(SUSPECT)
        assert "DRAIN" in flags and reason.startswith(f"{mark_for(alert_id)} selfcheck failed")


# -- drain to return, measured --------------------------------------------------------------------

PHASES = ("drain and launch", "job until COMPLETED", "release", "until IDLE", "drain to return")


def measure_drain_to_return(cluster: SlurmCluster, runs: int, work_dir: Path) -> list[list[float]]:
    """``runs`` times: Minder's drain of the suspect, ``ready``, two partners, ``launch`` of a
    ``/bin/true`` check, polling ``status`` until it ends, ``release(passed=True)``, until the
    suspect is plain ``IDLE``; the seconds of each phase (:data:`PHASES`) per run."""
    launcher = _launcher(cluster, work_dir)
    rows = []
    for _ in range(runs):
        began = time.monotonic()
        alert_id = _drain(launcher)
        assert launcher.ready(SUSPECT, alert_id=alert_id) is None
        partners = launcher.partners(SUSPECT, 2)
        launch = CheckLaunch(
            check_id=secrets.token_hex(6),
            alert_id=alert_id,
            node=SUSPECT,
            partners=partners,
            command=("/bin/true",),
            env={"MINDER_SELFCHECK_TOKEN": secrets.token_urlsafe(16)},
            timeout_s=60.0,
        )
        ref = launcher.launch(launch)
        launched = time.monotonic()
        while (state := launcher.status(ref).state) not in (
            LaunchState.SUCCEEDED, LaunchState.FAILED, LaunchState.GONE,
        ):  # fmt: skip
            time.sleep(0.1)
        assert state is LaunchState.SUCCEEDED
        ended = time.monotonic()
        assert launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True,
                                reason="passed").changed  # fmt: skip
        released = time.monotonic()
        cluster.wait_idle(SUSPECT, timeout_s=60)
        back = time.monotonic()
        rows.append(
            [launched - began, ended - launched, released - ended, back - released, back - began]
        )
        for partner in partners:
            cluster.wait_idle(partner, timeout_s=60)
    return rows


def test_drain_to_return_of_a_passing_check(slurm: SlurmCluster, tmp_path: Path) -> None:
    (row,) = measure_drain_to_return(slurm, 1, tmp_path)
    assert all(value >= 0 for value in row)
    assert row[-1] == pytest.approx(sum(row[:-1]))
    assert slurm.node_state(SUSPECT) == (frozenset({"IDLE"}), "")


if __name__ == "__main__":
    # python tests/minder/actions/test_selfcheck_slurm.py [runs]: the medians of drain to return
    # on a fresh one-host cluster (docs/selfcheck-schedulers.md, "Measured").
    import statistics

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    with SlurmCluster(nodes=NODES) as measured, tempfile.TemporaryDirectory() as scratch:
        table = measure_drain_to_return(measured, runs, Path(scratch))
    for i, row in enumerate(table, start=1):
        print(f"run {i}: " + ", ".join(f"{p} {v:.2f} s" for p, v in zip(PHASES, row, strict=True)))
    for k, phase in enumerate(PHASES):
        values = [row[k] for row in table]
        print(f"median {phase}: {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, {runs} runs)")  # fmt: skip
