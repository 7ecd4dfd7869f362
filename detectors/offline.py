"""Offline detection over a canonical metric table: the stream replayed second by second.

The table is replayed through the same :class:`JobWindow` and detector the service uses, so an
offline run and a live run of the same data give the same alerts.

Two entry points give the same alerts:

* :func:`detect_table` replays a table held in memory (training and the benchmarks use it).
* :func:`detect_file` replays a table file with bounded memory (``minder detect`` uses it). A
  first pass validates every piece (as ``read_table``) and keeps only what the names and
  timestamps tell: the jobs, their machines and series
  (registered in the window in the order :func:`detect_table` registers them: sorted names) and
  how far the rows are out of time order. A second pass replays each job in time order: straight
  from the file through a small reorder buffer when its rows are nearly ordered, else through
  time-slice files written to a temporary directory and replayed slice by slice.

Bad input is counted, never silently dropped: rows that go back in time (by any amount, and by
the detector's horizon or more, which a live window could no longer place), repeated samples (same
job, machine, metric, device and ``ts``: the later row of the file wins, as in the window) and
samples the window refused as too old. :meth:`DetectionRun.summary` reports them.
"""

from __future__ import annotations

import itertools
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyarrow import ipc

from detectors.base import DetectorFactory, JobDetector, finish_of
from detectors.methods import default_factory
from detectors.window import JobWindow, MembershipChange
from minder.core.alert import Alert
from minder.core.errors import TableError
from minder.core.table import TableReader

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""``progress(job, seconds_done, seconds_total)``."""
SecondHook = Callable[[str, int, JobWindow, JobDetector], None]
"""``hook(job, second, window, detector)``, called after each evaluated second."""
ReadProgress = Callable[[str, int, int | None], None]
"""``reading(stage, rows_done, rows_total)``: stage ``scan`` (first pass) or ``read`` (second);
``rows_total`` is None when the file does not say (CSV)."""

DEFAULT_BUFFER_ROWS = 2_000_000
"""Most rows :func:`detect_file` holds to put nearly ordered rows back in time order."""
DEFAULT_READ_ROWS = 1 << 18
"""Rows :func:`detect_file` reads at once (256 Ki: 274 MB peak on 35 M rows, as fast as 1 Mi)."""
DEFAULT_SLICE_ROWS = 1 << 20
"""Rows of one time slice when :func:`detect_file` has to sort a table through files."""
MAX_SLICES = 256
"""Most time slices of one job (their files are open together while they are written)."""
_BLOCK_ROWS = 1 << 20
"""Rows :func:`detect_table` hands to the replay at once (bounds the duplicate count's copies)."""
_NEVER = -(2**62)
_COUNTS = ("samples", "duplicates", "out_of_order", "backwards", "too_old")


@dataclass(slots=True)
class DetectionRun:
    """Alerts of an offline run and what it covered.

    ``jobs`` holds, per job: ``machines``, ``series``, ``seconds``, ``samples`` (rows),
    ``duplicates`` (repeated samples), ``out_of_order`` (rows older than a row before them in
    the table), ``backwards`` (of those, rows older by the detector's horizon or more) and
    ``too_old`` (samples the window refused) and ``interval_s`` (the sampling interval
    detection followed). ``modes`` says how each job was replayed
    (``memory``, ``stream`` or ``spill``); ``peak_rows`` is the most table rows
    :func:`detect_file` held at once.
    """

    alerts: list[Alert] = field(default_factory=list)
    jobs: dict[str, dict[str, int]] = field(default_factory=dict)
    membership: list[MembershipChange] = field(default_factory=list)
    """Machines that joined or left (not faults), in time order per job."""
    findings: list[dict[str, Any]] = field(default_factory=list)
    """What detection found about each job as a whole (``job`` names it): metrics on which its
    machines are not peers, with the measured coherence; a job too small to have peers."""
    modes: dict[str, str] = field(default_factory=dict)
    peak_rows: int = 0

    def input_counts(self) -> dict[str, int]:
        """Rows read, and the bad ones, over all jobs."""
        return {key: sum(job.get(key, 0) for job in self.jobs.values()) for key in _COUNTS}

    def summary(self) -> dict[str, object]:
        """Counts per job and overall, for the CLI's JSON."""
        return {
            "jobs": self.jobs,
            "alerts": len(self.alerts),
            "machines_alerted": sorted({a.machine for a in self.alerts}),
            "input": self.input_counts(),
            "replay": {"modes": self.modes, "peak_rows": self.peak_rows},
            "findings": self.findings,
            "membership": [
                {
                    "job": c.job,
                    "change": c.change,
                    "machines": list(c.machines),
                    "ts": c.ts,
                    "reason": c.reason,
                }
                for c in self.membership
            ],
        }


# -- the replay of one job ------------------------------------------------------------------


@dataclass(slots=True)
class _Rows:
    """Rows of one job as window indices: second, machine, series, value, exact ``ts``."""

    sec: np.ndarray
    machine: np.ndarray
    series: np.ndarray
    value: np.ndarray
    ts: np.ndarray

    def __len__(self) -> int:
        return len(self.sec)

    def take(self, index: np.ndarray) -> _Rows:
        return _Rows(
            self.sec[index],
            self.machine[index],
            self.series[index],
            self.value[index],
            self.ts[index],
        )

    def in_time_order(self) -> _Rows:
        """The rows sorted by second; rows of one second stay in table order."""
        sec = self.sec
        if len(sec) < 2 or bool((sec[1:] >= sec[:-1]).all()):
            return self
        return self.take(np.argsort(sec, kind="stable"))

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        return _Rows(
            *(
                np.concatenate([getattr(p, name) for p in parts])
                for name in ("sec", "machine", "series", "value", "ts")
            )
        )


class _Replay:
    """Window, detector and evaluation clock of one job.

    Rows come in by whole seconds, in time order (:meth:`feed`); each second with data is
    evaluated, and so are the seconds after it until the next second with data, at most
    ``window.horizon_s`` of them (a stray early row must not make the replay walk every empty
    second in between; the service jumps such gaps too).
    """

    def __init__(
        self,
        job: str,
        detector: JobDetector,
        span: tuple[int, int],
        progress: Progress | None,
        on_second: SecondHook | None,
    ) -> None:
        self.job = job
        self.detector = detector
        self.window = JobWindow(job, horizon_s=detector.horizon_s)
        self.first_sec = span[0]
        self.total = span[1] - span[0] + 1
        self.progress = progress
        self.on_second = on_second
        self.pending: int | None = None  # last second with data, its evaluation not yet done
        self.evaluated = 0  # seconds with data evaluated
        self.alerts: list[Alert] = []
        self.membership: list[MembershipChange] = []
        self.findings: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.counts = dict.fromkeys(_COUNTS, 0)

    def register(self, machines: list[tuple[str, str, str]], series: list[tuple[str, str]]) -> None:
        """Register ``(name, group, domain)`` machines and ``(metric, device)`` series in order."""
        for name, group, domain in machines:
            self.window.machine_id(name, group, domain)
        for metric, device in series:
            self.window.series_id(metric, device)

    def feed(self, rows: _Rows) -> None:
        """Place rows of whole seconds, sorted by second, all later than those fed before."""
        n = len(rows)
        if not n:
            return
        sec = rows.sec
        if self.pending is not None and int(sec[0]) <= self.pending:
            raise TableError(
                f"rows of second {int(sec[0])} of job {self.job!r} came after second "
                f"{self.pending} was replayed: expected the table not to change while it is read"
            )
        self.counts["samples"] += n
        self.counts["duplicates"] += _repeats(rows, self.window.n_series)
        starts = np.flatnonzero(sec[1:] != sec[:-1]) + 1
        bounds = np.concatenate(([0], starts, [n])).tolist()
        machines = rows.machine.astype(np.int64, copy=False)
        series = rows.series.astype(np.int64, copy=False)
        values = rows.value.astype(np.float32, copy=False)
        for lo, hi in itertools.pairwise(bounds):
            now = int(sec[lo])
            self._evaluate(now)
            self.window.add_arrays(now, machines[lo:hi], series[lo:hi], values[lo:hi])
            self.pending = now

    def _evaluate(self, following: int | None) -> None:
        """Evaluate the pending second and the empty ones before ``following`` (None: the end)."""
        sec = self.pending
        if sec is None:
            return
        stop = sec + 1 if following is None else following
        for now in range(sec, min(stop, sec + self.window.horizon_s)):
            self.alerts.extend(self.detector.evaluate(self.window, now))
            if self.window.membership:
                self.membership.extend(self.window.take_membership())
            self._note_findings(now)
            if self.on_second is not None:
                self.on_second(self.job, now, self.window, self.detector)
        if self.progress is not None and (self.evaluated % 60 == 0 or following is None):
            self.progress(self.job, min(self.total, stop - self.first_sec), self.total)
        self.evaluated += 1

    def _note_findings(self, now: int) -> None:
        """Keep each job-level finding once, from when it was first made, with its latest
        measure; one that stopped holding gets ``until_ts`` (a metric that is not
        peer-comparable for a while is reported once, with when it ended)."""
        found = getattr(self.detector, "job_findings", None)
        if found is None:
            return
        current = set()
        for finding in found():
            key = (str(finding["finding"]), finding.get("metric"))
            current.add(key)
            first = self.findings.get(key)
            entry = {"job": self.job, **finding}
            if first is not None:
                entry["since_ts"] = first["since_ts"]
            self.findings[key] = entry
        for key, entry in self.findings.items():
            if key not in current and "until_ts" not in entry:
                entry["until_ts"] = float(now)

    def job_findings(self) -> list[dict[str, Any]]:
        """Job-level findings of the replay, in the order first made."""
        return sorted(self.findings.values(), key=lambda f: (f["since_ts"], str(f.get("metric"))))

    def finish(self, out_of_order: int, backwards: int) -> dict[str, int]:
        """Evaluate the last second; what the job covered (``DetectionRun.jobs``): counts, and
        the sampling interval in whole seconds, all integers."""
        last = self.pending
        self._evaluate(None)
        if last is not None:
            # The table ends here: the job stopped reporting, and who stopped before it did is
            # told by the order (MinderDetector.finish, docs/detection-method.md §10).
            self.alerts.extend(finish_of(self.detector, self.window, last))
        self.pending = None
        return {
            "machines": int(self.window.n_machines),
            "series": int(self.window.n_series),
            "seconds": int(self.total),
            "samples": int(self.counts["samples"]),
            "duplicates": int(self.counts["duplicates"]),
            "out_of_order": int(out_of_order),
            "backwards": int(backwards),
            "too_old": int(self.window.stats.too_old),
            "interval_s": int(self.window.tick_s),
        }


def _repeats(rows: _Rows, n_series: int) -> int:
    """Rows repeating an earlier row's machine, series and ``ts`` (rows of whole seconds)."""
    if len(rows) < 2:
        return 0
    key = rows.machine.astype(np.int64) * max(n_series, 1) + rows.series
    if bool((rows.ts == rows.sec).all()):
        # Whole-second timestamps (the usual table): one integer key per sample.
        span = int(rows.sec.max() - rows.sec.min()) + 1
        width = int(key.max()) + 1
        if span < (1 << 62) // width:
            full = (rows.sec - rows.sec.min()) * width + key
            return len(full) - len(pd.unique(full))
    frame = pd.DataFrame({"key": key, "ts": rows.ts})
    return int(frame.duplicated().sum())


def _lateness(sec: np.ndarray, newest: int, horizon_s: int) -> tuple[int, int, int, int]:
    """Over rows in table order after rows whose newest second is ``newest``: rows out of order,
    rows ``horizon_s`` or more behind, the most seconds behind, and the new newest second."""
    running = np.maximum.accumulate(sec)
    before = np.empty_like(sec)
    before[0] = newest
    before[1:] = running[:-1]
    np.maximum(before, newest, out=before)
    behind = before - sec
    late = int(np.count_nonzero(behind > 0))
    back = int(np.count_nonzero(behind >= horizon_s)) if late else 0
    most = int(behind.max()) if late else 0
    return late, back, most, max(newest, int(running[-1]))


# -- in memory --------------------------------------------------------------------------------


def detect_table(
    table: pd.DataFrame,
    factory: DetectorFactory | None = None,
    progress: Progress | None = None,
    on_second: SecondHook | None = None,
) -> DetectionRun:
    """Replay a validated canonical table (``minder.core.table``) and collect the alerts.

    ``on_second`` sees the window and detector after every evaluated second (training reads
    the scores there).
    """
    factory = factory or default_factory()
    run = DetectionRun()
    if not len(table):
        return run
    jobs = table["job"].cat.remove_unused_categories().cat.categories
    # groupby copies every job's rows; a table of one job (the usual case) is used as it is.
    parts = [(jobs[0], table)] if len(jobs) == 1 else table.groupby("job", observed=True, sort=True)
    for job, rows in parts:
        alerts, covered, membership, findings = _detect_job(
            str(job), rows, factory, progress, on_second
        )
        run.alerts.extend(alerts)
        run.membership.extend(membership)
        run.findings.extend(findings)
        run.jobs[str(job)] = covered
        run.modes[str(job)] = "memory"
    run.alerts.sort(key=lambda a: (a.detected_ts, a.job, a.machine))
    return run


def _detect_job(
    job: str,
    rows: pd.DataFrame,
    factory: DetectorFactory,
    progress: Progress | None,
    on_second: SecondHook | None,
) -> tuple[list[Alert], dict[str, int], list[MembershipChange], list[dict[str, Any]]]:
    detector = factory()
    ts = rows["ts"].to_numpy(dtype=np.float64)
    table_secs = np.floor(ts).astype(np.int64)
    late, back, _, _ = _lateness(table_secs, _NEVER, detector.horizon_s)
    order = np.argsort(table_secs, kind="stable")
    secs = table_secs[order]
    del table_secs
    replay = _Replay(job, detector, (int(secs[0]), int(secs[-1])), progress, on_second)
    window = replay.window
    values = rows["value"].to_numpy(dtype=np.float32)[order]

    # Map names to window indices through the categories, never row by row.
    # Dense code lookups (codes index the categories): no sort of the whole table.
    machine_codes, machine_names = _codes(rows["machine"], order)
    group_codes, group_names = _codes(rows["group"], order)
    domain_codes, domain_names = _codes(rows["domain"], order)
    lookup = np.zeros(len(machine_names), dtype=np.int64)
    for code, i in _first_rows(machine_codes, len(machine_names)):
        lookup[code] = window.machine_id(
            machine_names[code], group_names[group_codes[i]], domain_names[domain_codes[i]]
        )
    row_machine = lookup[machine_codes]
    metric_codes, metric_names = _codes(rows["metric"], order)
    device_codes, device_names = _codes(rows["device"], order)
    n_devices = len(device_names)
    pairs = metric_codes.astype(np.int64) * n_devices + device_codes
    series_of_pair = np.zeros(len(metric_names) * n_devices, dtype=np.int64)
    for p in _present(pairs, len(series_of_pair)).tolist():
        series_of_pair[p] = window.series_id(
            metric_names[p // n_devices], device_names[p % n_devices]
        )
    row_series = series_of_pair[pairs]
    del pairs

    # Blocks of whole seconds: the replay counts repeats block by block.
    starts = np.concatenate(([0], np.flatnonzero(secs[1:] != secs[:-1]) + 1))
    lo = 0
    while lo < len(secs):
        hi = int(starts[np.searchsorted(starts, lo + _BLOCK_ROWS, side="right") - 1])
        if hi <= lo:  # one second longer than a block
            nxt = np.searchsorted(starts, lo, side="right")
            hi = int(starts[nxt]) if nxt < len(starts) else len(secs)
        block = slice(lo, hi)
        replay.feed(
            _Rows(
                secs[block], row_machine[block], row_series[block], values[block], ts[order[block]]
            )
        )
        lo = hi
    covered = replay.finish(late, back)
    return replay.alerts, covered, replay.membership, replay.job_findings()


def _present(codes: np.ndarray, n_codes: int) -> np.ndarray:
    """The distinct values of ``codes`` (all in ``0..n_codes−1``), increasing: a bitmap over
    the codes, linear in the rows (``np.unique`` sorts them)."""
    seen = np.zeros(n_codes, dtype=bool)
    seen[codes] = True
    return np.flatnonzero(seen)


def _first_rows(codes: np.ndarray, n_codes: int) -> list[tuple[int, int]]:
    """``(code, first row)`` of every code present in ``codes``, by increasing code."""
    first = np.full(n_codes, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.int64))
    present = np.flatnonzero(first < len(codes))
    return list(zip(present.tolist(), first[present].tolist(), strict=True))


def _codes(column: pd.Series, order: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Integer codes (in ``order``) and category names of a text column."""
    categorical = (
        column if isinstance(column.dtype, pd.CategoricalDtype) else column.astype("category")
    )
    codes = categorical.cat.codes.to_numpy()[order]
    return codes, [str(c) for c in categorical.cat.categories]


# -- from a file, with bounded memory ---------------------------------------------------------


@dataclass(slots=True)
class _JobScan:
    """What the first pass learns of one job."""

    detector: JobDetector
    horizon_s: int
    rows: int = 0
    newest: int = _NEVER  # newest second so far, in table order
    out_of_order: int = 0
    backwards: int = 0
    most_behind: int = 0
    machines: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """name → (first second, group, domain) of its first row in time order."""
    series: set[tuple[str, str]] = field(default_factory=set)
    second_parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def add(self, piece: pd.DataFrame, sec: np.ndarray, index: np.ndarray | None) -> None:
        """Learn from the rows ``index`` (all when None) of a validated piece."""
        self.rows += len(sec)
        late, back, most, self.newest = _lateness(sec, self.newest, self.horizon_s)
        self.out_of_order += late
        self.backwards += back
        self.most_behind = max(self.most_behind, most)
        self._add_seconds(sec)
        codes = {
            column: _piece_codes(piece[column], index)
            for column in ("machine", "group", "domain", "metric", "device")
        }
        names = {column: _names(piece[column]) for column in codes}
        self._add_machines(sec, codes, names)
        metric, device = codes["metric"], codes["device"]
        n_devices = len(names["device"])
        pairs = _present(
            metric.astype(np.int64) * n_devices + device, len(names["metric"]) * n_devices
        )
        metric_names, device_names = names["metric"], names["device"]
        self.series.update(
            (metric_names[p // n_devices], device_names[p % n_devices]) for p in pairs.tolist()
        )

    def _add_seconds(self, sec: np.ndarray) -> None:
        low = int(sec.min())
        span = int(sec.max()) - low + 1
        if span <= 4 * len(sec) + 1024:
            counts = np.bincount(sec - low, minlength=span)
            present = np.flatnonzero(counts)
            self.second_parts.append((present + low, counts[present]))
        else:
            seconds, counts = np.unique(sec, return_counts=True)
            self.second_parts.append((seconds, counts))

    def _add_machines(
        self, sec: np.ndarray, codes: dict[str, np.ndarray], names: dict[str, list[str]]
    ) -> None:
        machine = codes["machine"].astype(np.int64)
        first_sec = np.full(len(names["machine"]), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_sec, machine, sec)
        # The first row (table order) of each machine's first second.
        at_first = np.flatnonzero(sec == first_sec[machine])
        for code, first in _first_rows(machine[at_first], len(names["machine"])):
            row = int(at_first[first])
            name, second = names["machine"][code], int(first_sec[code])
            known = self.machines.get(name)
            if known is None or second < known[0]:  # a tie keeps the earlier piece's row
                self.machines[name] = (
                    second,
                    names["group"][int(codes["group"][row])],
                    names["domain"][int(codes["domain"][row])],
                )

    def seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """Seconds with data, increasing, and the rows of each."""
        secs = np.concatenate([s for s, _ in self.second_parts])
        counts = np.concatenate([c for _, c in self.second_parts])
        unique, inverse = np.unique(secs, return_inverse=True)
        return unique, np.bincount(inverse, weights=counts).astype(np.int64)


def _piece_codes(column: pd.Series, index: np.ndarray | None) -> np.ndarray:
    codes = column.cat.codes.to_numpy()
    return codes if index is None else codes[index]


def _names(column: pd.Series) -> list[str]:
    return [str(c) for c in column.cat.categories]


def _buffer_need(seconds: np.ndarray, counts: np.ndarray, behind: int) -> int:
    """Most rows in ``behind + 1`` consecutive seconds: what the reorder buffer holds at most."""
    total = np.concatenate(([0], np.cumsum(counts)))
    start = np.searchsorted(seconds, seconds - behind, side="left")
    return int((total[1:] - total[start]).max())


def _slice_edges(seconds: np.ndarray, counts: np.ndarray, slice_rows: int) -> np.ndarray:
    """First second of each time slice: consecutive seconds, at most ``slice_rows`` rows each
    (a single larger second is a slice of its own), at most about ``MAX_SLICES`` slices."""
    limit = max(slice_rows, -(-2 * int(counts.sum()) // MAX_SLICES))
    edges = [int(seconds[0])]
    held = 0
    for sec, count in zip(seconds.tolist(), counts.tolist(), strict=True):
        if held and held + count > limit:
            edges.append(sec)
            held = 0
        held += count
    return np.asarray(edges, dtype=np.int64)


class _Reorder:
    """Puts a nearly ordered job's rows back in time order.

    A row is at most ``behind`` seconds older than the newest row before it (the first pass
    measured it), so once the newest second read is ``S``, every second before ``S - behind``
    is complete and can be replayed.
    """

    def __init__(self, behind: int) -> None:
        self.behind = behind
        self.parts: list[_Rows] = []
        self.rows = 0
        self.newest = _NEVER

    def push(self, rows: _Rows) -> _Rows | None:
        """Add rows in table order; return the rows now complete, in time order."""
        self.newest = max(self.newest, int(rows.sec.max()))
        cut = self.newest - self.behind
        ready: list[_Rows] = []
        kept: list[_Rows] = []
        for part in [*self.parts, rows]:
            done = part.sec < cut
            if not done.any():
                kept.append(part)
            elif done.all():
                ready.append(part)
            else:
                ready.append(part.take(done))
                kept.append(part.take(~done))
        self.parts = kept
        self.rows = sum(len(p) for p in kept)
        return _Rows.concat(ready).in_time_order() if ready else None

    def drain(self) -> _Rows | None:
        if not self.parts:
            return None
        rows = _Rows.concat(self.parts).in_time_order()
        self.parts, self.rows = [], 0
        return rows


_SPILL_SCHEMA = pa.schema(
    [("ts", pa.float64()), ("machine", pa.int32()), ("series", pa.int32()), ("value", pa.float32())]
)


class _Spill:
    """Writes a job's rows into time-slice files, then gives them back slice by slice."""

    def __init__(self, directory: Path, edges: np.ndarray) -> None:
        self.directory = directory
        self.edges = edges
        self.writers: dict[int, ipc.RecordBatchFileWriter] = {}
        codec = "lz4" if pa.Codec.is_available("lz4") else None
        self.options = ipc.IpcWriteOptions(compression=codec)

    def write(self, rows: _Rows) -> None:
        slices = np.searchsorted(self.edges, rows.sec, side="right") - 1
        order = np.argsort(slices, kind="stable")  # keeps table order within a slice
        slices = slices[order]
        bounds = np.concatenate(([0], np.flatnonzero(slices[1:] != slices[:-1]) + 1, [len(rows)]))
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            part = order[lo:hi]
            index = int(slices[lo])
            writer = self.writers.get(index)
            if writer is None:
                path = self.directory / f"slice-{index:05d}.arrow"
                writer = ipc.new_file(str(path), _SPILL_SCHEMA, options=self.options)
                self.writers[index] = writer
            writer.write_batch(
                pa.record_batch(
                    [
                        pa.array(rows.ts[part]),
                        pa.array(rows.machine[part].astype(np.int32)),
                        pa.array(rows.series[part].astype(np.int32)),
                        pa.array(rows.value[part].astype(np.float32)),
                    ],
                    schema=_SPILL_SCHEMA,
                )
            )

    def slices(self) -> Iterator[_Rows]:
        """Each slice's rows in time order (table order within a second), oldest slice first."""
        for index in sorted(self.writers):
            self.writers.pop(index).close()
            path = self.directory / f"slice-{index:05d}.arrow"
            with pa.OSFile(str(path)) as source:
                table = ipc.open_file(source).read_all()
            path.unlink()
            ts = table.column("ts").to_numpy()
            rows = _Rows(
                np.floor(ts).astype(np.int64),
                table.column("machine").to_numpy(),
                table.column("series").to_numpy(),
                table.column("value").to_numpy(),
                ts,
            )
            del table
            yield rows.in_time_order()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


@dataclass(slots=True)
class _JobPlan:
    """How the second pass replays one job."""

    replay: _Replay
    scan: _JobScan
    machine_of: dict[str, int]
    series_of: dict[tuple[str, str], int]
    reorder: _Reorder | None = None
    spill: _Spill | None = None


def detect_file(
    path: str | Path,
    factory: DetectorFactory | None = None,
    progress: Progress | None = None,
    on_second: SecondHook | None = None,
    *,
    reading: ReadProgress | None = None,
    chunk_rows: int = DEFAULT_READ_ROWS,
    buffer_rows: int = DEFAULT_BUFFER_ROWS,
    slice_rows: int = DEFAULT_SLICE_ROWS,
    spill_dir: str | Path | None = None,
) -> DetectionRun:
    """Replay a canonical table file with bounded memory; the alerts of :func:`detect_table`.

    Parameters
    ----------
    path
        ``.parquet``/``.pq``/``.csv``/``.csv.gz`` canonical table (``minder.core.table``).
    factory, progress, on_second
        As :func:`detect_table`.
    reading
        ``reading(stage, rows_done, rows_total)`` while each pass reads the file.
    chunk_rows
        Most rows read from the file at once.
    buffer_rows
        Most rows held, over all jobs, to put nearly ordered rows back in time order; a job
        whose rows need more is sorted through time-slice files instead.
    slice_rows
        Rows of one time slice file.
    spill_dir
        Where the slice files go (a temporary directory inside it, removed at the end);
        default the system's temporary directory.

    Raises
    ------
    TableError
        The table is malformed (as :func:`minder.core.table.read_table`), or it changed
        between the two passes.
    FileNotFoundError
        ``path`` does not exist.
    """
    factory = factory or default_factory()
    reader = TableReader(path, chunk_rows=chunk_rows)
    run = DetectionRun()
    scans = _scan(reader, factory, reading)
    if not scans:
        return run
    with tempfile.TemporaryDirectory(prefix="minder-detect-", dir=spill_dir) as tmp:
        plans = _plan(scans, progress, on_second, buffer_rows, slice_rows, Path(tmp))
        try:
            run.peak_rows = _replay_file(reader, plans, reading)
        finally:
            for plan in plans.values():
                if plan.spill is not None:
                    plan.spill.close()
    for job in sorted(plans):
        plan = plans[job]
        run.jobs[job] = plan.replay.finish(plan.scan.out_of_order, plan.scan.backwards)
        run.alerts.extend(plan.replay.alerts)  # after finish: it evaluates the last second
        run.membership.extend(plan.replay.membership)
        run.findings.extend(plan.replay.job_findings())
        run.modes[job] = "spill" if plan.spill is not None else "stream"
    run.alerts.sort(key=lambda a: (a.detected_ts, a.job, a.machine))
    return run


def _scan(
    reader: TableReader, factory: DetectorFactory, reading: ReadProgress | None
) -> dict[str, _JobScan]:
    """First pass: every piece validated; jobs, machines, series, seconds and time order kept."""
    scans: dict[str, _JobScan] = {}
    done = 0
    columns = ("ts", "job", "machine", "metric", "device", "group", "domain", "value")
    for _, piece in reader.chunks(columns):
        sec = np.floor(piece["ts"].to_numpy()).astype(np.int64)
        for job, index in _job_rows(piece):
            scan = scans.get(job)
            if scan is None:
                detector = factory()
                scan = scans[job] = _JobScan(detector, detector.horizon_s)
            scan.add(piece, sec if index is None else sec[index], index)
        done += len(piece)
        if reading is not None:
            reading("scan", done, reader.rows)
    return scans


def _job_rows(piece: pd.DataFrame) -> Iterator[tuple[str, np.ndarray | None]]:
    """``(job, rows)`` of a piece, sorted by job; rows None when the piece is all one job."""
    codes = piece["job"].cat.codes.to_numpy()
    names = _names(piece["job"])
    present = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    if len(present) == 1:
        yield names[int(present[0])], None
        return
    for code in sorted(present.tolist(), key=lambda c: names[c]):
        yield names[code], np.flatnonzero(codes == code)


def _plan(
    scans: dict[str, _JobScan],
    progress: Progress | None,
    on_second: SecondHook | None,
    buffer_rows: int,
    slice_rows: int,
    spill_dir: Path,
) -> dict[str, _JobPlan]:
    """Windows registered as :func:`detect_table` registers them, and each job's replay mode."""
    plans: dict[str, _JobPlan] = {}
    needs: dict[str, int] = {}
    for job in sorted(scans):
        scan = scans[job]
        seconds, counts = scan.seconds()
        replay = _Replay(
            job, scan.detector, (int(seconds[0]), int(seconds[-1])), progress, on_second
        )
        # Machines and series in sorted order, each machine with its first row's labels.
        machines = [(name, *scan.machines[name][1:]) for name in sorted(scan.machines)]
        replay.register(machines, sorted(scan.series))
        plans[job] = _JobPlan(
            replay,
            scan,
            {name: i for i, (name, _, _) in enumerate(machines)},
            {pair: i for i, pair in enumerate(sorted(scan.series))},
        )
        needs[job] = _buffer_need(seconds, counts, scan.most_behind)
    held = 0
    spilled = 0
    for job in sorted(needs, key=lambda j: (needs[j], j)):
        plan, scan = plans[job], scans[job]
        if held + needs[job] <= buffer_rows:
            held += needs[job]
            plan.reorder = _Reorder(scan.most_behind)
            mode = "stream"
        else:
            seconds, counts = scan.seconds()
            directory = spill_dir / f"job-{spilled:04d}"
            directory.mkdir()
            spilled += 1
            plan.spill = _Spill(directory, _slice_edges(seconds, counts, slice_rows))
            mode = f"spill ({len(plan.spill.edges)} time slices)"
        logger.info(
            "job %s: %d rows, %d out of time order (%d by %d s or more, at most %d s); %s",
            job, scan.rows, scan.out_of_order, scan.backwards, scan.horizon_s,
            scan.most_behind, mode,
        )  # fmt: skip
    return plans


def _replay_file(
    reader: TableReader, plans: dict[str, _JobPlan], reading: ReadProgress | None
) -> int:
    """Second pass: stream or spill every job's rows, then replay the spilled jobs.

    Returns the most table rows held at once (the piece read and the reorder buffers, or
    one time slice).
    """
    peak = 0
    done = 0
    columns = ("ts", "job", "machine", "metric", "device", "value")
    for first_row, piece in reader.chunks(columns):
        ts = piece["ts"].to_numpy(dtype=np.float64)
        sec = np.floor(ts).astype(np.int64)
        value = piece["value"].to_numpy(dtype=np.float32)
        buffered = sum(p.reorder.rows for p in plans.values() if p.reorder is not None)
        peak = max(peak, len(piece) + buffered)
        for job, index in _job_rows(piece):
            plan = plans.get(job)
            if plan is None:
                raise TableError(
                    f"job {job!r} was not in the table's first pass: expected the file "
                    f"{str(reader.path)!r} not to change while it is read",
                    column="job",
                    row=first_row + (0 if index is None else int(index[0])),
                )
            rows = _piece_rows(piece, index, sec, ts, value, plan, first_row)
            if plan.reorder is not None:
                ready = plan.reorder.push(rows)
                buffered = sum(p.reorder.rows for p in plans.values() if p.reorder is not None)
                peak = max(peak, len(piece) + buffered + (len(ready) if ready else 0))
                if ready is not None:
                    plan.replay.feed(ready)
            else:
                assert plan.spill is not None
                plan.spill.write(rows)
        done += len(piece)
        if reading is not None:
            reading("read", done, reader.rows)
    for job in sorted(plans):
        plan = plans[job]
        if plan.reorder is not None:
            rest = plan.reorder.drain()
            if rest is not None:
                plan.replay.feed(rest)
        elif plan.spill is not None:
            for rows in plan.spill.slices():
                peak = max(peak, len(rows))
                plan.replay.feed(rows)
    return peak


def _piece_rows(
    piece: pd.DataFrame,
    index: np.ndarray | None,
    sec: np.ndarray,
    ts: np.ndarray,
    value: np.ndarray,
    plan: _JobPlan,
    first_row: int,
) -> _Rows:
    """One job's rows of a piece, names mapped to the window's indices through categories."""
    machine_lookup = np.asarray(
        [plan.machine_of.get(name, -1) for name in _names(piece["machine"])], dtype=np.int32
    )
    metrics, devices = _names(piece["metric"]), _names(piece["device"])
    series_lookup = np.asarray(
        [plan.series_of.get((metric, device), -1) for metric in metrics for device in devices],
        dtype=np.int32,
    )
    machine = machine_lookup[_piece_codes(piece["machine"], index)]
    pair = _piece_codes(piece["metric"], index).astype(np.int64) * len(devices)
    series = series_lookup[pair + _piece_codes(piece["device"], index)]
    unknown = np.flatnonzero((machine < 0) | (series < 0))
    if unknown.size:
        row = int(unknown[0]) if index is None else int(index[unknown[0]])
        raise TableError(
            f"machine or series of job {plan.replay.job!r} was not in the table's first pass: "
            f"expected the file not to change while it is read",
            row=first_row + row,
        )
    if index is None:
        return _Rows(sec, machine, series, value, ts)
    return _Rows(sec[index], machine, series, value[index], ts[index])
