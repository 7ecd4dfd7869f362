"""The Slurm actuator: parsing and error handling with fakes, then drain/resume against a real
one-host Slurm cluster (tests/minder/actions/slurm_cluster.py, fixture ``slurm_cluster``)."""

from __future__ import annotations

import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from slurm_cluster import SlurmCluster

from minder.actions.base import (
    ActionError,
    ActionOutcome,
    NodeActuator,
    SchedulerView,
    mark_for,
)
from minder.actions.executor import BREAKER, ActionExecutor, ActionMetrics
from minder.actions.policy import ActionPolicy
from minder.actions.slurm import (
    DEFAULT_MAX_REASON_CHARS,
    JobRecord,
    NodeState,
    SlurmActuator,
    carries_mark,
    drain_reason,
    is_slurm_job_id,
    parse_show_job,
    parse_show_node,
    parse_state_flags,
    records_of_job,
)
from minder.core.alert import Alert, AlertKind
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.actions import get_breaker, list_audit, machines_acted_on
from minder.storage.alerts import list_alerts
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import AlertEvent, Destination, record_alert_with_events
from minder.storage.records import MachineInfo

SHOW_DRAINED = """\
NodeName=gpu-0007 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.19
   AvailableFeatures=(null)
   NodeAddr=10.0.0.7 NodeHostName=gpu-0007 Version=22.05.8
   OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC State=NOTME
   RealMemory=100 AllocMem=0 FreeMem=20886 Sockets=1 Boards=1
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug
   Reason=minder:abc123 gpu_xid gpu5 xid=79 State=DOWN x=[y] [root@2026-11-25T11:04:05]
   Comment=State=DOWN

"""

SHOW_TWO_NODES = """\
NodeName=gpu-0001 Arch=x86_64
   State=MIXED ThreadsPerCore=1

NodeName=gpu-0002 Arch=x86_64
   State=DOWN*+DRAIN ThreadsPerCore=1
   Reason=hardware: PSU [admin@2026-01-01T00:00:00]
       second line of the reason
   Comment=ticket 42
"""


# What Slurm 22.05's ``scontrol show job <id>`` printed for a one-node batch job (trimmed).
SHOW_JOB_RUNNING = (
    """\
JobId=1 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   Partition=debug AllocNode:Sid=localhost:7443
   ReqNodeList=demo-n0023 ExcNodeList=(null)
   NodeList=demo-n0023
   BatchHost=demo-n0023
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   Command=(null)
   WorkDir=/tmp/minder-slurm-n4q87oao
   StdOut=/dev/null
   Power=
"""
    + "   \n\n"
)  # scontrol ends a record with a line of spaces and a blank line

# ``scontrol show job 2`` of array job 2 (tasks 0-1): the task that kept the array's id (JobId=2,
# task 1) and the other task (JobId=3, task 0), which is another job; plus a pending task.
SHOW_ARRAY = """\
JobId=2 ArrayJobId=2 ArrayTaskId=1 JobName=wrap
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=demo-n0025

JobId=3 ArrayJobId=2 ArrayTaskId=0 JobName=wrap
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=demo-n0024

JobId=4 ArrayJobId=2 ArrayTaskId=2 JobName=wrap
   JobState=PENDING Reason=Resources Dependency=(null)
   NodeList=(null)
"""

# A heterogeneous job (leader 10, components 10 and 11), in the format of Slurm's job_info.c.
SHOW_HET = """\
JobId=10 HetJobId=10 HetJobOffset=0 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=gpu[01-02]

JobId=11 HetJobId=10 HetJobOffset=1 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList=gpu03
"""


def _alert_id() -> str:
    return secrets.token_hex(10)


def _fake_scontrol(tmp_path: Path, output: str, exit_code: int) -> Path:
    """An executable that prints ``output`` to stderr and exits with ``exit_code``."""
    (tmp_path / "said.txt").write_text(output, encoding="utf-8")
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\ncat "{tmp_path / "said.txt"}" >&2\nexit {exit_code}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


# -- without a cluster ---------------------------------------------------------------------------


def test_satisfies_the_protocol() -> None:
    actuator: NodeActuator = SlurmActuator()
    assert actuator.name == "slurm"


def test_parse_show_node_reads_state_and_reason_without_stamp() -> None:
    state = parse_show_node(SHOW_DRAINED, "gpu-0007")
    assert state.flags == {"IDLE", "DRAIN"}
    assert state.reason == "minder:abc123 gpu_xid gpu5 xid=79 State=DOWN x=[y]"
    assert state.drained
    assert state.out_of_service


def test_parse_show_node_picks_the_record_and_joins_a_multi_line_reason() -> None:
    first = parse_show_node(SHOW_TWO_NODES, "gpu-0001")
    assert first == NodeState(frozenset({"MIXED"}), "")
    assert not first.drained
    second = parse_show_node(SHOW_TWO_NODES, "gpu-0002")
    assert second.flags == {"DOWN", "DRAIN", "NOT_RESPONDING"}
    assert second.reason == "hardware: PSU second line of the reason"
    with pytest.raises(ValueError, match="gpu-0003"):
        parse_show_node(SHOW_TWO_NODES, "gpu-0003")
    with pytest.raises(ValueError, match="gpu-0001"):  # a prefix is not the node
        parse_show_node("NodeName=gpu-00011 Arch=x\n   State=IDLE\n", "gpu-0001")


@pytest.mark.parametrize(
    ("value", "flags"),
    [
        ("IDLE", {"IDLE"}),
        ("MIXED+DRAIN", {"MIXED", "DRAIN"}),
        ("DOWN*", {"DOWN", "NOT_RESPONDING"}),
        ("idle~", {"IDLE"}),
        ("ALLOCATED+DRAIN+COMPLETING", {"ALLOCATED", "DRAIN", "COMPLETING"}),
    ],
)
def test_parse_state_flags(value: str, flags: set[str]) -> None:
    assert parse_state_flags(value) == flags


def test_drain_reason_is_one_short_line_that_starts_with_the_mark() -> None:
    alert_id = _alert_id()
    mark = mark_for(alert_id)
    assert drain_reason(alert_id, "gpu_xid gpu5 xid=79") == f"{mark} gpu_xid gpu5 xid=79"
    assert drain_reason(alert_id, "  \n\t ") == mark
    messy = 'line one\nline two\r\n\ttabbed "quoted" \u202eevil\u202c µs ✓ 日本\x00\x1b[31m'
    text = drain_reason(alert_id, messy)
    assert text == f"{mark} line one line two tabbed 'quoted' evil µs ✓ 日本 [31m"
    long = drain_reason(alert_id, "x" * 5000)
    assert len(long) == DEFAULT_MAX_REASON_CHARS
    assert long.startswith(f"{mark} xxx") and long.endswith("...")
    assert carries_mark(long, alert_id)
    assert not carries_mark(f"{mark}0 other", alert_id)  # a longer id is another alert
    with pytest.raises(ActionError, match="reason limit") as info:
        drain_reason(alert_id, "x", limit=10)
    assert not info.value.transient


@pytest.mark.parametrize("node", ["demo-n[0001-0004]", "a,b", "bad node", "NodeName=x", "", "-x"])
def test_a_node_name_that_is_not_one_node_is_refused_before_scontrol(node: str) -> None:
    actuator = SlurmActuator(scontrol="/nonexistent/scontrol")
    with pytest.raises(ActionError, match="not a single Slurm node name") as info:
        actuator.apply(node, alert_id=_alert_id(), reason="x")
    assert not info.value.transient
    with pytest.raises(ActionError, match="not a single Slurm node name"):
        actuator.undo(node, alert_id=_alert_id())


@pytest.mark.parametrize("alert_id", ["", "has space", "a\nb", "x" * 65])
def test_an_alert_id_that_is_not_a_token_is_refused(alert_id: str) -> None:
    actuator = SlurmActuator(scontrol="/nonexistent/scontrol")
    with pytest.raises(ActionError, match="alert id") as info:
        actuator.apply("gpu-0001", alert_id=alert_id, reason="x")
    assert not info.value.transient


def test_missing_scontrol_is_a_permanent_one_line_error() -> None:
    actuator = SlurmActuator(scontrol="/nonexistent/bin/scontrol")
    with pytest.raises(ActionError) as info:
        actuator.apply("gpu-0001", alert_id=_alert_id(), reason="x")
    assert not info.value.transient
    message = str(info.value)
    assert "\n" not in message
    assert "gpu-0001" in message and "scontrol not found" in message


def test_missing_slurm_conf_is_a_permanent_error(tmp_path: Path) -> None:
    actuator = SlurmActuator(slurm_conf=tmp_path / "nope.conf")
    with pytest.raises(ActionError, match="is not a file") as info:
        actuator.node_state("gpu-0001")
    assert not info.value.transient


@pytest.mark.parametrize(
    ("said", "exit_code", "transient", "match"),
    [
        (
            "slurm_load_node error: Unable to contact slurm controller (connect failure)",
            1,
            True,
            "cannot read",
        ),
        ("slurm_load_node error: Socket timed out on send/recv operation", 1, True, "cannot read"),
        ("Node gpu-0001 not found", 1, False, "unknown node 'gpu-0001'"),
        ("slurm_update error: Invalid user id", 1, False, "cannot read"),
        ("slurm_update error: Access/permission denied", 1, False, "cannot read"),
        ("scontrol: fatal: Unable to process configuration file", 1, False, "cannot read"),
        ("something new went wrong", 2, True, "exited with 2"),
        ("x" * 10_000 + "\n\x1b[31mline", 1, True, r"\.\.\.'?$"),
    ],
)
def test_scontrol_failures_are_classified(
    tmp_path: Path, said: str, exit_code: int, transient: bool, match: str
) -> None:
    actuator = SlurmActuator(scontrol=_fake_scontrol(tmp_path, said, exit_code))
    with pytest.raises(ActionError, match=match) as info:
        actuator.apply("gpu-0001", alert_id=_alert_id(), reason="x")
    assert info.value.transient is transient
    message = str(info.value)
    assert "gpu-0001" in message
    assert "\n" not in message and "\x1b" not in message
    assert len(message) < 400


def test_a_hanging_scontrol_is_a_transient_timeout(tmp_path: Path) -> None:
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    actuator = SlurmActuator(scontrol=script, timeout_s=0.3)
    began = time.monotonic()
    with pytest.raises(ActionError, match=r"took longer than 0\.3 s") as info:
        actuator.undo("gpu-0001", alert_id=_alert_id())
    assert info.value.transient
    assert time.monotonic() - began < 5


# -- the scheduler's view: which nodes a job runs on -----------------------------------------------


def test_the_actuator_is_its_own_scheduler_view() -> None:
    view: SchedulerView = SlurmActuator()
    assert callable(view.job_nodes)


def test_parse_show_job_reads_a_running_job() -> None:
    assert parse_show_job(SHOW_JOB_RUNNING) == [JobRecord("1", "RUNNING", "demo-n0023")]
    assert parse_show_job(SHOW_JOB_RUNNING)[0].running


def test_an_array_task_is_its_own_job() -> None:
    records = parse_show_job(SHOW_ARRAY)
    assert [(r.job_id, r.array_job_id, r.array_task_id) for r in records] == [
        ("2", "2", "1"),
        ("3", "2", "0"),
        ("4", "2", "2"),
    ]
    assert [r.node_list for r in records_of_job(records, "2")] == ["demo-n0025"]
    assert [r.node_list for r in records_of_job(records, "3")] == ["demo-n0024"]
    assert [r.job_id for r in records_of_job(records, "2_0")] == ["3"]
    assert [r.state for r in records_of_job(records, "2_2")] == ["PENDING"]
    assert records_of_job(records, "2_7") == []
    assert records_of_job(records, "99") == []


def test_a_heterogeneous_job_is_every_component_of_its_leader() -> None:
    records = parse_show_job(SHOW_HET)
    assert [r.node_list for r in records_of_job(records, "10")] == ["gpu[01-02]", "gpu03"]
    assert [r.node_list for r in records_of_job(records, "11")] == ["gpu03"]


def test_text_the_job_owner_chose_cannot_add_a_node() -> None:
    # a job name on the first line is the owner's: what follows JobName= is not read
    named = SHOW_JOB_RUNNING.replace(
        "JobName=wrap", "JobName=x NodeList=victim JobId=1 HetJobId=1 JobState=RUNNING"
    )
    assert parse_show_job(named) == [JobRecord("1", "RUNNING", "demo-n0023")]
    # a field at the start of a line twice: refused, not guessed
    commented = SHOW_JOB_RUNNING.replace("   Command=(null)", "   Command=x\n   NodeList=victim")
    with pytest.raises(ValueError, match="2 NodeList= lines"):
        parse_show_job(commented)
    # a second record of the same job (a name holding blank lines)
    forged = SHOW_JOB_RUNNING + "JobId=1 JobName=y\n   JobState=RUNNING\n   NodeList=victim\n"
    with pytest.raises(ValueError, match="job 1 has two records"):
        parse_show_job(forged)
    with pytest.raises(ValueError, match="expected JobId="):
        parse_show_job(SHOW_JOB_RUNNING + "NodeList=victim\n   JobState=RUNNING\n")
    with pytest.raises(ValueError, match="0 JobState= lines"):
        parse_show_job("JobId=5 JobName=x\n   NodeList=gpu01\n")


@pytest.mark.parametrize(
    ("job_id", "valid"),
    [
        ("4242", True),
        ("4240_2", True),
        ("0", False),
        ("00042", False),
        ("123+1", False),
        ("4240_[1-3]", False),
        (" 42", False),
        ("demo", False),
        ("", False),
        ("1" * 11, False),
    ],
)
def test_slurm_job_ids(job_id: str, valid: bool) -> None:
    assert is_slurm_job_id(job_id) is valid


def test_a_job_id_slurm_does_not_use_is_no_running_job_without_asking() -> None:
    actuator = SlurmActuator(scontrol="/nonexistent/bin/scontrol")  # never run
    for job_id in ("demo", "123+1", "1;reboot", "x" * 500):
        assert actuator.job_nodes(job_id) is None


def test_an_unknown_job_is_no_running_job(tmp_path: Path) -> None:
    said = "slurm_load_jobs error: Invalid job id specified"
    actuator = SlurmActuator(scontrol=_fake_scontrol(tmp_path, said, 1))
    assert actuator.job_nodes("4242") is None


@pytest.mark.parametrize(
    ("said", "exit_code", "transient"),
    [
        ("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", 1, True),
        ("slurm_load_jobs error: Socket timed out on send/recv operation", 1, True),
        ("scontrol: fatal: Unable to process configuration file", 1, False),
    ],
)
def test_a_check_that_cannot_reach_slurm_raises(
    tmp_path: Path, said: str, exit_code: int, transient: bool
) -> None:
    actuator = SlurmActuator(scontrol=_fake_scontrol(tmp_path, said, exit_code))
    with pytest.raises(ActionError) as info:
        actuator.job_nodes("4242")
    assert info.value.transient is transient
    assert "cannot read job '4242'" in str(info.value)


def _fake_show_job(tmp_path: Path, show: str) -> tuple[Path, Path]:
    """An scontrol that prints ``show`` for ``show job`` and expands ``gpu-[0001-0002]`` for
    ``show hostnames``, logging its arguments; returns it and the log."""
    (tmp_path / "show.txt").write_text(show, encoding="utf-8")
    log = tmp_path / "calls.txt"
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'if [ "$2" = hostnames ]; then printf "gpu-0001\\ngpu-0002\\n"; exit 0; fi\n'
        f'cat "{tmp_path / "show.txt"}"\n'
    )
    script.chmod(0o755)
    return script, log


def test_job_nodes_expand_a_ranged_node_list_with_scontrol(tmp_path: Path) -> None:
    show = SHOW_JOB_RUNNING.replace("NodeList=demo-n0023", "NodeList=gpu-[0001-0002]")
    script, log = _fake_show_job(tmp_path, show)
    assert SlurmActuator(scontrol=script).job_nodes("1") == {"gpu-0001", "gpu-0002"}
    assert log.read_text().splitlines() == ["show job 1", "show hostnames gpu-[0001-0002]"]


def test_job_nodes_split_a_plain_node_list_without_a_second_call(tmp_path: Path) -> None:
    show = SHOW_JOB_RUNNING.replace("NodeList=demo-n0023", "NodeList=gpu-0007,login1")
    script, log = _fake_show_job(tmp_path, show)
    assert SlurmActuator(scontrol=script).job_nodes("1") == {"gpu-0007", "login1"}
    assert log.read_text().splitlines() == ["show job 1"]


def test_a_pending_job_has_no_nodes(tmp_path: Path) -> None:
    pending = SHOW_JOB_RUNNING.replace("RUNNING", "PENDING")
    script, _ = _fake_show_job(tmp_path, pending)
    assert SlurmActuator(scontrol=script).job_nodes("1") is None
    unplaced = SHOW_JOB_RUNNING.replace("NodeList=demo-n0023", "NodeList=(null)")
    script, _ = _fake_show_job(tmp_path, unplaced)
    assert SlurmActuator(scontrol=script).job_nodes("1") is None


def test_a_job_a_fault_ended_still_names_the_nodes_it_ran_on(tmp_path: Path) -> None:
    """An XID often kills its job before Minder acts: the node did run it."""
    for state in ("NODE_FAIL", "FAILED", "CANCELLED", "COMPLETING", "COMPLETED", "SUSPENDED"):
        script, _ = _fake_show_job(tmp_path, SHOW_JOB_RUNNING.replace("RUNNING", state))
        assert SlurmActuator(scontrol=script).job_nodes("1") == {"demo-n0023"}, state


def test_unreadable_job_output_is_a_permanent_error(tmp_path: Path) -> None:
    show = SHOW_JOB_RUNNING.replace("   Command=(null)", "   Command=x\n   NodeList=victim")
    script, _ = _fake_show_job(tmp_path, show)
    with pytest.raises(ActionError, match="cannot read job '1'") as info:
        SlurmActuator(scontrol=script).job_nodes("1")
    assert not info.value.transient
    bad_list = SHOW_JOB_RUNNING.replace("NodeList=demo-n0023", "NodeList=gpu;reboot")
    script, _ = _fake_show_job(tmp_path, bad_list)
    with pytest.raises(ActionError, match="not a Slurm host list"):
        SlurmActuator(scontrol=script).job_nodes("1")


# -- against a real Slurm cluster ----------------------------------------------------------------


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, every node returned to plain IDLE after the test."""
    yield slurm_cluster
    for node in slurm_cluster.nodes:
        slurm_cluster.reset(node)


@pytest.fixture
def actuator(slurm_cluster: SlurmCluster) -> SlurmActuator:
    return SlurmActuator(scontrol=slurm_cluster.scontrol_path, slurm_conf=slurm_cluster.conf_path)


@pytest.mark.slow
class TestAgainstRealSlurm:
    def test_the_cluster_is_up_with_every_node_idle(self, cluster: SlurmCluster) -> None:
        assert cluster.start_seconds is not None
        for node in cluster.nodes:
            assert cluster.node_state(node) == (frozenset({"IDLE"}), "")

    def test_drain_marks_the_node_and_undo_resumes_it(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id = "demo-n0023", _alert_id()
        outcome = actuator.apply(node, alert_id=alert_id, reason="gpu_xid gpu5 xid=79")
        assert outcome == ActionOutcome("slurm", node, "drain", True, outcome.detail)
        assert "drained" in outcome.detail and "IDLE" in outcome.detail

        shown = cluster.show_node(node)
        assert "State=IDLE+DRAIN " in shown
        assert f"Reason=minder:{alert_id} gpu_xid gpu5 xid=79 [root@" in shown
        flags, reason = cluster.node_state(node)
        assert "DRAIN" in flags
        assert reason == f"{mark_for(alert_id)} gpu_xid gpu5 xid=79"
        assert actuator.node_state(node) == NodeState(flags, reason)

        again = actuator.apply(node, alert_id=alert_id, reason="gpu_xid gpu5 xid=79 (again)")
        assert not again.changed
        assert "already drained by Minder" in again.detail
        assert cluster.node_state(node)[1] == reason  # not rewritten

        undone = actuator.undo(node, alert_id=alert_id)
        assert undone.changed and undone.operation == "resume"
        flags, reason = cluster.wait_idle(node)
        assert flags == {"IDLE"} and reason == ""

        twice = actuator.undo(node, alert_id=alert_id)
        assert not twice.changed
        assert twice.detail.startswith("not drained")

    def test_a_busy_node_drains_and_its_job_keeps_running(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id = "demo-n0025", _alert_id()
        job_id = cluster.submit_sleep(node, seconds=120)
        assert cluster.node_state(node)[0] == {"ALLOCATED"}

        outcome = actuator.apply(node, alert_id=alert_id, reason="nic_pfc_pause rdma0")
        assert outcome.changed and "ALLOCATED" in outcome.detail
        flags, reason = cluster.node_state(node)
        assert flags == {"ALLOCATED", "DRAIN"}  # draining: the job runs on, no new job lands
        assert carries_mark(reason, alert_id)
        assert cluster.scontrol("show", "job", job_id).stdout.count("JobState=RUNNING") == 1
        assert not actuator.apply(node, alert_id=alert_id, reason="again").changed

        assert actuator.undo(node, alert_id=alert_id).changed
        flags, reason = cluster.wait_for_state(node, lambda f: f == {"ALLOCATED"})
        assert reason == ""

    def test_undo_for_another_alert_leaves_the_node_drained(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id, other = "demo-n0024", _alert_id(), _alert_id()
        assert actuator.apply(node, alert_id=alert_id, reason="straggler step_time").changed

        outcome = actuator.undo(node, alert_id=other)
        assert not outcome.changed
        assert f"by Minder for another alert ({mark_for(alert_id)})" in outcome.detail
        # and an apply for another alert keeps the first alert's mark
        applied = actuator.apply(node, alert_id=other, reason="gpu_ecc")
        assert not applied.changed
        assert "another alert" in applied.detail
        time.sleep(0.5)
        flags, reason = cluster.node_state(node)
        assert "DRAIN" in flags
        assert carries_mark(reason, alert_id)

    def test_an_operators_drain_is_neither_overwritten_nor_resumed(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id = "demo-n0025", _alert_id()
        cluster.drain(node, "hardware: replace PSU\n(ticket 42)")

        applied = actuator.apply(node, alert_id=alert_id, reason="gpu_xid gpu0 xid=48")
        assert not applied.changed
        assert "someone else" in applied.detail and "replace PSU" in applied.detail
        undone = actuator.undo(node, alert_id=alert_id)
        assert not undone.changed
        assert undone.detail.startswith("drained by someone else")
        assert "hardware: replace PSU (ticket 42)" in undone.detail  # both lines, on one

        flags, first_line = cluster.node_state(node)
        assert "DRAIN" in flags
        assert first_line == "hardware: replace PSU"
        assert actuator.node_state(node).reason == "hardware: replace PSU (ticket 42)"

    def test_an_operators_down_is_kept(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id = "demo-n0025", _alert_id()
        cluster.scontrol("update", f"NodeName={node}", "State=DOWN", "Reason=rack power work")
        applied = actuator.apply(node, alert_id=alert_id, reason="gpu_xid")
        assert not applied.changed and "rack power work" in applied.detail
        assert not actuator.undo(node, alert_id=alert_id).changed
        flags, reason = cluster.node_state(node)
        assert "DOWN" in flags and reason == "rack power work"

    def test_a_messy_reason_is_stored_sanitised(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node, alert_id = "demo-n0024", _alert_id()
        messy = "gpu_xid\ngpu5\r\nxid=79 \u202e“µs” ✓ 日本 " + "y" * 1000 + '"'
        outcome = actuator.apply(node, alert_id=alert_id, reason=messy)
        assert outcome.changed
        flags, reason = cluster.node_state(node)
        assert "DRAIN" in flags
        assert reason == drain_reason(alert_id, messy)
        assert reason.startswith(f"{mark_for(alert_id)} gpu_xid gpu5 xid=79 “µs” ✓ 日本 yyy")
        assert reason.endswith("...") and len(reason) == DEFAULT_MAX_REASON_CHARS
        assert not any(char in reason for char in '\n\r\u202e"')
        assert actuator.undo(node, alert_id=alert_id).changed

    def test_an_unknown_node_is_a_permanent_error(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        for call in (
            lambda: actuator.apply("demo-n9999", alert_id=_alert_id(), reason="x"),
            lambda: actuator.undo("demo-n9999", alert_id=_alert_id()),
        ):
            with pytest.raises(ActionError, match="unknown node 'demo-n9999'") as info:
                call()
            assert not info.value.transient

    def test_a_stopped_controller_is_a_transient_error(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        node = "demo-n0024"
        cluster.stop_controller()
        try:
            with pytest.raises(ActionError) as info:
                actuator.apply(node, alert_id=_alert_id(), reason="gpu_xid")
            assert info.value.transient
            assert node in str(info.value)
            assert "Unable to contact slurm controller" in str(info.value)
        finally:
            cluster.start_controller()
        cluster.wait_idle(node)

    def test_a_controller_that_does_not_answer_in_time_is_a_transient_error(
        self, cluster: SlurmCluster
    ) -> None:
        # A port nobody listens on: scontrol retries for MessageTimeout seconds, longer than 1 s.
        dead = cluster.write_conf("dead-port.conf", SlurmctldPort="1", MessageTimeout="10")
        actuator = SlurmActuator(scontrol=cluster.scontrol_path, slurm_conf=dead, timeout_s=1.0)
        with pytest.raises(ActionError, match="took longer than 1 s") as info:
            actuator.undo("demo-n0024", alert_id=_alert_id())
        assert info.value.transient

    def test_permission_denied_is_a_permanent_error(
        self, cluster: SlurmCluster, tmp_path: Path
    ) -> None:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to run scontrol as nobody")
        wrapper = tmp_path / "scontrol-as-nobody"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'exec {setpriv} --reuid=65534 --regid=65534 --clear-groups "{cluster.scontrol_path}" "$@"\n'
        )
        wrapper.chmod(0o755)
        actuator = SlurmActuator(scontrol=wrapper, slurm_conf=cluster.conf_path)
        node = "demo-n0024"
        assert actuator.node_state(node).flags == {"IDLE"}  # reading is allowed to anyone
        with pytest.raises(ActionError, match="Invalid user id") as info:
            actuator.apply(node, alert_id=_alert_id(), reason="gpu_xid")
        assert not info.value.transient
        assert node in str(info.value)
        assert cluster.node_state(node) == (frozenset({"IDLE"}), "")


# -- the executor's check against a real Slurm cluster ------------------------------------------

FAST = Backoff(base_s=0.01, cap_s=0.05, floor_s=0.01)
NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))


class CheckedHarness:
    """An enforcing executor in front of the real cluster, the breaker at one machine per hour
    (2 % of the fleet, as on 8 machines), its outbox in SQLite."""

    def __init__(self, cluster: SlurmCluster, tmp_path: Path, job_id: str) -> None:
        engine = create_engine_for(f"sqlite:///{tmp_path / 'checked.db'}")
        upgrade_database(engine)
        self.sessions: SessionFactory = session_factory(engine)
        with self.sessions.begin() as session:  # the watched fleet: the cluster's nodes
            machines = [MachineInfo(node, "", "") for node in cluster.nodes]
            upsert_job_machines(session, job_id, machines, 1.0)
        self.registry = CollectorRegistry()
        self.executor = ActionExecutor(
            SlurmActuator(scontrol=cluster.scontrol_path, slurm_conf=cluster.conf_path),
            ActionPolicy(enforce=True, max_per_job=1, max_fraction=0.02),
            self.sessions,
            notify=[NOTIFY],
            metrics=ActionMetrics(self.registry),
        )
        self.destinations = [self.executor.destination_spec(), NOTIFY]
        self.worker = DeliveryWorker(self.executor, self.sessions, backoff=FAST)

    def alert(self, job: str, machine: str) -> Alert:
        alert = Alert(job=job, machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count",
                      score=1.0, first_ts=1000.0, detected_ts=1001.0, devices=("gpu5",),
                      evidence={"rule": "xid", "code": 79})  # fmt: skip
        with self.sessions.begin() as session:
            stored, _ = record_alert_with_events(session, alert, self.destinations)
        self.worker.run_once()
        return stored

    def outcome(self, alert: Alert) -> str:
        with self.sessions() as session:
            entries, _ = list_audit(session, alert_id=alert.id)
        return entries[0].outcome

    def suspicious(self) -> list[Alert]:
        with self.sessions() as session:
            alerts, _ = list_alerts(session, kind="suspicious_source")
        return alerts


@pytest.mark.slow
class TestCheckedAgainstRealSlurm:
    def test_job_nodes_reads_running_jobs(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        one = cluster.submit_sleep("demo-n0023", seconds=120)
        two = cluster.submit_sleep(["demo-n0024", "demo-n0025"], seconds=120)
        assert "NodeList=demo-n[0024-0025]" in cluster.scontrol("show", "job", two).stdout
        assert actuator.job_nodes(one) == {"demo-n0023"}
        assert actuator.job_nodes(two) == {"demo-n0024", "demo-n0025"}  # a range, expanded
        assert actuator.job_nodes("999999") is None
        cluster.cancel_job(one)
        # cancelled (as a fault may end it): it ran there, Slurm still knows it for MinJobAge
        assert actuator.job_nodes(one) == {"demo-n0023"}

    def test_a_stopped_controller_makes_the_check_transient(
        self, cluster: SlurmCluster, actuator: SlurmActuator
    ) -> None:
        cluster.stop_controller()
        try:
            with pytest.raises(ActionError, match="Unable to contact slurm controller") as info:
                actuator.job_nodes("1")
            assert info.value.transient
        finally:
            cluster.start_controller()

    def test_only_an_alert_on_a_node_of_its_running_job_drains(
        self, cluster: SlurmCluster, tmp_path: Path
    ) -> None:
        job_id = cluster.submit_sleep("demo-n0023", seconds=300)
        h = CheckedHarness(cluster, tmp_path, job_id)

        # forged: a job id Slurm does not know, and a node outside the real job
        unknown = h.alert("999999", "demo-n0024")
        outside = h.alert(job_id, "demo-n0025")
        assert h.outcome(unknown) == h.outcome(outside) == "skipped_not_in_job"
        for node in ("demo-n0024", "demo-n0025"):
            assert "DRAIN" not in cluster.node_state(node)[0]
            assert "DRAIN" not in cluster.show_node(node)
        by_original = {a.evidence["original_alert_id"]: a for a in h.suspicious()}
        assert set(by_original) == {unknown.id, outside.id}
        reason = by_original[outside.id].evidence["reason"]
        assert reason == (
            f"node demo-n0025 is not running job {job_id} per slurm "
            "(the job runs on 1 other node(s))"
        )
        assert by_original[outside.id].machine == "demo-n0025"
        assert by_original[unknown.id].evidence["job_running"] is False
        with h.sessions() as session:
            assert not get_breaker(session, BREAKER).tripped
            assert machines_acted_on(session, since=0.0, operation="drain") == set()

        # the real fault on the job's node: drained, within the breaker's one machine
        real = h.alert(job_id, "demo-n0023")
        assert h.outcome(real) == "applied"
        flags, why = cluster.node_state("demo-n0023")
        assert flags == {"ALLOCATED", "DRAIN"} and carries_mark(why, real.id)
        with h.sessions() as session:
            assert not get_breaker(session, BREAKER).tripped
        assert (
            h.registry.get_sample_value(
                "minder_actions_total",
                {"target": "slurm", "operation": "drain", "outcome": "skipped_not_in_job"},
            )
            == 2
        )
