"""The first streaming detector: hard-fault rules plus robust peer scoring with continuity.

Every second, per job and metric, each machine's window mean (the denoiser) is compared with the
median of its peers (its ``group``, or the whole job when the group is small) on a robust scale
(MAD, floored per unit), giving a z-score that one threshold serves across job sizes. A machine
that stays above the threshold for ``continuity_s`` consecutive seconds is alerted; several
machines can be alerted at once. Hard faults fire at once through :mod:`detectors.rules`, and
machines of one ``domain`` that fail together are reported as one domain alert.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.config import UNIT_FLOORS, DetectorConfig
from detectors.findings import Finding
from detectors.rules import evaluate_rules
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.metrics import MetricKind

logger = logging.getLogger(__name__)

# Levels and bitmasks are handled by rules, not by distance to peers.
NOT_SCORED: frozenset[str] = frozenset(
    {"gpu_pcie_link_gen", "gpu_pcie_link_width", "rdma_port_up", "gpu_throttle_reasons"}
)
_MAD_TO_SIGMA = 1.4826
_DOMAIN_FAMILIES = frozenset({"silence", "nic"})
_RULE_FAMILIES = frozenset({"gpu_fatal", "nic", "pcie", "nvlink", "silence"})


@dataclass(frozen=True, slots=True)
class ScoreBucket:
    """Scored metrics that share a device count: ``columns[metric, device]`` series indices."""

    metrics: list[str]
    columns: np.ndarray
    floors: np.ndarray


@dataclass(frozen=True, slots=True)
class ScoreLayout:
    """How the window's series are scored; rebuilt when new series appear."""

    n_series: int
    buckets: list[ScoreBucket]
    all_cols: np.ndarray


class PeerDetector:
    """Streaming detector of one job; keep one instance per job.

    Call :meth:`evaluate` once per second of data, in increasing order; it returns the alerts
    that fired at that second (each fault once per episode).
    """

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._runs: dict[str, np.ndarray] = {}
        self._run_peak: dict[str, np.ndarray] = {}
        # (machine, family) -> last second the condition held; an episode ends after rearm_s.
        self._active: dict[tuple[int, str], int] = {}
        # Silence and link-down findings wait settle_s for their domain neighbours:
        # (machine, family) -> (second it was first seen, finding).
        self._pending: dict[tuple[int, str], tuple[int, Finding]] = {}
        # Domains with an open domain-wide episode -> the machines it covers.
        self._domain_members: dict[str, set[int]] = {}
        self._skipped_logged = False
        self._layout_cache: ScoreLayout | None = None
        self.last_scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """Per metric: (top |z| per machine, index of the device behind it) at the last second."""

    # -- public -----------------------------------------------------------------------------
    @property
    def horizon_s(self) -> int:
        """Seconds of history the job window must keep."""
        return self.config.horizon_s

    def machine_scores(self) -> dict[str, tuple[list[float], list[int]]]:
        """Per metric, the latest top |z| of each machine and the device index behind it."""
        return {m: (top.tolist(), dev.tolist()) for m, (top, dev) in self.last_scores.items()}

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        """Run rules and peer scoring at second ``now``; return the alerts that fire."""
        cfg = self.config
        with_peers = window.n_machines >= cfg.min_machines
        if not with_peers and not self._skipped_logged:
            logger.info(
                "job %s has %d machine(s): fewer than %d, so no peers to compare; only the "
                "hard-fault rules that need no peers run",
                window.job,
                window.n_machines,
                cfg.min_machines,
            )
            self._skipped_logged = True
        fired: list[Finding] = []
        for finding in _merge_devices(evaluate_rules(window, now, cfg, with_peers=with_peers)):
            key = (finding.machine, finding.family)
            if not self._touch(key, now):
                continue
            if finding.family in _DOMAIN_FAMILIES:
                self._pending[key] = (now, finding)
            else:
                fired.append(finding)
        fired += self._settle(window, now)
        busy = {m for (m, family) in self._active if family in _RULE_FAMILIES}
        scored = _strongest_per_machine(self._score(window, now)) if with_peers else []
        for finding in scored:
            new = self._touch((finding.machine, finding.family), now)
            if new and finding.machine not in busy:
                # One fault, one alert: a machine a rule already named is not named again.
                detail = finding.evidence
                finding.evidence = _similarity_evidence(
                    window,
                    now,
                    finding.metric,
                    int(detail["col"]),
                    finding.machine,
                    _peer_comparisons(window, cfg.min_group),
                    float(detail["z"]),
                    float(detail["median"]),
                    float(detail["scale"]),
                    cfg,
                )
                finding.evidence["other_metrics"] = sorted(
                    metric
                    for metric, (top, _) in self.last_scores.items()
                    if metric != finding.metric and top[finding.machine] > cfg.threshold
                )
                fired.append(finding)
        self._expire(now)
        return [self._to_alert(window, f, now) for f in _merge_devices(fired)]

    # -- episodes ---------------------------------------------------------------------------
    def _touch(self, key: tuple[int, str], now: int) -> bool:
        """Record that ``key`` holds at ``now``; True when this starts a new episode."""
        new = key not in self._active
        self._active[key] = now
        return new

    def _expire(self, now: int) -> None:
        """End the episodes whose condition has been absent for ``rearm_s``."""
        limit = self.config.rearm_s
        for key in [k for k, last in self._active.items() if now - last > limit]:
            del self._active[key]
            self._pending.pop(key, None)
        active_machines = {m for m, _ in self._active}
        for domain in [d for d, ms in self._domain_members.items() if not ms & active_machines]:
            del self._domain_members[domain]

    def _settle(self, window: JobWindow, now: int) -> list[Finding]:
        """Fire silence / link-down findings once their domain neighbours had time to show."""
        cfg = self.config
        ready = [k for k, (seen, _) in self._pending.items() if now - seen >= cfg.settle_s]
        by_domain: dict[str, list[tuple[int, str]]] = {}
        for key in ready:
            by_domain.setdefault(window.machines[key[0]].domain, []).append(key)
        out: list[Finding] = []
        for domain, keys in by_domain.items():
            if domain:
                in_domain = [k for k in self._pending if window.machines[k[0]].domain == domain]
                members = {m for m, _ in in_domain} | self._domain_members.get(domain, set())
                size = sum(1 for info in window.machines if info.domain == domain)
                needed = max(cfg.domain_min_machines, math.ceil(cfg.domain_fraction * size))
                if len(members) >= needed:
                    findings = [self._pending.pop(k)[1] for k in in_domain]
                    if domain not in self._domain_members:
                        out.append(_domain_finding(window, domain, findings, sorted(members)))
                    self._domain_members[domain] = members
                    continue
            out.extend(self._pending.pop(k)[1] for k in keys)
        return out

    # -- peer scoring -----------------------------------------------------------------------
    def _layout(self, window: JobWindow) -> ScoreLayout:
        """Scored metrics bucketed by device count, so each bucket is one numpy block."""
        if self._layout_cache is not None and self._layout_cache.n_series == window.n_series:
            return self._layout_cache
        by_metric: dict[str, list[int]] = {}
        for i, (metric, _) in enumerate(window.series):
            spec = window.series_spec[i]
            if spec.kind is MetricKind.COUNT or metric in NOT_SCORED:
                continue
            by_metric.setdefault(metric, []).append(i)
        by_width: dict[int, list[str]] = {}
        for metric, cols in by_metric.items():
            by_width.setdefault(len(cols), []).append(metric)
        buckets = []
        for metrics in by_width.values():
            columns = np.asarray([by_metric[m] for m in metrics], dtype=np.int64)
            floors = np.asarray(
                [UNIT_FLOORS.get(window.series_spec[by_metric[m][0]].unit, 1.0) for m in metrics]
            )
            buckets.append(ScoreBucket(metrics, columns, floors))
        all_cols = (
            np.concatenate([b.columns.ravel() for b in buckets])
            if buckets
            else np.zeros(0, dtype=np.int64)
        )
        self._layout_cache = ScoreLayout(window.n_series, buckets, all_cols)
        return self._layout_cache

    def _score(self, window: JobWindow, now: int) -> list[Finding]:
        cfg = self.config
        n = window.n_machines
        layout = self._layout(window)
        findings: list[Finding] = []
        scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if not layout.buckets:
            return findings
        comparisons = _peer_comparisons(window, cfg.min_group)
        values = window.window(now, cfg.window_s, layout.all_cols)
        counts = np.isfinite(values).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, np.nansum(values, axis=0) / np.maximum(counts, 1), np.nan)
        offset = 0
        for bucket in layout.buckets:
            k, width = bucket.columns.shape
            block = means[:, offset : offset + k * width].reshape(n, k, width)
            offset += k * width
            z, medians, scales = _robust_z(block, comparisons, cfg.rel_floor, bucket.floors)
            absz = np.where(np.isfinite(z), np.abs(z), -1.0)
            device_idx = absz.argmax(axis=2)
            top = np.maximum(np.take_along_axis(absz, device_idx[..., None], axis=2)[..., 0], 0)
            for j, metric in enumerate(bucket.metrics):
                scores[metric] = (top[:, j], device_idx[:, j])
                run, peak = self._runs_for(metric, n)
                above = top[:, j] > cfg.threshold
                run[:] = np.where(above, run + 1, 0)
                peak[:] = np.where(above, np.maximum(peak, top[:, j]), 0.0)
                for m in np.flatnonzero(run >= cfg.continuity_s):
                    col = int(bucket.columns[j, device_idx[m, j]])
                    device = window.series[col][1]
                    findings.append(
                        Finding(
                            machine=int(m),
                            kind=AlertKind.SIMILARITY,
                            family="similarity",
                            metric=metric,
                            score=float(peak[m]),
                            first_sec=int(now - run[m] + 1 - cfg.window_s // 2),
                            devices=(device,) if device else (),
                            # Evidence is built only for findings that fire (see evaluate).
                            evidence={
                                "col": col,
                                "median": float(medians[m, j]),
                                "scale": float(scales[m, j]),
                                "z": float(top[m, j]),
                            },
                        )
                    )
        self.last_scores = scores
        return findings

    def _runs_for(self, metric: str, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Per machine, the seconds ``metric`` has been above threshold and the peak score since.

        Both grow with the job's machines (a window never forgets one).
        """
        run = self._runs.get(metric)
        if run is None or run.size < n:
            grown = np.zeros(n, dtype=np.int64)
            peak = np.zeros(n, dtype=np.float64)
            if run is not None:
                grown[: run.size] = run
                peak[: run.size] = self._run_peak[metric]
            self._runs[metric], self._run_peak[metric] = grown, peak
        return self._runs[metric], self._run_peak[metric]

    # -- alerts -----------------------------------------------------------------------------
    def _to_alert(self, window: JobWindow, finding: Finding, now: int) -> Alert:
        members = finding.evidence.get("domain_members")
        if members:
            machine = finding.evidence["domain"]
            domain = machine
        else:
            info = window.machines[finding.machine]
            machine, domain = info.name, info.domain
        evidence = dict(finding.evidence)
        evidence.setdefault("group", "" if members else window.machines[finding.machine].group)
        return Alert(
            job=window.job,
            machine=machine,
            kind=finding.kind,
            metric=finding.metric,
            score=finding.score,
            first_ts=float(finding.first_sec),
            detected_ts=float(now),
            devices=finding.devices,
            domain=domain,
            evidence=evidence,
        )


def _strongest_per_machine(findings: list[Finding]) -> list[Finding]:
    """One similarity finding per machine: the metric with the highest score."""
    best: dict[int, Finding] = {}
    for finding in findings:
        current = best.get(finding.machine)
        if current is None or finding.score > current.score:
            best[finding.machine] = finding
    return list(best.values())


def _merge_devices(findings: list[Finding]) -> list[Finding]:
    """One finding per (machine, family) of one second, with the union of their devices."""
    merged: dict[tuple[int, str], Finding] = {}
    for finding in findings:
        key = (finding.machine, finding.family)
        first = merged.get(key)
        if first is None:
            merged[key] = finding
            continue
        devices = first.devices + tuple(d for d in finding.devices if d not in first.devices)
        first.devices = devices
        first.score = max(first.score, finding.score)
        first.first_sec = min(first.first_sec, finding.first_sec)
    return list(merged.values())


def _peer_comparisons(window: JobWindow, min_group: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(machines, their peers)`` pairs: each group against itself, small groups against all."""
    everyone = np.arange(window.n_machines)
    by_label: dict[str, list[int]] = {}
    for i, info in enumerate(window.machines):
        by_label.setdefault(info.group, []).append(i)
    if len(by_label) == 1:
        return [(everyone, everyone)]
    pairs = []
    small: list[int] = []
    for members in by_label.values():
        if len(members) >= min_group:
            group = np.asarray(members)
            pairs.append((group, group))
        else:
            small.extend(members)
    if small:
        pairs.append((np.asarray(sorted(small)), everyone))
    return pairs


def _robust_z(
    block: np.ndarray,
    comparisons: list[tuple[np.ndarray, np.ndarray]],
    rel_floor: float,
    floors: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z-scores of ``block[machine, metric, device]`` against each machine's peers.

    A metric's peers pool every device of every peer machine. Returns the z-scores and, per
    machine and metric, the median and the scale it was compared with.
    """
    n, k, _ = block.shape
    z = np.full(block.shape, np.nan)
    medians = np.full((n, k), np.nan)
    scales = np.full((n, k), np.nan)
    for targets, members in comparisons:
        pooled = block[members].transpose(1, 0, 2).reshape(k, -1)
        enough = np.isfinite(pooled).sum(axis=1) >= 3
        if not enough.any():
            continue
        median = row_nanmedian(pooled)
        mad = row_nanmedian(np.abs(pooled - median[:, None]))
        scale = np.maximum(np.maximum(_MAD_TO_SIGMA * mad, rel_floor * np.abs(median)), floors)
        median = np.where(enough, median, np.nan)
        z[targets] = (block[targets] - median[None, :, None]) / scale[None, :, None]
        medians[targets] = median
        scales[targets] = scale
    return z, medians, scales


def row_nanmedian(values: np.ndarray) -> np.ndarray:
    """Median of each row ignoring NaN (NaN for an all-NaN row).

    ``np.nanmedian`` along an axis goes through masked arrays and costs ~50x more on the small
    blocks scored every second.
    """
    ordered = np.sort(values, axis=1)  # NaN sorts last
    count = np.isfinite(values).sum(axis=1)
    low = np.clip((count - 1) // 2, 0, None)
    high = np.clip(count // 2, 0, None)
    rows = np.arange(values.shape[0])
    median = (ordered[rows, low] + ordered[rows, np.minimum(high, values.shape[1] - 1)]) / 2
    return np.where(count > 0, median, np.nan)


def _similarity_evidence(
    window: JobWindow,
    now: int,
    metric: str,
    col: int,
    machine: int,
    comparisons: list[tuple[np.ndarray, np.ndarray]],
    z: float,
    median: float,
    scale: float,
    config: DetectorConfig,
) -> dict[str, Any]:
    """The machine's window of the deviating series against its peers' median and band."""
    length = max(config.window_s, min(config.continuity_s, 60))
    series = window.window(now, length, np.asarray([col]))[:, :, 0]
    peers = next(
        (members for targets, members in comparisons if machine in targets),
        np.arange(window.n_machines),
    )
    peer_values = series[:, peers]
    with np.errstate(all="ignore"):
        peer_median = np.nanmedian(peer_values, axis=1)
        low = np.nanpercentile(peer_values, 10, axis=1)
        high = np.nanpercentile(peer_values, 90, axis=1)
    own = series[:, machine]
    missing = int(np.isnan(own[-config.window_s :]).sum())
    return {
        "rule": None,
        "method": "peer_median_mad",
        "z": round(z, 3),
        "threshold": config.threshold,
        "continuity_s": config.continuity_s,
        "peers": int(peers.size),
        "peer_median": median,
        "scale": scale,
        "window_start_ts": now - length + 1,
        "machine_window": _floats(own),
        "peer_median_window": _floats(peer_median),
        "peer_band_window": [_floats(low), _floats(high)],
        "missing_samples": missing,
        "metric": metric,
    }


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), 6) for v in values]


def _domain_finding(
    window: JobWindow, domain: str, findings: list[Finding], machines: list[int]
) -> Finding:
    first = min(f.first_sec for f in findings)
    kinds = sorted({f.kind.value for f in findings})
    kind = AlertKind.SILENCE if kinds == ["silence"] else AlertKind.RULE
    metric = findings[0].metric if len({f.metric for f in findings}) == 1 else "domain"
    domain_size = sum(1 for info in window.machines if info.domain == domain)
    return Finding(
        machine=machines[0],
        kind=kind,
        family="domain",
        metric=metric,
        score=len(machines) / max(domain_size, 1),
        first_sec=first,
        devices=(),
        evidence={
            "rule": "domain",
            "domain": domain,
            "domain_members": [window.machines[m].name for m in machines],
            "domain_size": domain_size,
            "member_rules": sorted({str(f.evidence.get("rule")) for f in findings}),
        },
    )
