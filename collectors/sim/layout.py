"""Names and labels of one job's machines, and the order of the series each machine reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectors.sim.scenario import JobSpec
from minder.core.metrics import METRICS, DeviceFamily


@dataclass(frozen=True, slots=True)
class Layout:
    """One job's machines and series.

    A machine reports ``S`` series, metric-major in the canonical metric order and device order
    within a metric (``gpu_util_ratio`` of gpu0…gpu7, then ``gpu_sm_active_ratio`` …).

    Attributes
    ----------
    machines, groups, domains
        Per machine index: name, peer group (``pp2``) and failure domain (``leaf-03``).
    metrics
        The job's metric names, canonical order.
    series_metric, series_device
        ``(S,)`` metric and device name of each series.
    series_family
        ``(S,)`` device family of each series.
    series_index
        ``(S,)`` device index within its family (0 for host metrics).
    slices
        Metric name → the slice of its series.
    """

    machines: tuple[str, ...]
    groups: tuple[str, ...]
    domains: tuple[str, ...]
    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    ranks: tuple[str, ...]
    metrics: tuple[str, ...]
    series_metric: tuple[str, ...]
    series_device: tuple[str, ...]
    series_family: tuple[DeviceFamily, ...]
    series_index: np.ndarray
    slices: dict[str, slice]

    @property
    def n_series(self) -> int:
        """Series per machine."""
        return len(self.series_metric)

    def labels(self, machine: int) -> dict[str, str]:
        """The NodeBatch labels of ``machine``."""
        return {"group": self.groups[machine], "domain": self.domains[machine]}

    def family_mask(self, family: DeviceFamily) -> np.ndarray:
        """``(S,)`` True for the series of ``family``."""
        return np.array([f is family for f in self.series_family], dtype=bool)


def build_layout(job: JobSpec) -> Layout:
    """Lay out ``job``'s machines, labels and series."""
    devices = {
        DeviceFamily.GPU: job.gpu_names(),
        DeviceFamily.NIC: job.nic_names(),
        DeviceFamily.HOST: [""],
        DeviceFamily.RANK: job.rank_names(),
    }
    series_metric: list[str] = []
    series_device: list[str] = []
    series_family: list[DeviceFamily] = []
    series_index: list[int] = []
    slices: dict[str, slice] = {}
    for name in job.metric_names:
        family = METRICS[name].family
        start = len(series_metric)
        for index, device in enumerate(devices[family]):
            series_metric.append(name)
            series_device.append(device)
            series_family.append(family)
            series_index.append(index)
        slices[name] = slice(start, len(series_metric))
    return Layout(
        machines=tuple(job.machine_names()),
        groups=tuple(job.group_of(i) for i in range(job.machines)),
        domains=tuple(job.domain_of(i) for i in range(job.machines)),
        gpus=tuple(devices[DeviceFamily.GPU]),
        nics=tuple(devices[DeviceFamily.NIC]),
        ranks=tuple(devices[DeviceFamily.RANK]),
        metrics=job.metric_names,
        series_metric=tuple(series_metric),
        series_device=tuple(series_device),
        series_family=tuple(series_family),
        series_index=np.asarray(series_index, dtype=np.int64),
        slices=slices,
    )
