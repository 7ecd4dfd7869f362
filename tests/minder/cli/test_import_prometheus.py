"""``minder import prometheus``: a simulated job stored in a real Prometheus, read back into a
canonical table, and the faulty machine found in it by ``minder detect``.

The job (16 machines × 8 GPUs, 40 minutes scraped every 15 s, dcgm-exporter and node_exporter
names and labels) is written as OpenMetrics, turned into TSDB blocks with ``promtool`` and
served by a real ``prometheus`` (``tests/prometheus_server.py``); skipped, saying why,
when either binary is absent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import prometheus_server
import pytest
from typer.testing import CliRunner

from minder.cli import app
from minder.core.table import read_table

runner = CliRunner()

MACHINES = 16
GPUS = 8
NICS = 4
STEP = 15.0
STEPS = 161  # 40 minutes, both ends included
FAULTY = 7
FAULT_STEP = 80  # minute 20
JOB = "77001"
T0 = float((int(time.time()) - 3 * 3600) // 15 * 15)
TS = T0 + STEP * np.arange(STEPS)


def host(m: int) -> str:
    return f"gpu-node-{m:02d}"


def simulate() -> tuple[list[Any], dict[str, np.ndarray]]:
    """The job as OpenMetrics families, and the values the table must hold.

    Peers: GPUs ~92 % busy, SM ~0.80 active, ~650 W, IB ~20 GB/s per port each way. The faulty
    machine's GPUs and NICs drop to a third of that from minute 20. Cluster ``b`` (two more
    machines) is there to be left out by ``--match``.
    """
    h = prometheus_server
    rng = np.random.default_rng(7)
    level = np.ones((MACHINES, STEPS))
    level[FAULTY, FAULT_STEP:] = 1 / 3
    shape = (MACHINES, GPUS, STEPS)
    util = np.clip(92 * level[:, None, :] + rng.normal(0, 2, shape), 0, 100).round(1)
    sm = np.clip(0.80 * level[:, None, :] + rng.normal(0, 0.02, shape), 0, 1).round(4)
    power = (650 * level[:, None, :] + rng.normal(0, 15, shape)).round(2)
    ib_rate = 20e9 * level[:, None, :] + rng.normal(0, 0.3e9, (MACHINES, NICS, STEPS))
    ib_tx = 1e13 + np.cumsum(ib_rate * STEP, axis=2).round()
    ib_rx = 2e13 + np.cumsum(ib_rate * 0.9 * STEP, axis=2).round()
    # one node_exporter restart halfway through: its counters start again near zero
    ib_tx[3, :, 100:] -= ib_tx[3, :, 99:100] - 5e9
    families: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]] = {}

    def add(name: str, labels: dict[str, str], values: np.ndarray) -> None:
        families.setdefault(name, []).append((labels, TS, values))

    for cluster, machines in (("a", range(MACHINES)), ("b", range(MACHINES, MACHINES + 2))):
        for m in machines:
            src = m % MACHINES
            for g in range(GPUS):
                labels = {
                    "job": "dcgm-exporter",
                    "instance": f"10.1.{m}.1:9400",
                    "cluster": cluster,
                    "Hostname": host(m),
                    "gpu": str(g),
                    "UUID": f"GPU-{m:04d}-{g:04d}",
                    "device": f"nvidia{g}",
                    "modelName": "NVIDIA H100 80GB HBM3",
                    "DCGM_FI_DRIVER_VERSION": "550.54.15",
                    "slurm_job_id": JOB if cluster == "a" else "88002",
                }
                add("DCGM_FI_DEV_GPU_UTIL", labels, util[src, g])
                add("DCGM_FI_PROF_SM_ACTIVE", labels, sm[src, g])
                add("DCGM_FI_DEV_POWER_USAGE", labels, power[src, g])
                add("DCGM_FI_DEV_MEM_CLOCK", labels, np.full(STEPS, 2619.0))
            for n in range(NICS):
                labels = {
                    "job": "node-exporter",
                    "instance": f"{host(m)}:9100",
                    "cluster": cluster,
                    "device": f"mlx5_{n}",
                    "port": "1",
                }
                add("node_infiniband_port_data_transmitted_bytes", labels, ib_tx[src, n])
                add("node_infiniband_port_data_received_bytes", labels, ib_rx[src, n])
                add("node_infiniband_state_id", labels, np.full(STEPS, 4.0))
    counters = {
        "node_infiniband_port_data_transmitted_bytes",
        "node_infiniband_port_data_received_bytes",
    }
    out = [
        h.Family(name, "counter" if name in counters else "gauge", series)
        for name, series in families.items()
    ]
    expected = {"util": util / 100, "sm": sm, "power": power, "ib_rate": ib_rate}
    return out, expected


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("prom-job")
    h = prometheus_server
    families, expected = simulate()
    path = directory / "job.om"
    h.write_openmetrics(path, families)
    h.create_blocks(path, directory)
    with h.prometheus_server(directory, retention="100y") as server:
        yield server, expected


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def import_args(url: str, output: Path) -> list[str]:
    end = T0 + STEP * (STEPS - 1)
    return [
        "import",
        "prometheus",
        "--url",
        url,
        "--start",
        rfc3339(T0),
        "--end",
        f"{end:.0f}",
        "--step",
        "15s",
        "--match",
        '{cluster="a"}',
        "-o",
        str(output),
        "--format",
        "json",
    ]


def test_a_stored_job_round_trips_and_detect_names_the_faulty_machine(
    stored: Any, tmp_path: Path
) -> None:
    server, expected = stored
    output = tmp_path / "job.parquet"
    result = runner.invoke(app, import_args(server.url, output))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [p.name for p in tmp_path.iterdir()] == ["job.parquet"]  # no partial file left
    table = read_table(output)

    # machines, jobs and metrics: cluster b is left out by --match
    assert set(table["machine"].unique()) == {host(m) for m in range(MACHINES)}
    assert set(table["job"].unique()) == {JOB}
    gauges = ("gpu_util_ratio", "gpu_sm_active_ratio", "gpu_power_watts")
    rates = ("rdma_tx_bytes_per_second", "rdma_rx_bytes_per_second")
    assert set(table["metric"].unique()) == {*gauges, *rates, "rdma_port_up"}

    # no row lost: one per series and step; a rate needs two scrapes, so none at the first step
    counts = table["metric"].value_counts()
    for metric in gauges:
        assert counts[metric] == MACHINES * GPUS * STEPS, metric
    for metric in rates:
        assert counts[metric] == MACHINES * NICS * (STEPS - 1), metric
    assert counts["rdma_port_up"] == MACHINES * NICS * STEPS
    assert summary["rows"] == len(table)
    assert summary["machines"] == MACHINES
    assert summary["unknown_series"] == {"DCGM_FI_DEV_MEM_CLOCK": MACHINES * GPUS}
    assert summary["skipped_series"] == {} and summary["dropped_samples"] == {}

    # 15 s spacing on the grid, for every series
    keyed = table.sort_values(["machine", "metric", "device", "ts"])
    gaps = keyed.groupby(["machine", "metric", "device"], observed=True)["ts"].diff().dropna()
    assert set(gaps.unique()) == {STEP}
    assert set(table["ts"].unique()) == set(TS)

    # units: percent -> ratio, watts as they are, IB bytes per second (no x4 on top)
    def series(machine: int, metric: str, device: str) -> np.ndarray:
        rows = keyed[
            (keyed["machine"] == host(machine))
            & (keyed["metric"] == metric)
            & (keyed["device"] == device)
        ]
        return rows["value"].to_numpy()

    np.testing.assert_allclose(series(2, "gpu_util_ratio", "gpu5"), expected["util"][2, 5])
    np.testing.assert_allclose(series(2, "gpu_sm_active_ratio", "gpu5"), expected["sm"][2, 5])
    np.testing.assert_allclose(series(2, "gpu_power_watts", "gpu5"), expected["power"][2, 5])
    # rate() over 30 s at step i is the mean rate of the steps i-1 and i; at step 1 the window
    # holds two scrapes only and Prometheus extrapolates the one interval they span
    rate = expected["ib_rate"][2, 1]
    mean = np.concatenate([rate[1:2], (rate[2:] + rate[1:-1]) / 2])
    np.testing.assert_allclose(series(2, "rdma_tx_bytes_per_second", "mlx5_1"), mean, rtol=1e-6)
    assert (table[table["metric"].isin(rates)]["value"] >= 0).all()  # the reset on machine 3
    assert set(table[table["metric"] == "rdma_port_up"]["value"]) == {1.0}

    # the faulty machine's GPUs are busy a third as much from minute 20 on
    util = table[table["metric"] == "gpu_util_ratio"]
    late = util[util["ts"] >= T0 + STEP * FAULT_STEP].groupby("machine", observed=True)["value"]
    means = late.mean()
    assert means.idxmin() == host(FAULTY)
    assert means[host(FAULTY)] < 0.5 * means.drop(host(FAULTY)).min()

    detect = runner.invoke(app, ["detect", str(output), "--format", "json"])
    assert detect.exit_code == 0, detect.output
    report = json.loads(detect.stdout)
    named = {alert["machine"] for alert in report["alerts"]}
    assert named == {host(FAULTY)}, report["alerts"]


def test_csv_output_and_the_same_rows_as_parquet(stored: Any, tmp_path: Path) -> None:
    server, _expected = stored
    csv = tmp_path / "job.csv.gz"
    result = runner.invoke(app, [*import_args(server.url, csv)[:-2], "--format", "table"])
    assert result.exit_code == 0, result.output
    assert "gpu_util_ratio" in result.stdout and "DCGM_FI_DEV_MEM_CLOCK" in result.stdout
    table = read_table(csv)
    assert len(table) == MACHINES * NICS * (3 * STEPS - 2) + 3 * MACHINES * GPUS * STEPS
    assert isinstance(table, pd.DataFrame)


def _one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    return lines[0]


def test_an_unreachable_server_writes_nothing_and_says_so(tmp_path: Path) -> None:
    from minder.stream.broker import free_port

    url = f"http://127.0.0.1:{free_port()}"
    output = tmp_path / "out.parquet"
    result = runner.invoke(app, import_args(url, output), env={"COLUMNS": "400"})
    assert result.exit_code == 2
    line = _one_line_error(result.output)
    assert url in line and "unreachable" in line
    assert list(tmp_path.iterdir()) == []


def test_bad_values_and_empty_ranges_are_one_line_errors(stored: Any, tmp_path: Path) -> None:
    server, _expected = stored
    output = tmp_path / "out.parquet"
    env = {"COLUMNS": "400"}
    args = import_args(server.url, output)
    bad_start = [*args[:4], "--start", "yesterday", *args[6:]]
    line = _one_line_error(runner.invoke(app, bad_start, env=env).output)
    assert "'yesterday'" in line and "RFC 3339" in line
    bad_output = [*args[:-4], "-o", str(tmp_path / "out.txt"), "--format", "json"]
    line = _one_line_error(runner.invoke(app, bad_output, env=env).output)
    assert "out.txt" in line and "extension" in line
    bad_match = [*args[:10], "--match", "cluster=a", *args[12:]]
    line = _one_line_error(runner.invoke(app, bad_match, env=env).output)
    assert "cluster=a" in line
    # a range with no data at all: an error, not an empty table
    empty = [*args[:4], "--start", f"{T0 - 7200:.0f}", "--end", f"{T0 - 3600:.0f}", *args[8:]]
    result = runner.invoke(app, empty, env=env)
    assert result.exit_code == 2
    assert "no sample of a known metric" in _one_line_error(result.output)
    assert list(tmp_path.iterdir()) == []


def test_import_help_imports_neither_the_reader_nor_pandas() -> None:
    probe = (
        "import json, sys\n"
        "from typer.testing import CliRunner\n"
        "from minder.cli import app\n"
        "result = CliRunner().invoke(app, ['import', 'prometheus', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert '--match' in result.output\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('pandas', 'httpx', "
        "'collectors', 'minder.service')))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
