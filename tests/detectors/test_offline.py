from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collectors.sim import Scenario, simulate_table
from detectors.base import JobDetector
from detectors.offline import DetectionRun, _first_rows, _present, detect_file, detect_table
from detectors.window import JobWindow
from minder.core.errors import TableError
from minder.core.table import TableReader, read_table, validate_table, write_table

METRICS = [
    "gpu_util_ratio",
    "gpu_power_watts",
    "gpu_ecc_dbe_count",
    "gpu_xid_count",
    "rdma_tx_bytes_per_second",
    "rdma_port_up",
    "rdma_link_downed_count",
    "cpu_util_ratio",
    "train_step_seconds",
]
# Two jobs, each with one injected fault, and late, repeated and missing samples.
SCENARIO = {
    "seed": 5,
    "duration_s": 240,
    "jobs": [
        {
            "name": "a",
            "machines": 12,
            "machines_per_domain": 4,
            "pp_stages": 2,
            "metrics": METRICS,
            "missing_rate": 0.01,
            "late_rate": 0.02,
            "duplicate_rate": 0.01,
        },
        {"name": "b", "machines": 8, "machines_per_domain": 4, "metrics": METRICS},
    ],
    "faults": [
        {"type": "nic_down", "job": "a", "machine": 3, "device": "mlx5_1", "start_s": 120},
        {"type": "ecc_error", "job": "b", "machine": 5, "device": "gpu2", "start_s": 150},
    ],
}
INJECTED = {("a", "a-n0003"), ("b", "b-n0005")}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return simulate_table(Scenario.model_validate(SCENARIO))


@pytest.fixture(scope="module")
def reference(table: pd.DataFrame) -> DetectionRun:
    run = detect_table(table)
    assert {(a.job, a.machine) for a in run.alerts} == INJECTED
    return run


@pytest.fixture(scope="module")
def files(table: pd.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tables")
    shuffled = table.sample(frac=1.0, random_state=3).reset_index(drop=True)
    return {
        "parquet": write_table(table, folder / "t.parquet"),
        "csv.gz": write_table(table, folder / "t.csv.gz"),
        "shuffled": write_table(shuffled, folder / "shuffled.parquet"),
    }


def _same(run: DetectionRun, reference: DetectionRun) -> None:
    assert run.alerts == reference.alerts
    assert run.jobs == reference.jobs


def test_a_stray_early_row_does_not_make_the_replay_walk_the_gap() -> None:
    rows = [
        {"ts": 1.7e9 + t, "job": "j", "machine": f"n{m}", "metric": "cpu_util_ratio", "value": 0.3}
        for t in range(100)
        for m in range(6)
    ]
    rows.append({"ts": 1.7e9 - 5_000_000, "job": "j", "machine": "n0", "metric": "cpu_util_ratio",
                 "value": 0.3})  # fmt: skip
    began = time.monotonic()
    run = detect_table(validate_table(pd.DataFrame(rows)))
    assert time.monotonic() - began < 10
    assert run.alerts == []


@pytest.mark.parametrize("kind", ["parquet", "csv.gz"])
def test_streamed_file_gives_the_alerts_and_counts_of_the_table_in_memory(
    kind: str, files: dict[str, Path], reference: DetectionRun
) -> None:
    run = detect_file(files[kind])
    _same(run, reference)
    assert run.modes == {"a": "stream", "b": "stream"}
    # The simulator's late and repeated batches are counted, not dropped.
    counts = run.input_counts()
    assert counts["out_of_order"] > 0 and counts["duplicates"] > 0
    assert counts["backwards"] == 0 and counts["too_old"] == 0
    assert run.summary()["input"] == counts


def test_small_pieces_and_no_buffer_spill_to_time_slices(
    files: dict[str, Path], reference: DetectionRun
) -> None:
    rows = int(sum(job["samples"] for job in reference.jobs.values()))
    run = detect_file(files["parquet"], chunk_rows=3_000, buffer_rows=0, slice_rows=20_000)
    _same(run, reference)
    assert run.modes == {"a": "spill", "b": "spill"}
    assert 0 < run.peak_rows < rows // 10


def test_unsorted_table_is_replayed_in_time_order_and_counted(
    files: dict[str, Path], reference: DetectionRun
) -> None:
    in_memory = detect_table(read_table(files["shuffled"]))
    assert in_memory.alerts == reference.alerts
    spilled = detect_file(files["shuffled"], chunk_rows=50_000, buffer_rows=100_000)
    buffered = detect_file(files["shuffled"], chunk_rows=50_000)  # the table fits the buffer
    assert spilled.modes == {"a": "spill", "b": "spill"}
    assert buffered.modes == {"a": "stream", "b": "stream"}
    for run in (spilled, buffered):
        _same(run, in_memory)
    counts = spilled.input_counts()
    # Shuffled rows: most are older than a row before them, many by the horizon or more.
    assert counts["backwards"] > counts["samples"] // 2
    assert counts["out_of_order"] > counts["backwards"]
    assert counts["duplicates"] == reference.input_counts()["duplicates"]


def test_several_jobs_are_each_replayed_with_their_own_detector(
    table: pd.DataFrame, files: dict[str, Path], reference: DetectionRun
) -> None:
    for job in ("a", "b"):
        alone = detect_table(validate_table(table[table["job"] == job].reset_index(drop=True)))
        assert [a for a in reference.alerts if a.job == job] == alone.alerts
        assert reference.jobs[job] == alone.jobs[job]
    # Jobs interleaved row by row in the file.
    mixed = table.iloc[np.argsort(table["ts"].to_numpy(), kind="stable")].reset_index(drop=True)
    path = write_table(mixed, files["parquet"].with_name("mixed.parquet"))
    run = detect_file(path, chunk_rows=10_000)
    _same(run, detect_table(read_table(path)))
    assert run.alerts == reference.alerts


def test_the_reader_never_holds_more_than_its_pieces_and_buffer(
    files: dict[str, Path], reference: DetectionRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    largest: list[int] = []
    chunks = TableReader.chunks

    def counted(self: TableReader, columns: object = None) -> Iterator[tuple[int, pd.DataFrame]]:
        for first_row, piece in chunks(self, columns):  # type: ignore[arg-type]
            largest.append(len(piece))
            yield first_row, piece

    monkeypatch.setattr(TableReader, "chunks", counted)
    chunk = 4_000
    run = detect_file(files["parquet"], chunk_rows=chunk)
    _same(run, reference)
    rows = int(sum(job["samples"] for job in reference.jobs.values()))
    assert max(largest) == chunk and len(largest) >= 2 * rows // chunk  # two passes
    # Rows per second of both jobs; the simulator delivers batches at most 3 s late.
    per_second = int(sum(job["machines"] * job["series"] for job in reference.jobs.values()))
    assert run.peak_rows <= 2 * chunk + 2 * 4 * per_second
    largest.clear()
    spilled = detect_file(files["shuffled"], chunk_rows=chunk, buffer_rows=0, slice_rows=15_000)
    _same(spilled, detect_table(read_table(files["shuffled"])))
    assert max(largest) == chunk
    assert spilled.peak_rows <= 15_000 + per_second


def _rows(seconds: range, machines: int, start: float = 1.7e9) -> list[dict[str, object]]:
    sample = {"job": "j", "metric": "cpu_util_ratio", "value": 0.5}
    return [
        {**sample, "ts": start + s, "machine": f"n{m}"} for s in seconds for m in range(machines)
    ]


def test_backwards_timestamps_and_repeated_samples_are_counted(tmp_path: Path) -> None:
    rows = _rows(range(200), 4)
    rows.insert(401, dict(rows[400]))  # a repeated sample, in place
    rows += _rows(range(10, 11), 4)  # second 10 again, 190 s back: beyond the 64 s horizon
    rows += [{**rows[0], "ts": 1.7e9 + 197.5}]  # 2.5 s late, not a repeat (another ts)
    frame = validate_table(pd.DataFrame(rows))
    path = write_table(frame, tmp_path / "bad.csv.gz")
    expected = {"samples": 806, "duplicates": 5, "out_of_order": 5, "backwards": 4, "too_old": 0}
    in_memory = detect_table(frame)
    assert in_memory.input_counts() == expected
    runs = {
        "stream": detect_file(path),
        "stream in pieces of 7 rows": detect_file(path, chunk_rows=7),
        "spill": detect_file(path, chunk_rows=7, buffer_rows=0, slice_rows=9),
    }
    for name, run in runs.items():
        assert run.modes == {"j": name.split()[0]}
        assert run.input_counts() == expected
        assert run.alerts == in_memory.alerts and run.jobs == in_memory.jobs


Registered = dict[str, tuple[list[tuple[str, str, str]], list[tuple[str, str]]]]


def _registered(path: Path, in_memory: bool = False, **options: int) -> Registered:
    """Machines (with labels) and series of each job's window, in registration order."""
    seen: Registered = {}

    def hook(job: str, now: int, window: JobWindow, detector: JobDetector) -> None:
        if job not in seen:
            machines = [(m.name, m.group, m.domain) for m in window.machines]
            seen[job] = (machines, list(window.series))

    if in_memory:
        detect_table(read_table(path), on_second=hook)
    else:
        detect_file(path, on_second=hook, **options)  # type: ignore[arg-type]
    return seen


def test_machines_and_series_are_registered_as_in_memory(
    files: dict[str, Path], tmp_path: Path
) -> None:
    for path in (files["parquet"], files["shuffled"]):
        in_memory = _registered(path, in_memory=True)
        assert _registered(path, chunk_rows=5_000) == in_memory
        assert _registered(path, chunk_rows=5_000, buffer_rows=0) == in_memory
        machines, series = in_memory["a"]
        assert [m[0] for m in machines] == sorted(m[0] for m in machines)
        assert series == sorted(series)
    # A machine takes the labels of its first row in time, not in the file.
    rows = _rows(range(4), 2)
    rows[0] = {**rows[0], "ts": 1.7e9 + 2, "group": "later", "domain": "later"}
    rows.append({**rows[1], "machine": "n0", "ts": 1.7e9, "group": "pp0", "domain": "leaf-0"})
    # The same second again, later in the file: the earlier row of the file wins the tie.
    tie = {"metric": "memory_used_bytes", "group": "tie", "domain": "tie"}
    rows.append({**rows[-1], **tie})
    path = write_table(validate_table(pd.DataFrame(rows)), tmp_path / "labels.parquet")
    for chunk in (1, 1000):
        streamed = _registered(path, chunk_rows=chunk)
        assert streamed["j"][0][0] == ("n0", "pp0", "leaf-0")
        assert streamed == _registered(path, in_memory=True)


def test_a_bad_row_in_a_later_piece_is_named_by_its_file_row(tmp_path: Path) -> None:
    rows = pd.DataFrame(_rows(range(5), 3))
    rows["value"] = rows["value"].astype(object)
    rows.loc[11, "value"] = "fast"
    path = tmp_path / "bad.csv"
    rows.to_csv(path, index=False)
    with pytest.raises(TableError) as info:
        detect_file(path, chunk_rows=4)
    assert (info.value.column, info.value.row) == ("value", 11)


def test_an_empty_table_has_no_alerts(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("ts,job,machine,metric,value\n")
    run = detect_file(path)
    assert run.alerts == [] and run.jobs == {} and run.summary()["alerts"] == 0
    assert detect_table(read_table(path)).jobs == {}


def test_dense_code_lookups_give_what_a_sort_gives() -> None:
    # detect_table numbers machines and series through their category codes (a bitmap and a
    # first-row lookup), not np.unique over every row: same codes, same first rows.
    codes = np.random.default_rng(3).integers(0, 50, size=10_000)
    codes[codes == 7] = 8  # a category no row uses
    assert _present(codes, 60).tolist() == np.unique(codes).tolist()
    unique, first = np.unique(codes, return_index=True)
    assert _first_rows(codes, 60) == list(zip(unique.tolist(), first.tolist(), strict=True))
    assert _first_rows(codes[:0], 60) == []
