"""A small, explicit canonical-table builder for the metamorphic tests of detection.

A job of ``machines`` machines reports, every ``interval_s`` seconds, a few peer-scored
metrics: ``gpu_util_ratio`` and ``gpu_nvlink_tx_bytes_per_second`` per GPU and
``rdma_tx_bytes_per_second`` per NIC. Each value is a level, times a persistent per-machine
offset, times per-sample noise (Gaussian for the ratio, lognormal for the byte rates), so
healthy machines are alike but never identical. Optionally one machine has one clear fault: one
metric (on one device or all of them) drops to ``ratio`` of what it would read, from sample
``start`` for ``samples`` samples.

The transformations the tests apply (thinning, a common factor, renaming, shifting, unit
scaling, idle machines) work on the long table, as they would on a real one, so the builder
knows nothing about them except where a test needs the underlying array (:func:`values`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from detectors.config import DetectorConfig
from detectors.offline import DetectionRun
from minder.core.alert import AlertKind
from minder.core.table import normalize_table

GPUS = 2
NICS = 2
JOB = "job"
LEVELS: dict[str, float] = {
    "gpu_util_ratio": 0.9,
    "gpu_nvlink_tx_bytes_per_second": 4e9,
    "rdma_tx_bytes_per_second": 2e9,
}
"""Healthy level of each metric, in its base unit (all well above the unit's floor in
:data:`detectors.config.UNIT_FLOORS`: 0.02 for ratios, 10 MB/s for byte rates)."""
BYTE_RATES: tuple[str, ...] = ("gpu_nvlink_tx_bytes_per_second", "rdma_tx_bytes_per_second")
"""Metrics without an upper bound, so their unit can be scaled by any positive constant."""
CADENCES: tuple[int, ...] = (1, 5, 10, 15, 30, 60)
"""Sampling intervals real clusters have (docs/detection-method.md §8)."""


def devices_of(metric: str) -> tuple[str, ...]:
    """The devices that report ``metric`` (GPUs ``gpuN``, NICs ``mlx5_N``)."""
    if metric.startswith("gpu_"):
        return tuple(f"gpu{g}" for g in range(GPUS))
    if metric.startswith("rdma_"):
        return tuple(f"mlx5_{n}" for n in range(NICS))
    raise ValueError(f"metric {metric!r} is not built here: expected one of {sorted(LEVELS)}")


SERIES: tuple[tuple[str, str], ...] = tuple((m, d) for m in LEVELS for d in devices_of(m))
"""Every ``(metric, device)`` series of a machine, in the column order of :func:`values`."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One machine's metric drops to ``ratio`` of its healthy value for a sustained run.

    ``device`` None: every device of the metric drops (a host-wide cause), else only that one.
    ``start`` and ``samples`` count samples of the job's own interval.
    """

    machine: int
    metric: str
    start: int
    samples: int
    ratio: float
    device: str | None = None

    def __post_init__(self) -> None:
        if self.metric not in LEVELS:
            raise ValueError(f"fault metric {self.metric!r}: expected one of {sorted(LEVELS)}")
        if not 0 < self.ratio < 1:
            raise ValueError(f"fault ratio {self.ratio!r}: expected a drop, in (0, 1)")
        if self.device is not None and self.device not in devices_of(self.metric):
            raise ValueError(
                f"fault device {self.device!r}: expected one of {devices_of(self.metric)}"
            )


@dataclass(frozen=True, slots=True)
class Job:
    """What :func:`build` draws: the job's shape, its noise, and at most one fault.

    ``noise`` is the relative standard deviation of both the per-sample noise and the
    persistent per-machine offsets. ``stagger``: each machine reports at its own whole-second
    offset within the interval (as Prometheus spreads its scrapes), else all at once.
    """

    machines: int
    samples: int
    interval_s: int
    seed: int
    noise: float
    start_ts: int = 1_700_000_040
    fault: Fault | None = None
    group: str = ""
    domains: int = 4
    names: tuple[str, ...] = field(default=())
    stagger: bool = False

    def __post_init__(self) -> None:
        if self.machines < 1 or self.samples < 1 or self.interval_s < 1:
            raise ValueError(
                f"machines={self.machines!r}, samples={self.samples!r}, "
                f"interval_s={self.interval_s!r}: expected positive integers"
            )
        if self.fault is not None:
            if not 0 <= self.fault.machine < self.machines:
                raise ValueError(
                    f"fault machine {self.fault.machine!r}: expected 0..{self.machines - 1}"
                )
            if self.fault.start + self.fault.samples > self.samples:
                raise ValueError(
                    f"fault ends at sample {self.fault.start + self.fault.samples}: expected at "
                    f"most the job's {self.samples} samples"
                )

    def phases(self) -> np.ndarray:
        """Each machine's offset in seconds within the interval (all 0 unless ``stagger``)."""
        if not self.stagger:
            return np.zeros(self.machines, dtype=np.int64)
        # Its own generator: staggering moves the instants, never the values.
        return np.random.default_rng(self.seed + 1).integers(0, self.interval_s, self.machines)

    def name(self, machine: int) -> str:
        """Machine ``machine``'s name: ``names`` when given, else ``n0007``."""
        return self.names[machine] if self.names else f"n{machine:04d}"


def values(job: Job) -> np.ndarray:
    """``values[sample, machine, series]`` of ``job`` (series in :data:`SERIES` order)."""
    rng = np.random.default_rng(job.seed)
    shape = (job.samples, job.machines, len(SERIES))
    offsets = rng.normal(0.0, job.noise, (job.machines, len(SERIES)))
    noise = rng.normal(0.0, job.noise, shape)
    levels = np.asarray([LEVELS[m] for m, _ in SERIES])
    out = np.empty(shape)
    for s, (metric, _) in enumerate(SERIES):
        if metric == "gpu_util_ratio":
            # Additive Gaussian noise on the ratio, clipped to what a duty cycle can read.
            raw = levels[s] * (1.0 + offsets[None, :, s] + noise[:, :, s])
            out[:, :, s] = np.clip(raw, 0.0, 1.0)
        else:
            out[:, :, s] = levels[s] * np.exp(offsets[None, :, s] + noise[:, :, s])
    fault = job.fault
    if fault is not None:
        cols = [
            s
            for s, (metric, device) in enumerate(SERIES)
            if metric == fault.metric and fault.device in (None, device)
        ]
        rows = slice(fault.start, fault.start + fault.samples)
        out[rows, fault.machine, cols] *= fault.ratio
    return out


def frame(job: Job, data: np.ndarray | None = None) -> pd.DataFrame:
    """The job as a long (not yet canonical) table: one row per sample, machine and series.

    ``data`` (shape of :func:`values`) replaces the job's own values.
    """
    data = values(job) if data is None else data
    samples, machines, width = data.shape
    ts = job.start_ts + job.interval_s * np.arange(samples, dtype=np.int64)[:, None]
    ts = ts + job.phases()[None, :machines]
    names = np.asarray([job.name(m) for m in range(machines)], dtype=object)
    domains = np.asarray(
        [f"leaf-{m * job.domains // machines}" for m in range(machines)], dtype=object
    )
    metrics = np.asarray([m for m, _ in SERIES], dtype=object)
    devices = np.asarray([d for _, d in SERIES], dtype=object)
    t_idx, m_idx, s_idx = np.meshgrid(
        np.arange(samples), np.arange(machines), np.arange(width), indexing="ij"
    )
    return pd.DataFrame(
        {
            "ts": ts[t_idx.ravel(), m_idx.ravel()].astype(np.float64),
            "job": JOB,
            "machine": names[m_idx.ravel()],
            "metric": metrics[s_idx.ravel()],
            "device": devices[s_idx.ravel()],
            "group": job.group,
            "domain": domains[m_idx.ravel()],
            "value": data.ravel(),
        }
    )


def build(job: Job, data: np.ndarray | None = None) -> pd.DataFrame:
    """The job as a canonical table (:func:`minder.core.table.normalize_table`)."""
    return normalize_table(frame(job, data))


def canonical(long: pd.DataFrame) -> pd.DataFrame:
    """A transformed long table back in canonical form (categories rebuilt from what is left)."""
    plain = long.copy()
    for column in ("job", "machine", "metric", "device", "group", "domain"):
        plain[column] = plain[column].astype(str)
    return normalize_table(plain.reset_index(drop=True))


# -- transformations ------------------------------------------------------------------------


def thin(table: pd.DataFrame, interval_s: int, every: int, phases: dict[str, int]) -> pd.DataFrame:
    """Keep every ``every``-th sample of each series, as a scrape at ``every`` times the
    table's interval would: machine ``name`` keeps its samples ``phases[name]``,
    ``phases[name] + every``, ... (a scrape reads each target at its own offset within its
    interval). ``table`` is sampled every ``interval_s`` seconds, all machines at once."""
    ts = table["ts"].to_numpy()
    sample = np.rint((ts - ts.min()) / interval_s).astype(np.int64)
    phase = table["machine"].astype(str).map(phases).to_numpy(dtype=np.int64)
    return canonical(table[(sample - phase) % every == 0])


def scale_metric(
    table: pd.DataFrame, metric: str, factor: Callable[[np.ndarray], np.ndarray]
) -> pd.DataFrame:
    """Multiply every machine's values of ``metric`` by ``factor(ts)`` (the same at one
    instant for every machine: a lockstep swing, a ramp, or a constant change of unit)."""
    out = table.copy()
    rows = (out["metric"] == metric).to_numpy()
    ts = out["ts"].to_numpy()[rows]
    out.loc[rows, "value"] = out["value"].to_numpy()[rows] * factor(ts)
    return canonical(out)


def rename(table: pd.DataFrame, names: dict[str, str], seed: int) -> pd.DataFrame:
    """Machines renamed by ``names`` and the rows shuffled."""
    out = table.copy()
    out["machine"] = out["machine"].astype(str).map(names)
    return canonical(out.sample(frac=1.0, random_state=seed))


def shift(table: pd.DataFrame, seconds: int) -> pd.DataFrame:
    """Every timestamp moved by ``seconds`` (the grid spacing unchanged)."""
    out = table.copy()
    out["ts"] = out["ts"] + float(seconds)
    return canonical(out)


def with_idle(table: pd.DataFrame, job: Job, count: int, seed: int) -> pd.DataFrame:
    """``count`` machines of another role added, labelled as their own group ``idle``: they
    report the same series at the same instants, all near zero (a GPU that is not used, links
    without traffic)."""
    rng = np.random.default_rng(seed)
    idle_job = replace(
        job,
        machines=count,
        fault=None,
        group="idle",
        names=tuple(f"idle-{i:03d}" for i in range(count)),
        domains=1,
    )
    data = np.empty((job.samples, count, len(SERIES)))
    for s, (metric, _) in enumerate(SERIES):
        if metric == "gpu_util_ratio":
            data[:, :, s] = np.clip(rng.normal(0.0, 0.002, (job.samples, count)), 0.0, 1.0)
        else:
            data[:, :, s] = 1e4 * rng.lognormal(0.0, 0.5, (job.samples, count))
    idle = frame(idle_job, data)
    return canonical(pd.concat([table, idle], ignore_index=True))


# -- answers --------------------------------------------------------------------------------

Key = tuple[str, AlertKind, str]
"""``(machine, kind, metric)``: the metric only for similarity alerts, else ``""``."""


def answer(run: DetectionRun) -> dict[Key, float]:
    """What detection says: each alerted ``(machine, kind, metric)`` and its earliest onset
    (``first_ts``)."""
    out: dict[Key, float] = {}
    for alert in run.alerts:
        metric = alert.metric if alert.kind is AlertKind.SIMILARITY else ""
        key = (alert.machine, alert.kind, metric)
        out[key] = min(out.get(key, alert.first_ts), alert.first_ts)
    return out


def expected_keys(job: Job) -> set[Key]:
    """The answer's keys a correct detector gives ``job``: its faulty machine on the faulty
    metric, or nothing."""
    if job.fault is None:
        return set()
    return {(job.name(job.fault.machine), AlertKind.SIMILARITY, job.fault.metric)}


def fault_onset(job: Job) -> float:
    """The first timestamp of ``job``'s fault."""
    assert job.fault is not None
    phase = int(job.phases()[job.fault.machine])
    return float(job.start_ts + phase + job.fault.start * job.interval_s)


def fault_samples_needed(interval_s: int, config: DetectorConfig | None = None) -> int:
    """The fewest samples at ``interval_s`` a fault must last to be confirmed at that cadence
    even as a mild deviation (``continuity`` evaluations once the window has filled), plus a
    margin of two samples."""
    cadence = (config or DetectorConfig()).at_interval(interval_s)
    return cadence.continuity + cadence.window + 2


def compare(
    before: dict[Key, float],
    after: dict[Key, float],
    tolerance_s: float,
    *,
    names: dict[str, str] | None = None,
    offset_s: float = 0.0,
) -> None:
    """Assert two answers agree: the same keys (``before``'s machines renamed by ``names``),
    and each onset within ``tolerance_s`` once ``before``'s is moved by ``offset_s``."""
    mapped = {
        ((names or {}).get(machine, machine), kind, metric): onset + offset_s
        for (machine, kind, metric), onset in before.items()
    }
    assert set(after) == set(mapped), f"alerts changed: before {mapped}, after {after}"
    for key, onset in mapped.items():
        assert abs(after[key] - onset) <= tolerance_s, (
            f"{key}: onset {after[key]} after, {onset} before: expected within {tolerance_s} s"
        )
