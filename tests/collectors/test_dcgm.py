"""dcgm-exporter source against expositions built from the exporter's own field lists.

The field names, Prometheus types and help strings come from the real CSVs in
``../shared/data/dcgm-exporter-fields/`` (commented-out lines there are real, merely disabled,
fields); each exposition is served by a real ``http.server`` on 127.0.0.1.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collectors.base import Collected, Source
from collectors.dcgm import FIELDS, DcgmSource
from minder.core.metrics import validate_sample
from minder.core.records import EventKind

FIELDS_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "dcgm-exporter-fields"
CSVS = ("default-counters.csv", "dcp-metrics-included.csv")

# Fields this source reads that neither shipped CSV lists; their type and help follow DCGM's
# dcgm_fields.h descriptions.
NOT_IN_CSVS = {
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gauge", "The rate of data transmitted over NVLink, in B/s."),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gauge", "The rate of data received over NVLink, in B/s."),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("gauge", "PCIe current link generation."),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("gauge", "PCIe current link width."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock throttle reasons (bitmask)."),
}

T0 = 1_763_700_000.0


def read_field_lists() -> dict[str, tuple[str, str]]:
    """``{field: (prometheus type, help)}`` from the exporter's CSVs, disabled lines included."""
    if not FIELDS_DIR.is_dir():
        pytest.skip(f"shared dcgm-exporter field lists {FIELDS_DIR} are absent")
    fields: dict[str, tuple[str, str]] = {}
    for name in CSVS:
        for raw in (FIELDS_DIR / name).read_text().splitlines():
            line = raw.lstrip("#").strip()
            if not line.startswith(("DCGM_FI_", "DCGM_EXP_")):
                continue
            field, kind, help_text = (part.strip() for part in line.split(",", 2))
            fields.setdefault(field, (kind, help_text))
    return fields


@pytest.fixture(scope="module")
def field_lists() -> dict[str, tuple[str, str]]:
    return read_field_lists()


def gpu_labels(gpu: int, host_label: str | None, host: str) -> dict[str, str]:
    labels = {
        "gpu": str(gpu),
        "UUID": f"GPU-513536b6-7d19-9063-b049-1e69664bb2{gpu:02x}",
        "pci_bus_id": f"00000000:{0x10 + gpu:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "DCGM_FI_DRIVER_VERSION": "535.54.03",
    }
    if host_label is not None:
        labels[host_label] = host
    return labels


def exposition(
    fields: dict[str, tuple[str, str]],
    values: dict[str, dict[int, float]],
    *,
    host_label: str | None = "Hostname",
    host: str = "node1",
    extra: dict[str, list[tuple[dict[str, str], float]]] | None = None,
) -> str:
    """Text exposition as dcgm-exporter writes it: HELP, TYPE, then one series per GPU."""
    known = {**fields, **NOT_IN_CSVS}
    lines: list[str] = []
    for field, per_gpu in values.items():
        kind, help_text = known[field]
        kind = "gauge" if kind == "label" else kind
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        series = [(gpu_labels(gpu, host_label, host), value) for gpu, value in per_gpu.items()]
        series += (extra or {}).get(field, [])
        for base, value in series:
            labels = dict(base)
            if field == "DCGM_FI_DEV_XID_ERRORS":  # the exporter adds the code as labels too
                labels["err_code"] = str(int(value))
                labels["err_msg"] = "" if value else "No Error"
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{field}{{{text}}} {value:g}")
    return "\n".join(lines) + "\n"


class Exporter:
    """A real HTTP server on 127.0.0.1 that answers like dcgm-exporter's /metrics."""

    def __init__(self) -> None:
        self.body: bytes = b""
        self.status = 200
        self.delay_s = 0.0
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                if owner.delay_s:
                    time.sleep(owner.delay_s)
                try:
                    self.send_response(owner.status)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(owner.body)))
                    self.end_headers()
                    self.wfile.write(owner.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def serve(self, text: str) -> None:
        self.body = text.encode()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    server = Exporter()
    yield server
    server.stop()


def by_device(out: Collected) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for metric, device, value in out.samples:
        assert metric not in table[device], f"{metric}/{device} emitted twice"
        table[device][metric] = value
    return dict(table)


def assert_valid(out: Collected) -> None:
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)


def every_gpu(value: float, gpus: int = 8) -> dict[int, float]:
    return dict.fromkeys(range(gpus), value)


def full_values(step: int = 0) -> dict[str, dict[int, float]]:
    """Every field the source reads, 8 GPUs, with per-GPU values and counters at ``step``."""
    return {
        "DCGM_FI_DEV_GPU_UTIL": {g: 90 + g for g in range(8)},
        "DCGM_FI_PROF_SM_ACTIVE": every_gpu(0.81),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": every_gpu(0.42),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": every_gpu(0.97),
        "DCGM_FI_PROF_DRAM_ACTIVE": every_gpu(0.55),
        "DCGM_FI_DEV_POWER_USAGE": {g: 300.5 + g for g in range(8)},
        "DCGM_FI_DEV_GPU_TEMP": {g: 40 + g for g in range(8)},
        "DCGM_FI_DEV_SM_CLOCK": every_gpu(1410),
        "DCGM_FI_DEV_FB_USED": every_gpu(50),
        "DCGM_FI_PROF_PCIE_TX_BYTES": every_gpu(4_096_000),
        "DCGM_FI_PROF_PCIE_RX_BYTES": every_gpu(1_000),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": every_gpu(2.5e10),
        "DCGM_FI_PROF_NVLINK_RX_BYTES": every_gpu(2.4e10),
        "DCGM_FI_DEV_PCIE_LINK_GEN": {g: 3 if g == 5 else 4 for g in range(8)},
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": every_gpu(16),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": {g: 4 if g == 2 else 0 for g in range(8)},
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": {g: 100 + step * g for g in range(8)},
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": every_gpu(7 + 2 * step),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": every_gpu(0),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": every_gpu(10 + step),
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": every_gpu(5),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": every_gpu(1 + 2 * step),
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": every_gpu(0),
        "DCGM_FI_DEV_XID_ERRORS": every_gpu(0),
        # read by nobody: must be ignored, not reported
        "DCGM_FI_DEV_MEM_CLOCK": every_gpu(1593),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": every_gpu(123456789),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": every_gpu(999),
        "DCGM_FI_DEV_FB_FREE": every_gpu(80999),
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": every_gpu(0),
    }


def test_field_lists_name_what_the_source_reads(field_lists: dict[str, tuple[str, str]]) -> None:
    for field in FIELDS:
        assert field in field_lists or field in NOT_IN_CSVS, field
    assert field_lists["DCGM_FI_DEV_XID_ERRORS"][1] == "Value of the last XID error encountered."
    assert field_lists["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][0] == "counter"


@pytest.mark.parametrize("host_label", ["Hostname", "hostname"])
def test_every_field_mapped_with_units(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]], host_label: str
) -> None:
    source = DcgmSource(exporter.url, hostname="node1")
    assert isinstance(source, Source) and source.name == "dcgm"
    exporter.serve(exposition(field_lists, full_values(0), host_label=host_label))
    first = source.collect(T0)
    assert_valid(first)
    exporter.serve(exposition(field_lists, full_values(1), host_label=host_label))
    out = source.collect(T0 + 1)
    assert_valid(out)
    table = by_device(out)
    assert sorted(table) == [f"gpu{g}" for g in range(8)]
    for g in range(8):
        row = table[f"gpu{g}"]
        assert row["gpu_util_ratio"] == pytest.approx((90 + g) / 100)
        assert row["gpu_sm_active_ratio"] == pytest.approx(0.81)
        assert row["gpu_tensor_active_ratio"] == pytest.approx(0.42)
        assert row["gpu_gr_engine_active_ratio"] == pytest.approx(0.97)
        assert row["gpu_dram_active_ratio"] == pytest.approx(0.55)
        assert row["gpu_power_watts"] == pytest.approx(300.5 + g)
        assert row["gpu_temperature_celsius"] == 40 + g
        assert row["gpu_sm_clock_hertz"] == 1410e6
        assert row["gpu_memory_used_bytes"] == 50 * 1024 * 1024
        assert row["gpu_pcie_tx_bytes_per_second"] == 4_096_000
        assert row["gpu_pcie_rx_bytes_per_second"] == 1_000
        assert row["gpu_nvlink_tx_bytes_per_second"] == pytest.approx(2.5e10)
        assert row["gpu_nvlink_rx_bytes_per_second"] == pytest.approx(2.4e10)
        assert row["gpu_pcie_link_gen"] == (3 if g == 5 else 4)
        assert row["gpu_pcie_link_width"] == 16
        assert row["gpu_throttle_reasons"] == (4 if g == 2 else 0)
        assert row["gpu_pcie_replay_count"] == g
        assert row["gpu_ecc_sbe_count"] == 2
        assert row["gpu_ecc_dbe_count"] == 0
        assert row["gpu_nvlink_error_count"] == 3  # 1 flit CRC + 2 replays
        assert row["gpu_xid_count"] == 0
        assert len(row) == 21  # nothing from the ignored fields
    # first scrape: gauges only (counters primed, XID gauge primed)
    first_row = by_device(first)["gpu0"]
    assert "gpu_pcie_replay_count" not in first_row and "gpu_xid_count" not in first_row
    assert out.events == []
    assert source.problems.total == 0


def test_hostname_filter_keeps_matching_and_unlabelled_series(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    other = gpu_labels(0, "hostname", "node2")
    other["gpu"] = "7"
    bare = gpu_labels(3, None, "")
    text = exposition(
        field_lists,
        {"DCGM_FI_DEV_GPU_TEMP": {0: 41.0, 1: 42.0}},
        host_label="hostname",
        extra={"DCGM_FI_DEV_GPU_TEMP": [(other, 99.0), (bare, 43.0)]},
    )
    exporter.serve(text)
    filtered = by_device(DcgmSource(exporter.url, hostname="node1").collect(T0))
    assert filtered == {
        "gpu0": {"gpu_temperature_celsius": 41.0},
        "gpu1": {"gpu_temperature_celsius": 42.0},
        "gpu3": {"gpu_temperature_celsius": 43.0},
    }
    everything = by_device(DcgmSource(exporter.url).collect(T0))
    assert everything["gpu7"] == {"gpu_temperature_celsius": 99.0}


def test_counter_reset_gives_no_value_then_resumes(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    source = DcgmSource(exporter.url)
    counts = []
    for step, replay in enumerate([10, 13, 2, 5]):  # exporter/driver restart between 13 and 2
        exporter.serve(
            exposition(field_lists, {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": {0: replay, 1: 7}})
        )
        table = by_device(source.collect(T0 + step))
        counts.append(table.get("gpu0", {}).get("gpu_pcie_replay_count"))
        if step:
            assert table["gpu1"]["gpu_pcie_replay_count"] == 0
    assert counts == [None, 3, None, 3]
    assert source.problems.counts == {"counter_reset": 1}


def test_xid_change_is_an_event_and_a_count(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    source = DcgmSource(exporter.url)
    history: dict[int, float] = {0: 48, 1: 0, 2: 0}  # gpu0 had an XID before the agent began
    script: list[dict[int, float]] = [
        history,
        {0: 48, 1: 79, 2: 0},
        {0: 48, 1: 79, 2: 0},
        {0: 48, 1: 13, 2: 0},
    ]
    events: list[list[tuple[EventKind, str, int | None, float]]] = []
    counts: list[dict[str, float | None]] = []
    for step, xids in enumerate(script):
        exporter.serve(exposition(field_lists, {"DCGM_FI_DEV_XID_ERRORS": xids}))
        out = source.collect(T0 + step)
        assert_valid(out)
        events.append([(e.kind, e.device, e.code, e.ts) for e in out.events])
        counts.append({d: row.get("gpu_xid_count") for d, row in by_device(out).items()})
    assert events == [
        [],
        [(EventKind.XID, "gpu1", 79, T0 + 1)],
        [],  # the same code again is invisible in a last-value gauge
        [(EventKind.XID, "gpu1", 13, T0 + 3)],
    ]
    assert counts[0] == {}
    assert counts[1] == {"gpu0": 0, "gpu1": 1, "gpu2": 0}
    assert counts[2] == {"gpu0": 0, "gpu1": 0, "gpu2": 0}


def test_dbe_increase_is_an_ecc_event(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    source = DcgmSource(exporter.url)
    for step, dbe in enumerate([0, 0, 2]):
        exporter.serve(exposition(field_lists, {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": {0: 0, 4: dbe}}))
        out = source.collect(T0 + step)
    assert by_device(out)["gpu4"]["gpu_ecc_dbe_count"] == 2
    assert [(e.kind, e.device) for e in out.events] == [(EventKind.ECC, "gpu4")]


def test_both_throttle_spellings_and_mig_series(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    mig = {**gpu_labels(0, "Hostname", "node1"), "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": "3"}
    text = exposition(
        field_lists,
        {
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": {0: 64},
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": {0: 64},
            "DCGM_FI_PROF_SM_ACTIVE": {},
        },
        extra={"DCGM_FI_PROF_SM_ACTIVE": [(mig, 0.5)]},
    )
    exporter.serve(text)
    source = DcgmSource(exporter.url)
    assert by_device(source.collect(T0)) == {"gpu0": {"gpu_throttle_reasons": 64.0}}
    assert source.problems.total == 0


def test_out_of_range_value_is_a_problem_not_a_sample(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    exporter.serve(
        exposition(
            field_lists,
            {"DCGM_FI_DEV_GPU_UTIL": {0: 250, 1: 50}, "DCGM_FI_PROF_SM_ACTIVE": {0: 1.002}},
        )
    )
    source = DcgmSource(exporter.url)
    table = by_device(source.collect(T0))
    assert "gpu_util_ratio" not in table["gpu0"]
    assert table["gpu1"]["gpu_util_ratio"] == 0.5
    assert table["gpu0"]["gpu_sm_active_ratio"] == 1.0  # rounding overshoot clamped
    assert source.problems.counts == {"out_of_range": 1}


def test_slow_exporter_times_out_fast_and_is_logged_once(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    exporter.serve(exposition(field_lists, {"DCGM_FI_DEV_GPU_TEMP": {0: 40}}))
    exporter.delay_s = 1.5
    source = DcgmSource(exporter.url, timeout_s=0.2)
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        for step in range(2):
            started = time.monotonic()
            out = source.collect(T0 + step)
            assert time.monotonic() - started < 1.0
            assert out.samples == [] and out.events == []
    assert source.problems.counts == {"timeout": 2}
    assert len([r for r in caplog.records if "(timeout)" in r.getMessage()]) == 1
    exporter.delay_s = 0.0
    assert by_device(source.collect(T0 + 2)) == {"gpu0": {"gpu_temperature_celsius": 40.0}}


def test_http_error_and_garbage_are_problems(
    exporter: Exporter, field_lists: dict[str, tuple[str, str]]
) -> None:
    source = DcgmSource(exporter.url)
    exporter.status = 500
    exporter.serve("internal error\n")
    assert source.collect(T0).samples == []
    exporter.status = 200
    exporter.serve("<html><body>this is not an exposition</body></html>\n")
    assert source.collect(T0 + 1).samples == []
    exporter.body = b"\xff\xfe\x00garbage"
    assert source.collect(T0 + 2).samples == []
    assert source.problems.counts == {"http_500": 1, "unparsable": 2}
    exporter.serve(exposition(field_lists, {"DCGM_FI_DEV_GPU_TEMP": {0: 40}}))
    assert by_device(source.collect(T0 + 3)) == {"gpu0": {"gpu_temperature_celsius": 40.0}}


def test_unreachable_exporter() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    source = DcgmSource(f"http://127.0.0.1:{port}/metrics")
    for step in range(3):
        out = source.collect(T0 + step)
        assert out.samples == [] and out.events == []
    assert source.problems.counts == {"unreachable": 3}
    source.close()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        DcgmSource("127.0.0.1:9400/metrics")
    with pytest.raises(ValueError, match="timeout_s"):
        DcgmSource(timeout_s=0)


def test_plain_fast_path_agrees_with_prometheus_client(
    field_lists: dict[str, tuple[str, str]],
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from collectors.dcgm import _known_lines, _parse_plain

    text = exposition(field_lists, full_values(3))
    fast = _parse_plain(_known_lines(text))
    assert fast is not None and len(fast) == 24 * 8
    reference = [
        (family.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(text)
        if family.name in FIELDS
        for sample in family.samples
    ]
    assert fast == reference


def test_escaped_label_values_go_through_the_full_parser(exporter: Exporter) -> None:
    from collectors.dcgm import _known_lines, _parse_plain

    # a label value with quotes and a backslash is written with escapes: not the plain form
    text = (
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",Hostname="n1",modelName="A \\"quoted\\" \\\\ name"} 33\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="1"}   250.5\n'
    )
    assert _parse_plain(_known_lines(text)) is None
    exporter.serve(text)
    source = DcgmSource(exporter.url, hostname="n1")
    assert by_device(source.collect(T0)) == {
        "gpu1": {"gpu_temperature_celsius": 33.0, "gpu_power_watts": 250.5}
    }
    assert source.problems.total == 0


def test_trickling_body_is_cut_off_at_the_deadline() -> None:
    """Headers promise 100000 bytes, then one byte every 0.2 s: each byte resets a per-read
    socket timeout, so only a deadline checked before every read (with the socket waiting at
    most for the time left) ends the scrape in time."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(5.0)

    def trickle() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)  # the request
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"
            )
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"#")
                except OSError:  # the scraper gave up and closed
                    return

    server = threading.Thread(target=trickle, daemon=True)
    server.start()
    try:
        port = listener.getsockname()[1]
        source = DcgmSource(f"http://127.0.0.1:{port}/metrics", timeout_s=0.5)
        started = time.monotonic()
        out = source.collect(T0)
        took = time.monotonic() - started
        assert took < 0.5 + 0.3, f"scrape took {took:.2f} s with timeout_s=0.5"
        assert out.samples == [] and out.events == []
        assert source.problems.counts == {"timeout": 1}
    finally:
        stop.set()
        listener.close()
        server.join(timeout=5)
