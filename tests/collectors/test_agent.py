"""The node agent's collection step, identity discovery and local Prometheus exposition."""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.agent import Agent, AgentExporter, SenderCounters
from collectors.base import Collected, ProblemLog
from collectors.fr_watch import FrWatcher
from collectors.labels import discover_identity, parse_label, slurm_leaf_switch
from minder.core.codec import WireFormat, decode_batch, encode_batch
from minder.core.errors import ValidationError
from minder.core.hang import MAX_SUMMARIES_PER_BATCH, RankSummary
from minder.core.metrics import validate_sample
from minder.core.records import Event, EventKind, Sample

T0 = 1_700_000_000.0


class FakeSource:
    """A source that returns what it is told (or raises it)."""

    def __init__(
        self,
        name: str,
        samples: Sequence[Sample] = (),
        events: Sequence[Event] = (),
        raises: BaseException | None = None,
    ) -> None:
        self.name = name
        self.problems = ProblemLog(name)
        self.samples = list(samples)
        self.events = list(events)
        self.raises = raises
        self.calls: list[float] = []
        self.closed = False

    def collect(self, now: float) -> Collected:
        self.calls.append(now)
        if self.raises is not None:
            raise self.raises
        out = Collected()
        out.samples.extend(self.samples)  # bypass add(): tests feed invalid samples on purpose
        out.events.extend(self.events)
        return out

    def close(self) -> None:
        self.closed = True


def _agent(*sources: FakeSource, **kwargs: float) -> Agent:
    return Agent(sources, job="j1", node="n1", labels={"group": "pp0"}, **kwargs)


def test_merges_sources_in_order_with_identity() -> None:
    gpu = FakeSource("nvml", [("gpu_util_ratio", "gpu0", 0.5), ("gpu_power_watts", "gpu0", 300.0)])
    xid = Event(EventKind.XID, "gpu0", T0, code=79)
    nic = FakeSource("rdma", [("rdma_port_up", "mlx5_0", 1.0)], events=[xid])
    batch = _agent(gpu, nic, interval_s=2.0).collect_once(T0)
    assert (batch.job, batch.node, batch.ts, batch.interval_s) == ("j1", "n1", T0, 2.0)
    assert batch.labels == {"group": "pp0"}
    assert batch.samples == [
        ("gpu_util_ratio", "gpu0", 0.5),
        ("gpu_power_watts", "gpu0", 300.0),
        ("rdma_port_up", "mlx5_0", 1.0),
    ]
    assert batch.events == [xid]
    assert gpu.calls == [T0] and nic.calls == [T0]
    for sample in batch.samples:
        validate_sample(*sample)


def test_goodbye_is_one_leave_event_without_samples_and_changes_nothing() -> None:
    host = FakeSource("host", [("cpu_util_ratio", "", 0.25)])
    agent = _agent(host, interval_s=2.0)
    last = agent.collect_once(T0)
    goodbye = agent.goodbye(T0 + 1.5, "SIGTERM")
    assert (goodbye.job, goodbye.node, goodbye.ts, goodbye.interval_s) == (
        "j1",
        "n1",
        T0 + 1.5,
        2.0,
    )
    assert goodbye.labels == {"group": "pp0"} and goodbye.samples == []
    assert goodbye.events == [
        Event(EventKind.LEAVE, device="", ts=T0 + 1.5, message="agent stopped: SIGTERM")
    ]
    # Not a collection: the sources are not read and /metrics keep the last data batch.
    assert host.calls == [T0]
    assert agent.last_batch is last and agent.collections_total == 1
    assert decode_batch(encode_batch(goodbye)).events == goodbye.events
    with pytest.raises(ValidationError, match="goodbye reason"):
        agent.goodbye(T0, "")


def test_a_raising_source_is_skipped_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = FakeSource("nvml", raises=RuntimeError("driver gone"))
    good = FakeSource("host", [("cpu_util_ratio", "", 0.25)])
    agent = _agent(bad, good)
    with caplog.at_level(logging.WARNING, logger="collectors.agent"):
        batches = [agent.collect_once(T0 + i) for i in range(3)]
    assert all(b.samples == [("cpu_util_ratio", "", 0.25)] for b in batches)
    assert agent.error_counts()[("nvml", "exception")] == 3
    assert caplog.text.count("driver gone") == 1
    bad.raises = ValueError("other")  # a new exception type is logged once more
    with caplog.at_level(logging.WARNING, logger="collectors.agent"):
        agent.collect_once(T0 + 3)
        agent.collect_once(T0 + 4)
    assert caplog.text.count("ValueError") == 1
    assert agent.error_counts()[("nvml", "exception")] == 5
    assert agent.collections_total == 5


def test_duplicates_keep_the_first_and_are_counted_for_the_later_source() -> None:
    first = FakeSource("nvml", [("gpu_util_ratio", "gpu0", 0.9)])
    second = FakeSource("dcgm", [("gpu_util_ratio", "gpu0", 0.1), ("gpu_util_ratio", "gpu1", 0.2)])
    agent = _agent(first, second)
    batch = agent.collect_once(T0)
    assert batch.samples == [("gpu_util_ratio", "gpu0", 0.9), ("gpu_util_ratio", "gpu1", 0.2)]
    assert agent.error_counts() == {("dcgm", "duplicate"): 1}


def test_invalid_samples_are_dropped_counted_per_source_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakeSource(
        "rdma",
        [
            ("rdma_port_up", "mlx5_0", 1.0),
            ("rdma_port_up", "mlx5_1", 7.0),  # out of range (ratio-like 0..1)
            ("not_a_metric", "mlx5_0", 1.0),  # unknown name
            ("gpu_util_ratio", "mlx5_0", 0.5),  # wrong device family
            ("rdma_tx_bytes_per_second", "mlx5_0", -1.0),  # negative rate
        ],
    )
    agent = _agent(source)
    with caplog.at_level(logging.WARNING, logger="collectors.agent"):
        for i in range(3):
            batch = agent.collect_once(T0 + i)
    assert batch.samples == [("rdma_port_up", "mlx5_0", 1.0)]
    assert agent.error_counts() == {("rdma", "invalid_sample"): 12}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4  # one per offending metric, not one per sample and second
    assert sum("not_a_metric" in m for m in messages) == 1
    assert sum("got value 7.0" in m for m in messages) == 1


def test_a_known_pair_with_a_bad_value_is_still_dropped() -> None:
    """Once a pair is known only its value is checked: NaN, infinities, values out of range and
    values that are not numbers are dropped as on the first interval; ints pass as floats."""
    source = FakeSource(
        "nvml", [("gpu_util_ratio", "gpu0", 0.5), ("gpu_power_watts", "gpu0", 300.0)]
    )
    agent = _agent(source)
    assert agent.collect_once(T0).samples == source.samples
    bad: list[object] = [math.nan, math.inf, -math.inf, 1.5, -0.5, "0.5", None, True]
    for i, value in enumerate(bad):
        source.samples = [("gpu_util_ratio", "gpu0", value), ("gpu_power_watts", "gpu0", 300.0)]  # type: ignore[list-item]
        batch = agent.collect_once(T0 + 1 + i)
        assert batch.samples == [("gpu_power_watts", "gpu0", 300.0)], value
    assert agent.error_counts() == {("nvml", "invalid_sample"): len(bad)}
    source.samples = [("gpu_util_ratio", "gpu0", 1), ("gpu_power_watts", "gpu0", 0)]
    batch = agent.collect_once(T0 + 20)
    assert batch.samples == [("gpu_util_ratio", "gpu0", 1.0), ("gpu_power_watts", "gpu0", 0.0)]
    assert all(type(v) is float for _, _, v in batch.samples)


def test_source_problem_log_reasons_are_reported() -> None:
    source = FakeSource("ethtool", [("pfc_rx_pause_per_second", "mlx5_0", 3.0)])
    agent = _agent(source)
    source.problems.report("timeout", "ethtool -S took too long")
    source.problems.report("timeout", "again")
    agent.collect_once(T0)
    assert agent.error_counts() == {("ethtool", "timeout"): 2}


def test_close_closes_every_source_even_when_one_fails() -> None:
    class Broken(FakeSource):
        def close(self) -> None:
            raise OSError("busy")

    a, b = Broken("a"), FakeSource("b")
    _agent(a, b).close()
    assert b.closed


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValidationError, match="interval_s is 0"):
        Agent([], job="j", node="n", labels={}, interval_s=0)
    with pytest.raises(ValidationError, match="each source once"):
        Agent([FakeSource("x"), FakeSource("x")], job="j", node="n", labels={})
    with pytest.raises(ValidationError, match="label key 'Bad-Key'"):
        Agent([], job="j", node="n", labels={"Bad-Key": "v"})
    with pytest.raises(ValidationError, match="non-empty"):
        Agent([], job="", node="n", labels={})


# -- identity ------------------------------------------------------------------------------


def test_identity_from_slurm() -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "gpu-017",
        "SLURM_TOPOLOGY_ADDR": "spine1.leaf12.gpu-017",
        "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node",
        "MINDER_LABEL_GROUP": "pp3",
    }
    job, node, labels = discover_identity(env, hostname=lambda: "ignored")
    assert (job, node) == ("4242", "gpu-017")
    assert labels == {"switch": "leaf12", "group": "pp3"}


def test_identity_from_kubernetes_downward_api() -> None:
    env = {
        "MINDER_JOB": "llm-pretrain",
        "NODE_NAME": "node-a",
        "POD_NAME": "minder-agent-x7",
        "POD_NAMESPACE": "training",
        "MINDER_LABEL_DOMAIN": "rack-7",
    }
    identity = discover_identity(env, hostname=lambda: "pod-hostname")
    assert identity.job == "llm-pretrain"
    assert identity.node == "node-a"
    assert identity.labels == {
        "pod": "minder-agent-x7",
        "namespace": "training",
        "domain": "rack-7",
    }
    env2 = {"MINDER_JOB": "j", "MY_NODE_NAME": "node-b", "MY_POD_NAME": "p"}
    assert discover_identity(env2).node == "node-b"


def test_explicit_configuration_wins() -> None:
    env = {
        "SLURM_JOB_ID": "1",
        "MINDER_JOB": "2",
        "SLURMD_NODENAME": "n-env",
        "MINDER_LABEL_GROUP": "env",
        "SLURM_TOPOLOGY_ADDR": "s.leaf.n",
    }
    assert discover_identity(env).job == "2"  # MINDER_JOB beats SLURM_JOB_ID
    job, node, labels = discover_identity(
        env, {"job": "cli", "node": "n-cli", "group": "cli", "switch": "", "extra": "x"}
    )
    assert (job, node) == ("cli", "n-cli")
    assert labels == {"switch": "leaf", "group": "cli", "extra": "x"}  # "" = option not given


def test_missing_job_names_the_variables_tried() -> None:
    with pytest.raises(ValidationError, match=r"MINDER_JOB, SLURM_JOB_ID"):
        discover_identity({"NODE_NAME": "n"})


def test_node_falls_back_to_the_host_name_then_fails_clearly() -> None:
    assert discover_identity({"MINDER_JOB": "j"}, hostname=lambda: "host7").node == "host7"
    with pytest.raises(ValidationError, match="MINDER_NODE, SLURMD_NODENAME, NODE_NAME"):
        discover_identity({"MINDER_JOB": "j"}, hostname=lambda: "")


def test_labels_are_checked() -> None:
    assert parse_label("Group=pp3") == ("group", "pp3")
    with pytest.raises(ValidationError, match="expected KEY=VALUE"):
        parse_label("group")
    with pytest.raises(ValidationError, match="reserved"):
        parse_label("device=x")
    with pytest.raises(ValidationError, match="non-empty printable"):
        parse_label("group=")
    with pytest.raises(ValidationError, match="not usable"):
        discover_identity({"MINDER_JOB": "j", "MINDER_LABEL_BAD-KEY": "v"}, hostname=lambda: "h")


def test_slurm_leaf_switch() -> None:
    assert slurm_leaf_switch("s1.s2.node7", "switch.switch.node") == "s2"
    assert slurm_leaf_switch("s2.node7") == "s2"
    assert slurm_leaf_switch("node7") is None
    assert slurm_leaf_switch("a.b", "switch.switch.node") is None  # pattern does not fit


# -- exposition ----------------------------------------------------------------------------


def _families(exporter: AgentExporter) -> dict[str, list]:
    text = generate_latest(exporter.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_exporter_serves_the_last_batch_and_agent_counters() -> None:
    gpu = FakeSource("nvml", [("gpu_util_ratio", "gpu0", 0.5), ("gpu_util_ratio", "gpu1", 0.75)])
    host = FakeSource("host", [("cpu_util_ratio", "", 0.25)])
    bad = FakeSource("probe", raises=RuntimeError("x"))
    agent = _agent(gpu, host, bad)
    exporter = AgentExporter(agent)
    before = _families(exporter)
    assert "minder_node_gpu_util_ratio" not in before
    assert before["minder_agent_info"][0].labels == {
        "job_id": "j1",
        "machine": "n1",
        "group": "pp0",
    }
    # every source's exception count exists from the start, at 0
    assert {(s.labels["source"], s.value) for s in before["minder_agent_source_errors"]} == {
        ("nvml", 0),
        ("host", 0),
        ("probe", 0),
    }

    agent.collect_once(T0)
    gpu.samples = [("gpu_util_ratio", "gpu0", 0.125)]  # gpu1 vanished: no stale series
    agent.collect_once(T0 + 1)
    families = _families(exporter)
    assert {s.labels["device"]: s.value for s in families["minder_node_gpu_util_ratio"]} == {
        "gpu0": 0.125
    }
    assert families["minder_node_cpu_util_ratio"][0].labels == {
        "device": "",
        "job_id": "j1",
        "machine": "n1",
    }
    assert families["minder_agent_collections"][0].value == 2
    errors = {
        (s.labels["source"], s.labels["reason"]): s.value
        for s in families["minder_agent_source_errors"]
    }
    assert errors == {("probe", "exception"): 2, ("nvml", "exception"): 0, ("host", "exception"): 0}
    seconds = {s.labels["source"] for s in families["minder_agent_collect_seconds"]}
    assert seconds == {"nvml", "host", "probe"}
    assert families["minder_agent_last_collection_timestamp_seconds"][0].value == T0 + 1
    assert "minder_agent_batches_sent" not in families

    exporter.set_sender(
        lambda: SenderCounters(
            batches_sent=5, dropped_oldest=2, spool_bytes=99, corrupt_dropped=3, spool_max_bytes=400
        )
    )
    families = _families(exporter)
    assert families["minder_agent_spool_max_bytes"][0].value == 400
    assert families["minder_agent_batches_sent"][0].value == 5
    assert families["minder_agent_dropped_oldest"][0].value == 2
    assert families["minder_agent_spool_bytes"][0].value == 99
    assert families["minder_agent_corrupt_dropped"][0].value == 3


def test_event_counts_are_exported_as_counters_since_start() -> None:
    gpu = FakeSource("nvml", [("gpu_xid_count", "gpu3", 2.0), ("gpu_util_ratio", "gpu3", 0.5)])
    agent = _agent(gpu)
    exporter = AgentExporter(agent)
    agent.collect_once(T0)
    gpu.samples = [("gpu_xid_count", "gpu3", 1.0), ("gpu_util_ratio", "gpu3", 0.5)]
    agent.collect_once(T0 + 1)
    text = generate_latest(exporter.registry).decode()
    # no gauge ends in _count (promtool rejects them): the interval counts add up to a counter
    assert "minder_node_gpu_xid_count" not in text
    assert "# TYPE minder_node_gpu_xid_total counter" in text
    families = _families(exporter)
    [sample] = families["minder_node_gpu_xid"]
    assert sample.value == 3.0
    assert sample.labels == {"job_id": "j1", "machine": "n1", "device": "gpu3"}


def test_exporter_uses_its_own_registry_and_serves_http() -> None:
    from prometheus_client import REGISTRY

    agent = _agent(FakeSource("host", [("cpu_util_ratio", "", 0.5)]))
    agent.collect_once(T0)
    exporter = AgentExporter(agent)
    assert REGISTRY.get_sample_value("minder_agent_collections_total") is None
    exporter.serve(0, addr="127.0.0.1")
    try:
        assert exporter.port
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert 'minder_node_cpu_util_ratio{device="",job_id="j1",machine="n1"} 0.5' in body
    finally:
        exporter.shutdown()
    assert exporter.port is None


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian 'prometheus') absent"
)
def test_promtool_accepts_the_agent_metrics() -> None:
    gpu = FakeSource(
        "nvml",
        [
            ("gpu_util_ratio", "gpu0", 0.5),
            ("gpu_xid_count", "gpu0", 1.0),
            ("gpu_ecc_sbe_count", "gpu0", 0.0),
            ("gpu_pcie_replay_count", "gpu0", 2.0),
        ],
    )
    nic = FakeSource(
        "rdma", [("rdma_link_downed_count", "mlx5_0", 0.0), ("rdma_port_up", "mlx5_0", 1.0)]
    )
    agent = _agent(gpu, nic, FakeSource("probe", raises=RuntimeError("x")))
    exporter = AgentExporter(agent)
    exporter.set_sender(lambda: SenderCounters(batches_sent=1, spool_max_bytes=2**20))
    agent.collect_once(T0)
    text = generate_latest(exporter.registry).decode()
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    labels = {
        name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for name in sample.labels
    }
    assert not labels & {"job", "instance"}


# -- flight-recorder dumps ----------------------------------------------------------------------

FR_DUMPS = Path(__file__).parent / "fixtures" / "flight_recorder"
FR_PREFIX = "nccl_trace_rank_"


def _fr_agent(directory: Path, *sources: FakeSource) -> tuple[Agent, FrWatcher]:
    watcher = FrWatcher(f"{directory}/{FR_PREFIX}", node="n1", poll_s=5.0)
    agent = Agent(
        sources or [FakeSource("host", [("cpu_util_ratio", "", 0.25)])],
        job="j1",
        node="n1",
        labels={"group": "pp0"},
        flight_recorder=watcher,
    )
    return agent, watcher


def test_new_dumps_ride_in_one_batch_and_skipped_files_are_counted_on_metrics(
    tmp_path: Path,
) -> None:
    for rank in (0, 1):
        shutil.copy(FR_DUMPS / "v1" / f"{FR_PREFIX}{rank}", tmp_path / f"{FR_PREFIX}{rank}")
    (tmp_path / f"{FR_PREFIX}7").write_text("no dump")
    agent, _ = _fr_agent(tmp_path)
    exporter = AgentExporter(agent)
    t0 = time.time()
    batches = [agent.collect_once(t0 + second) for second in range(12)]  # 1 s interval
    carrying = [i for i, b in enumerate(batches) if b.flight_recorder]
    assert carrying == [5]  # listed at 0 s, unchanged at 5 s: taken, sent once
    summaries = batches[5].flight_recorder
    assert sorted(s.rank for s in summaries) == [0, 1] and {s.node for s in summaries} == {"n1"}
    assert batches[5].samples == [("cpu_util_ratio", "", 0.25)]
    for fmt in WireFormat:
        assert decode_batch(encode_batch(batches[5], fmt)).flight_recorder == summaries
    assert agent.error_counts()[("flight_recorder", "not_a_dump")] == 1
    families = _families(exporter)
    errors = {
        (s.labels["source"], s.labels["reason"]): s.value
        for s in families["minder_agent_source_errors"]
    }
    assert errors[("flight_recorder", "not_a_dump")] == 1
    assert errors[("flight_recorder", "exception")] == 0
    assert families["minder_agent_flight_recorder_summaries"][0].value == 2
    assert families["minder_agent_flight_recorder_pending"][0].value == 0
    assert "flight_recorder" in {
        s.labels["source"] for s in families["minder_agent_collect_seconds"]
    }


def test_more_summaries_than_a_batch_carries_go_in_the_next_batches(tmp_path: Path) -> None:
    agent, watcher = _fr_agent(tmp_path)
    waiting = [RankSummary(rank=r, version="2.10", groups=(), node="n1") for r in range(150)]
    watcher.give_back(waiting)
    sent = [agent.collect_once(T0 + i).flight_recorder for i in range(4)]
    assert [len(s) for s in sent] == [MAX_SUMMARIES_PER_BATCH, MAX_SUMMARIES_PER_BATCH, 22, 0]
    assert [s.rank for batch in sent for s in batch] == list(range(150))


def test_the_goodbye_carries_the_summaries_still_waiting(tmp_path: Path) -> None:
    agent, watcher = _fr_agent(tmp_path)
    agent.collect_once(T0)
    watcher.give_back([RankSummary(rank=3, version="2.10", groups=(), node="n1")])
    goodbye = agent.goodbye(T0 + 0.5, "SIGTERM")
    assert [s.rank for s in goodbye.flight_recorder] == [3] and watcher.pending == 0
    assert decode_batch(encode_batch(goodbye)).flight_recorder == goodbye.flight_recorder


def test_a_raising_watcher_spoils_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, watcher = _fr_agent(tmp_path)
    watcher.give_back([RankSummary(rank=1, version="2.10", groups=(), node="n1")])

    def broken(now: float | None = None) -> int:
        raise RuntimeError("watcher bug")

    monkeypatch.setattr(watcher, "poll", broken)
    with caplog.at_level(logging.WARNING, logger="collectors.agent"):
        batches = [agent.collect_once(T0 + i) for i in range(3)]
    assert all(b.samples == [("cpu_util_ratio", "", 0.25)] for b in batches)
    assert [s.rank for s in batches[0].flight_recorder] == [1]  # what waited still goes
    assert agent.error_counts()[("flight_recorder", "exception")] == 3
    assert caplog.text.count("watcher bug") == 1


def test_a_source_named_like_the_watcher_is_refused(tmp_path: Path) -> None:
    watcher = FrWatcher(f"{tmp_path}/{FR_PREFIX}")
    with pytest.raises(ValidationError, match="expected each source once"):
        Agent(
            [FakeSource("flight_recorder")], job="j", node="n", labels={}, flight_recorder=watcher
        )
