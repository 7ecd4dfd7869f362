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
from slurm_cluster import SlurmCluster

from minder.actions.base import ActionError, ActionOutcome, NodeActuator, mark_for
from minder.actions.slurm import (
    DEFAULT_MAX_REASON_CHARS,
    NodeState,
    SlurmActuator,
    carries_mark,
    drain_reason,
    parse_show_node,
    parse_state_flags,
)

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
