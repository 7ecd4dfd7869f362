"""The Prometheus reader against a real Prometheus holding stored history.

History is written as OpenMetrics, turned into TSDB blocks with ``promtool`` and served by a real
``prometheus`` (the harness of ``tests/prometheus_server.py``); skipped, saying why,
when either binary is absent. A fake server stands in only for what a lone Prometheus cannot
answer: warnings of partial data (a remote-read or federated backend) and a server that is not
Prometheus at all.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import prometheus_server
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors import prometheus
from collectors.prometheus import (
    DEFAULT_JOB_LABELS,
    DEFAULT_MACHINE_LABELS,
    KNOWN_NAMES,
    PrometheusError,
    PrometheusReader,
    parse_duration,
    parse_matchers,
    parse_time,
)
from minder.config import PrometheusSourceSettings
from minder.core.errors import ValidationError
from minder.core.metrics import METRICS
from minder.core.records import EventKind

NODE_EXPORTER_IB = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "data"
    / "sysfs-infiniband-fixtures"
    / "node_exporter_e2e_infiniband.prom"
)
STEP = 15.0
N = 21
# Recent (the server keeps it with a 100 y retention), on the 15 s grid.
T0 = float((int(time.time()) - 3 * 3600) // 15 * 15)
TS = T0 + STEP * np.arange(N)


def ib_fixture() -> dict[tuple[str, str, str], float]:
    """``(name, device, port)`` → value of node_exporter's own e2e InfiniBand exposition."""
    if not NODE_EXPORTER_IB.is_file():
        pytest.skip(f"shared node_exporter fixture {NODE_EXPORTER_IB} is absent")
    values: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(NODE_EXPORTER_IB.read_text()):
        for sample in family.samples:
            if "port" in sample.labels:
                key = (sample.name, sample.labels["device"], sample.labels["port"])
                values[key] = float(sample.value)
    return values


def families() -> list[Any]:
    """The stored history of the mapping tests (see the expectations in each test)."""
    h = prometheus_server
    k = np.arange(N, dtype=float)
    flat = 0 * k
    out: list[Any] = []

    def add(name: str, kind: str, series: list[tuple[dict[str, str], np.ndarray]]) -> None:
        out.append(h.Family(name, kind, [(labels, TS, values) for labels, values in series]))

    dcgm = {"job": "dcgm", "modelName": "NVIDIA H100 80GB HBM3"}
    a = {**dcgm, "instance": "10.0.0.1:9400", "Hostname": "node-a", "slurm_job_id": "1001"}
    b = {**dcgm, "instance": "10.0.0.2:9400", "Hostname": "node-b", "slurm_job_id": "1001"}
    b |= {"namespace": "ml", "pod": "t-0"}
    gpus = [
        {**host, "gpu": str(g), "UUID": f"GPU-{i}{g}"}
        for i, host in enumerate((a, b))
        for g in (0, 1)
    ]
    mig = {**a, "gpu": "0", "GPU_I_ID": "1"}
    hostless = {"gpu": "0", "UUID": "GPU-x"}
    util = [(labels, 50 + k) for labels in gpus]
    add("DCGM_FI_DEV_GPU_UTIL", "gauge", [*util, (mig, 10 + flat), (hostless, 5 + flat)])
    add("DCGM_FI_DEV_FB_USED", "gauge", [(labels, 1000 + flat) for labels in gpus])
    add("DCGM_FI_DEV_SM_CLOCK", "gauge", [(labels, 1410 + flat) for labels in gpus])
    power = 300 + flat
    power[5] = 140737488355328.0  # DCGM's FP64 blank: no value at that step
    add("DCGM_FI_DEV_POWER_USAGE", "gauge", [(labels, power) for labels in gpus])
    add("DCGM_FI_DEV_XID_ERRORS", "gauge", [(gpus[0], np.where(k >= 10, 79.0, 0.0))])
    # dcgm-exporter declares these counters; OpenMetrics would name a counter's samples
    # <family>_total, so they are stored as gauges: PromQL's rate() does not look at the type.
    add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gauge", [(gpus[0], np.where(k >= 12, 2.0, 0.0))])
    add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "gauge", [(gpus[1], 100 + k)])
    add("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "gauge", [(gpus[1], 200 + 2 * k)])
    add("DCGM_FI_DEV_MEM_CLOCK", "gauge", [(labels, 2619 + flat) for labels in gpus[:3]])
    # node_exporter on node-a (and on node-d, a machine without GPU series): no job label.
    # Devices, ports and starting values from node_exporter's own e2e exposition.
    ib = ib_fixture()
    node = {"job": "node", "instance": "node-a:9100"}
    port1 = {**node, "device": "mlx4_0", "port": "1"}
    port2 = {**node, "device": "mlx4_0", "port": "2"}
    tx1 = ib[("node_infiniband_port_data_transmitted_bytes_total", "mlx4_0", "1")]
    tx1 = tx1 + 1e12 + 1e9 * STEP * k
    tx1[8:] = 7.5e9 + 1e9 * STEP * (k[8:] - 8)  # node_exporter restarted: a counter reset
    tx2 = ib[("node_infiniband_port_data_transmitted_bytes_total", "mlx4_0", "2")]
    tx2 = tx2 + 1e12 + 2e9 * STEP * k
    add("node_infiniband_port_data_transmitted_bytes", "counter", [(port1, tx1), (port2, tx2)])
    rx1 = ib[("node_infiniband_port_data_received_bytes_total", "mlx4_0", "1")]
    add(
        "node_infiniband_port_data_received_bytes",
        "counter",
        [(port1, rx1 + 1e12 + 3e9 * STEP * k)],
    )
    i40iw = {**node, "device": "i40iw0", "port": "1"}
    i40iw_state = ib[("node_infiniband_state_id", "i40iw0", "1")] + flat
    state = [(port1, np.where(k >= 15, 1.0, 4.0)), (i40iw, i40iw_state)]
    add("node_infiniband_state_id", "gauge", state)
    add("node_infiniband_link_downed", "counter", [(port1, np.where(k >= 15, 1.0, 0.0))])
    add("node_infiniband_legacy_data_transmitted_bytes", "counter", [(port1, 1e6 * k)])
    cpu = []
    for c in ("0", "1"):
        for mode, per_step in (("idle", 9.0), ("iowait", 1.5), ("user", 3.0), ("system", 1.5)):
            cpu.append(({**node, "cpu": c, "mode": mode}, 1e5 + per_step * k))
    add("node_cpu_seconds", "counter", cpu)
    add("node_memory_MemTotal_bytes", "gauge", [(node, 64e9 + flat)])
    add("node_memory_MemAvailable_bytes", "gauge", [(node, 40e9 + flat)])
    orphan = {"job": "node", "instance": "node-d:9100", "device": "eth0"}
    nics = (("eth0", 100e6), ("eth1", 50e6), ("lo", 1e9), ("veth1a2b", 1e9), ("docker0", 1e9))
    tx = [({**node, "device": nic}, 1e12 + rate * STEP * k) for nic, rate in nics]
    add("node_network_transmit_bytes", "counter", [*tx, (orphan, 1e12 + 5e6 * STEP * k)])
    add(
        "node_network_receive_bytes",
        "counter",
        [({**node, "device": "eth0"}, 1e12 + 1e7 * STEP * k)],
    )
    # The Minder agent on node-c.
    agent = {
        "job": "minder-agent",
        "instance": "node-c:9101",
        "job_id": "2002",
        "machine": "node-c",
    }
    agent_gpu = {**agent, "device": "gpu0"}
    add("minder_node_gpu_util_ratio", "gauge", [(agent_gpu, 0.75 + flat)])
    add("minder_node_cpu_util_ratio", "gauge", [(agent, 0.25 + flat)])
    add("minder_node_gpu_xid", "counter", [(agent_gpu, np.where(k >= 10, 1.0, 0.0))])
    return out


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("prom-history")
    h = prometheus_server
    path = directory / "history.om"
    h.write_openmetrics(path, families())
    h.create_blocks(path, directory)
    return directory


@pytest.fixture(scope="module")
def prom(history: Path) -> Iterator[Any]:
    with prometheus_server.prometheus_server(history, retention="100y") as server:
        yield server


def read(url: str, **kwargs: Any) -> Any:
    with PrometheusReader(url, retry_wait_s=0.01, **kwargs) as reader:
        return reader.read(T0, T0 + STEP * (N - 1))


def values(frame: Any, machine: str, metric: str, device: str = "") -> np.ndarray:
    rows = frame[
        (frame["machine"] == machine) & (frame["metric"] == metric) & (frame["device"] == device)
    ].sort_values("ts")
    return rows["value"].to_numpy()


# -- parsing ---------------------------------------------------------------------------------------


def test_times_durations_and_matchers_parse_or_say_what_is_expected() -> None:
    assert parse_duration("15s") == 15.0
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("30") == 30.0
    assert parse_time("2025-01-31T12:00:00Z") == 1738324800.0
    assert parse_time("2025-01-31T13:00:00+01:00") == 1738324800.0
    assert parse_time("1738324800") == 1738324800.0
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("-1h", now=10_000.0) == 6400.0
    assert parse_time("now-30m", now=10_000.0) == 8200.0
    assert parse_matchers(['{cluster="a", rack=~"r1.*"}', 'env!="test"']) == (
        'cluster="a"',
        'rack=~"r1.*"',
        'env!="test"',
    )
    with pytest.raises(ValidationError, match=r"duration '15x'.*expected a positive duration"):
        parse_duration("15x")
    with pytest.raises(ValidationError, match=r"time 'yesterday'.*expected RFC 3339"):
        parse_time("yesterday")
    with pytest.raises(ValidationError, match=r"no zone"):
        parse_time("2025-01-31T12:00:00")
    with pytest.raises(ValidationError, match=r"--match 'cluster=a'.*expected PromQL label"):
        parse_matchers(["cluster=a"])
    with pytest.raises(ValidationError, match=r"__name__ is not allowed"):
        parse_matchers(['{__name__="up"}'])
    with pytest.raises(ValidationError, match=r"job label 'a b'"):
        PrometheusReader("http://127.0.0.1:9", job_labels=["a b"])
    with pytest.raises(ValidationError, match=r"Prometheus url 'prometheus:9090'"):
        PrometheusReader("prometheus:9090")


def test_the_service_settings_default_to_the_readers_labels() -> None:
    settings = PrometheusSourceSettings()
    assert tuple(settings.job_labels) == DEFAULT_JOB_LABELS
    assert tuple(settings.machine_labels) == DEFAULT_MACHINE_LABELS


def test_every_dcgm_field_and_agent_metric_has_a_query() -> None:
    from collectors.dcgm import FIELDS

    assert set(FIELDS) <= KNOWN_NAMES
    for spec in METRICS.values():
        exported = (
            f"minder_node_{spec.name.removesuffix('_count')}_total"
            if spec.name.endswith("_count")
            else f"minder_node_{spec.name}"
        )
        # a metric the service derives (a rank's lateness) is never exported by a node: no query
        assert (exported in KNOWN_NAMES) is not spec.derived, spec.name
    assert any(spec.derived for spec in METRICS.values())


# -- mapping, against the real server ---------------------------------------------------------------


def test_dcgm_series_map_with_the_dcgm_sources_names_and_units(prom: Any) -> None:
    result = read(prom.url)
    frame = result.frame
    assert set(frame["job"].unique()) == {"1001", "2002"}
    util = values(frame, "node-a", "gpu_util_ratio", "gpu1")
    np.testing.assert_allclose(util, (50 + np.arange(N)) / 100)  # percent -> ratio
    # one sample per step, on the grid, none repeated at the next step
    ts = np.sort(
        frame[
            (frame["machine"] == "node-a")
            & (frame["device"] == "gpu1")
            & (frame["metric"] == "gpu_util_ratio")
        ]["ts"].to_numpy()
    )
    np.testing.assert_array_equal(ts, TS)
    assert set(values(frame, "node-b", "gpu_memory_used_bytes", "gpu0")) == {1000 * 2**20}
    assert set(values(frame, "node-b", "gpu_sm_clock_hertz", "gpu1")) == {1.41e9}
    power = values(frame, "node-a", "gpu_power_watts", "gpu0")
    assert len(power) == N - 1 and set(power) == {300.0}  # the blank step is left out
    # the MIG instance and the series without a host are left out, counted once per series
    assert result.stats.skipped_series[("mig_instance", "DCGM_FI_DEV_GPU_UTIL")] == 1
    assert result.stats.skipped_series[("no_machine_label", "DCGM_FI_DEV_GPU_UTIL")] == 1
    assert result.stats.series["DCGM_FI_DEV_GPU_UTIL"] == 6
    # the last-XID gauge: the first value is history, the change to 79 is one event
    xid = values(frame, "node-a", "gpu_xid_count", "gpu0")
    assert len(xid) == N - 1 and xid.sum() == 1.0
    events = [(job, machine, e) for job, machine, e in result.events if e.kind is EventKind.XID]
    assert [(j, m, e.device, e.code, e.ts) for j, m, e in events] == [
        ("1001", "node-a", "gpu0", 79, T0 + 10 * STEP)
    ]
    # counters: rate() on the server, times the step for a count; totals are kept
    assert values(frame, "node-a", "gpu_ecc_dbe_count", "gpu0").sum() == pytest.approx(2.0)
    assert any(e.kind is EventKind.ECC for _j, _m, e in result.events)
    nvlink = values(frame, "node-a", "gpu_nvlink_error_count", "gpu1")
    np.testing.assert_allclose(nvlink, 3.0)  # CRC_FLIT (1/step) + CRC_DATA (2/step), summed
    assert len(nvlink) == N - 1  # a rate needs two scrapes: none at the first step
    assert result.stats.unknown == {
        "DCGM_FI_DEV_MEM_CLOCK": 3,
        "node_infiniband_legacy_data_transmitted_bytes_total": 1,
    }


def test_node_exporter_series_map_to_rdma_cpu_memory_and_network(prom: Any) -> None:
    result = read(prom.url)
    frame = result.frame
    # node_exporter carries no job label: node-a takes the job of its GPU series
    node_a = frame[frame["machine"] == "node-a"]
    assert set(node_a["job"].unique()) == {"1001"}
    tx = values(frame, "node-a", "rdma_tx_bytes_per_second", "mlx4_0")
    assert len(tx) == N - 1
    assert (tx >= 0).all()  # the counter reset gives no negative rate
    # bytes already (node_exporter applied sysfs' x4): 1 GB/s except across the reset
    np.testing.assert_allclose(np.delete(tx, [7, 8]), 1e9)
    np.testing.assert_allclose(values(frame, "node-a", "rdma_tx_bytes_per_second", "mlx4_0:2"), 2e9)
    np.testing.assert_allclose(values(frame, "node-a", "rdma_rx_bytes_per_second", "mlx4_0"), 3e9)
    up = values(frame, "node-a", "rdma_port_up", "mlx4_0")
    np.testing.assert_array_equal(up, np.where(np.arange(N) >= 15, 0.0, 1.0))
    assert set(values(frame, "node-a", "rdma_port_up", "i40iw0")) == {1.0}
    downs = [e for _j, _m, e in result.events if e.kind is EventKind.LINK_DOWN]
    assert [(e.device, e.ts) for e in downs] == [("mlx4_0", T0 + 15 * STEP)]
    assert values(frame, "node-a", "rdma_link_downed_count", "mlx4_0").sum() == pytest.approx(1.0)
    np.testing.assert_allclose(values(frame, "node-a", "cpu_util_ratio"), 0.3)
    np.testing.assert_allclose(values(frame, "node-a", "memory_used_bytes"), 24e9)
    np.testing.assert_allclose(values(frame, "node-a", "net_tx_bytes_per_second"), 150e6)
    np.testing.assert_allclose(values(frame, "node-a", "net_rx_bytes_per_second"), 10e6)
    # node-d has no job anywhere: left out and counted, unless a default job is given
    assert "node-d" not in set(frame["machine"])
    assert result.stats.dropped_samples[("no_job", "net_tx_bytes_per_second")] == N - 1
    with_default = read(prom.url, default_job="spare").frame
    np.testing.assert_allclose(values(with_default, "node-d", "net_tx_bytes_per_second"), 5e6)
    assert set(with_default[with_default["machine"] == "node-d"]["job"].unique()) == {"spare"}


def test_agent_series_map_to_their_own_names(prom: Any) -> None:
    frame = read(prom.url).frame
    node_c = frame[frame["machine"] == "node-c"]
    assert set(node_c["job"].unique()) == {"2002"}
    np.testing.assert_allclose(values(frame, "node-c", "gpu_util_ratio", "gpu0"), 0.75)
    np.testing.assert_allclose(values(frame, "node-c", "cpu_util_ratio"), 0.25)
    assert values(frame, "node-c", "gpu_xid_count", "gpu0").sum() == pytest.approx(1.0)


def test_label_choice_follows_the_configured_lists(prom: Any) -> None:
    result = read(prom.url, job_labels=["namespace+pod"], machine_labels=["instance"])
    frame = result.frame
    # only node-b's GPU series carry namespace and pod; instance loses its port
    assert set(frame["job"].unique()) == {"ml/t-0"}
    assert set(frame["machine"].unique()) == {"10.0.0.2"}
    assert result.stats.dropped_samples[("no_job", "rdma_tx_bytes_per_second")] > 0
    fallback = read(prom.url, job_labels=["namespace+pod"], default_job="spare").frame
    assert set(fallback["job"].unique()) == {"ml/t-0", "spare"}
    assert set(fallback[fallback["machine"] == "node-a"]["job"].unique()) == {"spare"}


def test_matchers_restrict_every_selector(prom: Any) -> None:
    frame = read(prom.url, matchers=['{Hostname="node-b"}']).frame
    assert set(frame["machine"].unique()) == {"node-b"}
    assert set(frame["metric"].unique()) >= {"gpu_util_ratio", "gpu_power_watts"}


def test_batches_are_one_per_machine_and_step_with_their_events(prom: Any) -> None:
    result = read(prom.url)
    batches = result.batches(STEP)
    keys = [(b.ts, b.job, b.node) for b in batches]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    assert {b.interval_s for b in batches} == {STEP}
    assert sum(len(b.samples) for b in batches) == len(result.frame)
    [with_xid] = [b for b in batches if any(e.kind is EventKind.XID for e in b.events)]
    assert (with_xid.node, with_xid.ts) == ("node-a", T0 + 10 * STEP)
    assert ("gpu_xid_count", "gpu0", 1.0) in with_xid.samples


# -- pagination and limits, against the real server -----------------------------------------------


def test_chunks_give_the_same_table_as_one_query(prom: Any) -> None:
    whole = read(prom.url)
    chunked = read(prom.url, chunk_steps=4)
    assert chunked.stats.queries > whole.stats.queries
    columns = ["ts", "job", "machine", "metric", "device", "value"]
    a = whole.frame[columns].astype({"job": str, "machine": str, "metric": str, "device": str})
    b = chunked.frame[columns].astype({"job": str, "machine": str, "metric": str, "device": str})
    key = ["ts", "job", "machine", "metric", "device"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert a.equals(b)


def test_a_query_over_the_resolution_limit_is_split(
    prom: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prometheus answers more than 11,000 points per series with 400 "exceeded maximum
    # resolution": a reader asking for more is split, not failed.
    monkeypatch.setattr(prometheus, "MAX_POINTS_PER_SERIES", 20_000)  # our own cap, lifted
    with PrometheusReader(prom.url, step_s=0.1, matchers=['{Hostname="node-a"}']) as reader:
        reader.chunk_steps = 12_000
        result = reader.read(T0, T0 + 1250)
    assert result.stats.splits >= 1
    assert len(result.frame) > 0


def test_too_many_samples_halves_the_chunk_then_fails_clearly(
    history: Path, tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(history / "data", copy / "data", ignore=shutil.ignore_patterns("lock", "wal"))
    with prometheus_server.prometheus_server(
        copy, retention="100y", extra_args=["--query.max-samples=10"]
    ) as server:
        selected = read(server.url, matchers=['{Hostname="node-a",gpu="1"}'])
        assert selected.stats.splits >= 1
        np.testing.assert_allclose(
            values(selected.frame, "node-a", "gpu_util_ratio", "gpu1"), (50 + np.arange(N)) / 100
        )
        # 12 series of CPU time over a 30 s window: more than 10 samples even for one step
        with pytest.raises(PrometheusError, match=r"too big even for one step") as caught:
            read(server.url, matchers=['{instance="node-a:9100"}'])
        assert caught.value.reason == "too_big"
        assert server.url in str(caught.value)


# -- errors --------------------------------------------------------------------------------------------


def test_an_unreachable_server_is_one_error_naming_the_url() -> None:
    from minder.stream.broker import free_port

    url = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    with pytest.raises(PrometheusError, match=r"unreachable") as caught:
        read(url)
    assert url in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.reason == "unreachable"
    assert time.monotonic() - began < 10


def test_a_refused_query_names_the_query_and_the_servers_error(prom: Any) -> None:
    with pytest.raises(PrometheusError, match=r"refused .*bad_data") as caught:
        read(prom.url, matchers=['{Hostname=~"("}'])  # a regex Prometheus cannot compile
    assert caught.value.reason == "refused"
    assert prom.url in str(caught.value)


def test_connection_errors_are_retried_a_bounded_number_of_times(prom: Any) -> None:
    assert len(read(prom.url, transport=prometheus_server.FlakyTransport(2)).frame) > 0
    with pytest.raises(PrometheusError, match=r"4 attempts"):
        read(prom.url, transport=prometheus_server.FlakyTransport(100))


class FakePrometheus(ThreadingHTTPServer):
    """Answers like Prometheus's HTTP API (``{"status": …, "data": …, "warnings": […]}``) for
    what one real Prometheus cannot produce: partial data behind a remote-read or federated
    backend, which Prometheus reports as ``warnings`` beside ``status: success``."""

    def __init__(self, answer: bytes, status: int = 200) -> None:
        self.answer = answer
        self.status = status

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server: FakePrometheus = self.server  # type: ignore[assignment]
                if self.path.startswith("/api/v1/label/__name__/values"):
                    body = json.dumps({"status": "success", "data": ["DCGM_FI_DEV_GPU_UTIL"]})
                    self._send(200, body.encode())
                else:
                    self._send(server.status, server.answer)

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply()

            def do_POST(self) -> None:
                self._reply()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def fake() -> Iterator[list[FakePrometheus]]:
    servers: list[FakePrometheus] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def serve(servers: list[FakePrometheus], answer: bytes, status: int = 200) -> str:
    server = FakePrometheus(answer, status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    servers.append(server)
    return server.url


def test_warnings_of_partial_data_fail_the_read(fake: list[FakePrometheus]) -> None:
    series = {"metric": {"Hostname": "n1", "gpu": "0"}, "values": [[T0, "50"]]}
    answer = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [series]},
        "warnings": [
            "remote read: store 10.0.0.9:10901 unavailable, partial response " + "x" * 500
        ],
    }
    url = serve(fake, json.dumps(answer).encode())
    with pytest.raises(PrometheusError, match=r"warning.*partial") as caught:
        read(url)
    assert caught.value.reason == "partial_data"
    assert len(str(caught.value)) < 600  # the server's text is truncated


def test_an_error_body_is_truncated_and_a_non_prometheus_answer_is_named(
    fake: list[FakePrometheus],
) -> None:
    error = {"status": "error", "errorType": "internal", "error": "y" * 10_000}
    url = serve(fake, json.dumps(error).encode(), status=500)
    with pytest.raises(PrometheusError, match=r"refused") as caught:
        read(url)
    assert len(str(caught.value)) < 800
    html = serve(fake, b"<html><body>Grafana</body></html>")
    with pytest.raises(PrometheusError, match=r"expected Prometheus API JSON") as caught:
        read(html)
    assert caught.value.reason == "bad_answer"
