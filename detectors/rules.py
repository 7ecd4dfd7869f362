"""Immediate rules for hard faults: XID/ECC, GPU lost, NIC link down, PCIe downgrade, NVLink and
symbol errors, and silence of a machine whose peers still report.

Each rule reads the job window at one evaluation (``now``: the last second of the tick being
evaluated) and returns :class:`Finding` objects. They keep no state of their own; only the events
rule consumes the window's pending events. Durations follow the sampling interval of what they
read (:meth:`DetectorConfig.at_interval`): a GPU whose series come every 15 s is lost after three
missed scrapes, not after three seconds.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from detectors.config import METRIC_FLOORS, Cadence, DetectorConfig
from detectors.findings import Finding
from detectors.window import NEVER, JobWindow
from minder.core.alert import AlertKind
from minder.core.metrics import DeviceFamily
from minder.core.records import EventKind

_EVENT_RULES: dict[EventKind, tuple[str, str]] = {
    EventKind.XID: ("gpu_fatal", "gpu_xid_count"),
    EventKind.ECC: ("gpu_fatal", "gpu_ecc_dbe_count"),
    EventKind.GPU_LOST: ("gpu_fatal", "gpu_lost"),
    EventKind.RECOVERY_ACTION: ("gpu_fatal", "gpu_recovery_action"),
    EventKind.LINK_DOWN: ("nic", "rdma_port_up"),
    EventKind.NVLINK_ERROR: ("nvlink", "gpu_nvlink_error_count"),
}


@lru_cache(maxsize=256)
def cadence_for(config: DetectorConfig, interval_s: float) -> Cadence:
    """``config.at_interval(interval_s)``, cached (rules ask every evaluation)."""
    return config.at_interval(interval_s)


def _metric_cadence(
    window: JobWindow, cols: np.ndarray, config: DetectorConfig
) -> tuple[int, Cadence]:
    """Ticks per sample of a metric's series (the coarsest of its devices) and its durations."""
    every = int(window.series_every[cols].max()) if cols.size else 1
    return every, cadence_for(config, float(every * window.tick_s))


def evaluate_rules(
    window: JobWindow, now: int, config: DetectorConfig, *, with_peers: bool = True
) -> list[Finding]:
    """Every hard-fault finding at second ``now``.

    ``with_peers=False`` (a job too small to have peers) runs only the rules that need none:
    events, error counts, a lost GPU, a port down; not the PCIe-below-peers and silence rules.
    """
    xid_events: set[tuple[int, str]] = set()
    findings: list[Finding] = []
    findings += event_findings(window, now, config, xid_events)
    # The count carries no XID code: where the agent also sent the XID events (with codes, so
    # application XIDs are already filtered), the count adds nothing.
    findings += [
        f
        for f in count_findings(window, now, "gpu_xid_count", "gpu_fatal", "xid")
        if (f.machine, f.devices[0]) not in xid_events
    ]
    findings += count_findings(window, now, "gpu_ecc_dbe_count", "gpu_fatal", "ecc_dbe")
    findings += count_findings(window, now, "rdma_link_downed_count", "nic", "link_downed")
    findings += port_down_findings(window, now)
    findings += lost_gpu_findings(window, now, config)
    if with_peers:
        findings += dark_link_findings(window, now)
    findings += repeated_error_findings(window, now, "gpu_nvlink_error_count", "nvlink", config)
    findings += repeated_error_findings(window, now, "rdma_symbol_error_count", "nic", config)
    if with_peers:
        for metric in ("gpu_pcie_link_width", "gpu_pcie_link_gen"):
            findings += level_below_peers_findings(window, now, metric, config)
        findings += silence_findings(window, now, config)
    return findings


def event_findings(
    window: JobWindow, now: int, config: DetectorConfig, xid_devices: set[tuple[int, str]]
) -> list[Finding]:
    """Events the agent reported (XID with its code, GPU lost, link down …).

    Adds to ``xid_devices`` each ``(machine, device)`` that reported an XID event, benign or not.
    """
    out = []
    for pending in window.take_events(now):
        event = pending.event
        if event.kind is EventKind.XID:
            xid_devices.add((pending.machine, event.device))
            if event.code in config.benign_xids:
                continue
        family, metric = _EVENT_RULES[event.kind]
        evidence = {"rule": f"event:{event.kind.value}", "code": event.code, "ts": event.ts}
        if event.message:
            evidence["message"] = event.message
        out.append(
            Finding(
                machine=pending.machine,
                kind=AlertKind.RULE,
                family=family,
                metric=metric,
                score=1.0,
                first_sec=int(event.ts),
                devices=(event.device,) if event.device else (),
                evidence=evidence,
            )
        )
    return out


def count_findings(
    window: JobWindow, now: int, metric: str, family: str, rule: str
) -> list[Finding]:
    """A count metric above zero at ``now`` (XIDs, uncorrectable ECC, link-down events)."""
    cols, devices = window.columns_of(metric)
    if cols.size == 0:
        return []
    values = window.window(now, 1, cols)[0]
    hits = np.argwhere(np.nan_to_num(values) > 0)
    out = []
    for m, c in hits:
        out.append(
            Finding(
                machine=int(m),
                kind=AlertKind.RULE,
                family=family,
                metric=metric,
                score=float(values[m, c]),
                first_sec=now,
                devices=(devices[c],),
                evidence={"rule": rule, "value": float(values[m, c]), "ts": now},
            )
        )
    return out


def port_down_findings(window: JobWindow, now: int) -> list[Finding]:
    """An RDMA port reported down (``rdma_port_up`` 0) while it, or its peers, were up."""
    cols, devices = window.columns_of("rdma_port_up")
    if cols.size == 0:
        return []
    history = window.window(now, window.slots, cols)
    current = history[-1]
    peer_up = np.nanmedian(current) if np.isfinite(current).any() else np.nan
    out = []
    for m, c in np.argwhere(current == 0):
        series = history[:, m, c]
        was_up = bool(np.nanmax(series, initial=0) >= 1) or peer_up >= 1
        if not was_up:
            continue
        up_ticks = np.flatnonzero(series >= 1)
        now_tick = window.tick_of(now)
        first_tick = (
            now_tick - (len(series) - 1 - int(up_ticks[-1])) + 1 if up_ticks.size else now_tick
        )
        first = first_tick * window.tick_s
        out.append(
            Finding(
                machine=int(m),
                kind=AlertKind.RULE,
                family="nic",
                metric="rdma_port_up",
                score=1.0,
                first_sec=first,
                devices=(devices[c],),
                evidence={"rule": "port_down", "value": 0.0, "peers_up": float(peer_up)},
            )
        )
    return out


DARK_METRICS: tuple[str, str] = ("rdma_tx_bytes_per_second", "rdma_rx_bytes_per_second")
"""A port's two directions: dark when both carry nothing."""
DARK_FLOOR = METRIC_FLOORS["rdma_tx_bytes_per_second"]
"""At or below this a port carries nothing (an idle link's control traffic)."""
CARRYING = 10.0
"""A port carries traffic above this many floors (100 MB/s)."""
DARK_S = 5.0
DARK_SAMPLES = 3
"""A port must be dark this long, and for this many samples at least."""
WORKED_SHARE = 0.9
"""Share of the job's machines whose ports all carried traffic before the port went dark (the
job worked as one)."""
STILL_SHARE = 0.5
"""Share of the job's machines that must still carry traffic while the port is dark."""


def _port_states(
    window: JobWindow, now: int, ticks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:
    """``(dark, carrying, known, devices)`` over the last ``ticks`` ticks, each ``[tick,
    machine, device]``: dark when every direction reported is at or below
    :data:`DARK_FLOOR` (and one was reported), carrying when one is above :data:`CARRYING`
    floors, known when one was reported."""
    per_metric = [window.columns_of(metric) for metric in DARK_METRICS]
    devices = sorted({d for _, names in per_metric for d in names})
    if not devices:
        return None
    shape = (min(ticks, window.slots), window.n_machines, len(devices))
    low = np.ones(shape, dtype=bool)
    known = np.zeros(shape, dtype=bool)
    carrying = np.zeros(shape, dtype=bool)
    for cols, names in per_metric:
        if cols.size == 0:
            continue
        values = window.window(now, ticks, cols)
        where = [devices.index(d) for d in names]
        present = np.isfinite(values)
        filled = np.where(present, values, 0.0)
        low[:, :, where] &= ~present | (filled <= DARK_FLOOR)
        known[:, :, where] |= present
        carrying[:, :, where] |= filled > CARRYING * DARK_FLOOR
    return low & known, carrying, known, devices


def dark_link_findings(window: JobWindow, now: int) -> list[Finding]:
    """An RDMA port that carries nothing either way while the job's other machines carry
    traffic, having carried it itself: a link that went down (a NIC, a cable, its leaf
    switch), seen where the port state is not collected, or before it is.

    A port of a synchronous job that worked as one (before it went dark, at every sample,
    :data:`WORKED_SHARE` of the job's reporting machines carried traffic and had no dark
    port) reads no bytes in either direction for :data:`DARK_S` (:data:`DARK_SAMPLES` samples
    at least), while at least :data:`STILL_SHARE` of the job's reporting machines still carry
    traffic at every one of those samples. A pause of the whole job (a checkpoint, data
    loading, the end) takes every port down together and names nobody; a job whose machines
    take turns (a serving fleet) never worked as one; more than half of the machines dark at
    once is no link fault either. Findings are of the ``nic`` family, so the machines of one
    domain that go dark together are one domain alert.
    """
    cols = np.concatenate([window.columns_of(metric)[0] for metric in DARK_METRICS])
    if cols.size == 0:
        return []
    every = int(window.series_every[cols].max())
    latest = window.window(now, every, cols)
    if not (np.nan_to_num(latest, nan=np.inf) <= DARK_FLOOR).any():
        return []  # no port reads dark now: the usual evaluation ends here
    samples = max(DARK_SAMPLES, math.ceil(DARK_S / (every * window.tick_s) - 1e-9))
    run = samples * every
    states = _port_states(window, now, 2 * run)
    if states is None:
        return []
    dark, carrying, known, devices = states
    if dark.shape[0] < 2 * run:
        return []
    active = window.active()
    reporting = known.any(axis=2) & active[None, :]  # [tick, machine]
    n_reporting = reporting.sum(axis=1)
    sampled = n_reporting * 2 >= int(active.sum())  # ticks at which the job's samples came
    before, during = slice(0, run), slice(run, 2 * run)
    if not (sampled[before].any() and sampled[during].any()):
        return []
    machine_carrying = carrying.any(axis=2) & reporting
    whole = machine_carrying & ~dark.any(axis=2)
    worked = whole.sum(axis=1) >= WORKED_SHARE * n_reporting
    still = machine_carrying.sum(axis=1) >= STILL_SHARE * n_reporting
    if not (worked[before][sampled[before]].all() and still[during][sampled[during]].all()):
        return []
    is_dark = (dark[during] | ~known[during]).all(axis=0) & (
        known[during].sum(axis=0) >= samples - 1
    )
    was_carrying = (carrying[before].sum(axis=0) * 2 >= known[before].sum(axis=0)) & carrying[
        before
    ].any(axis=0)
    hits = is_dark & was_carrying & active[:, None]
    dark_machines = np.flatnonzero(hits.any(axis=1))
    if dark_machines.size == 0 or dark_machines.size * 2 > int(active.sum()):
        return []
    oldest = window.tick_of(now) - dark.shape[0] + 1
    shares = (
        machine_carrying[during].sum(axis=1)[sampled[during]] / n_reporting[during][sampled[during]]
    )
    share = round(float(shares.min()), 3)
    out = []
    for m, d in np.argwhere(hits):
        # It went dark after the last tick at which it carried traffic (one in ``before``).
        start = oldest + int(np.flatnonzero(carrying[:, m, d])[-1]) + 1
        out.append(
            Finding(
                machine=int(m),
                kind=AlertKind.RULE,
                family="nic",
                metric=DARK_METRICS[0],
                score=1.0,
                first_sec=start * window.tick_s,
                devices=(devices[d],),
                evidence={
                    "rule": "no_traffic",
                    "dark_s": int(run * window.tick_s),
                    "peers_carrying": share,
                },
            )
        )
    return out


def lost_gpu_findings(window: JobWindow, now: int, config: DetectorConfig) -> list[Finding]:
    """A GPU whose every series stopped while its machine still reports (fell off the bus)."""
    devices: dict[str, list[int]] = {}
    for i, (_, device) in enumerate(window.series):
        if window.series_spec[i].family is DeviceFamily.GPU:
            devices.setdefault(device, []).append(i)
    if not devices:
        return []
    last_seen = window.last_seen()
    machine_last = window.machine_last_seen()
    # Reported in the tick being evaluated, and is part of the job.
    reporting = (machine_last >= window.tick_of(now) * window.tick_s) & window.active()
    out = []
    for device, cols in devices.items():
        device_last = last_seen[:, cols].max(axis=1)
        limit = _metric_cadence(window, np.asarray(cols), config)[1].lost_device_s
        gone = reporting & (device_last != NEVER) & (now - device_last >= limit)
        for m in np.flatnonzero(gone):
            out.append(
                Finding(
                    machine=int(m),
                    kind=AlertKind.RULE,
                    family="gpu_fatal",
                    metric="gpu_lost",
                    score=1.0,
                    first_sec=int(device_last[m]) + 1,
                    devices=(device,),
                    evidence={
                        "rule": "gpu_lost",
                        "last_sample_ts": int(device_last[m]),
                        "absent_s": int(now - device_last[m]),
                    },
                )
            )
    return out


def level_below_peers_findings(
    window: JobWindow, now: int, metric: str, config: DetectorConfig
) -> list[Finding]:
    """A PCIe link generation or width below the peers' for ``level_persist_s`` seconds."""
    cols, devices = window.columns_of(metric)
    if cols.size == 0:
        return []
    every, cadence = _metric_cadence(window, cols, config)
    samples = cadence.level_persist
    persist = samples * every
    recent = window.window(now, persist, cols)
    peer_level = np.nanmedian(recent) if np.isfinite(recent).any() else np.nan
    if not np.isfinite(peer_level):
        return []
    present = np.isfinite(recent).sum(axis=0)
    below = np.where(np.isfinite(recent), recent < peer_level - 0.5, True).all(axis=0)
    newest = np.isfinite(recent[-every:]).any(axis=0)
    hits = np.argwhere(below & (present >= max(1, samples - 1)) & newest)
    out = []
    for m, c in hits:
        value = float(recent[-every:, m, c][np.isfinite(recent[-every:, m, c])][-1])
        out.append(
            Finding(
                machine=int(m),
                kind=AlertKind.RULE,
                family="pcie",
                metric=metric,
                score=float(peer_level - value),
                first_sec=(window.tick_of(now) - persist + 1) * window.tick_s,
                devices=(devices[c],),
                evidence={"rule": "pcie_downgrade", "value": value, "peers": float(peer_level)},
            )
        )
    return out


def repeated_error_findings(
    window: JobWindow, now: int, metric: str, family: str, config: DetectorConfig
) -> list[Finding]:
    """Error counts in ``error_seconds`` or more of the last ``window_s`` seconds (in as many
    samples at coarse sampling)."""
    cols, devices = window.columns_of(metric)
    if cols.size == 0:
        return []
    every, cadence = _metric_cadence(window, cols, config)
    length = cadence.window * every
    recent = window.window(now, length, cols)
    seconds_with_errors = (np.nan_to_num(recent) > 0).sum(axis=0)
    newest = (np.nan_to_num(recent[-every:]) > 0).any(axis=0)
    hits = np.argwhere((seconds_with_errors >= cadence.error_ticks) & newest)
    out = []
    for m, c in hits:
        first = np.flatnonzero(np.nan_to_num(recent[:, m, c]) > 0)[0]
        out.append(
            Finding(
                machine=int(m),
                kind=AlertKind.RULE,
                family=family,
                metric=metric,
                score=float(np.nansum(recent[:, m, c])),
                first_sec=(window.tick_of(now) - length + 1 + int(first)) * window.tick_s,
                devices=(devices[c],),
                evidence={
                    "rule": "repeated_errors",
                    "errors": float(np.nansum(recent[:, m, c])),
                    "seconds_with_errors": int(seconds_with_errors[m, c]),
                    "window_s": length * window.tick_s,
                },
            )
        )
    return out


def job_quiet(window: JobWindow, now: int) -> bool:
    """Most of the job's machines reported neither in this tick nor the one before: the job
    stopped (or its stream did); no machine is to blame."""
    last = window.machine_last_seen()
    known = window.active()
    if not known.any():
        return False
    reporting = known & (last >= (window.tick_of(now) - 1) * window.tick_s)
    return bool(reporting.sum() < 0.5 * known.sum())


def silence_findings(window: JobWindow, now: int, config: DetectorConfig) -> list[Finding]:
    """Machines silent for ``silence_s`` (at least ``silence_intervals`` of their sampling
    interval) while most of their peers reported just now."""
    last = window.machine_last_seen()
    if last.size == 0 or job_quiet(window, now):
        return []
    known = window.active()
    reporting = known & (last >= (window.tick_of(now) - 1) * window.tick_s)
    intervals = window.machine_interval_s[: last.size]
    limit = np.maximum(
        cadence_for(config, float(window.tick_s)).silence_s, config.silence_intervals * intervals
    )
    silent = known & (now - last >= limit)
    # A whole domain (switch, rack) missing samples together is a fault one interval sooner:
    # machines failing at once by chance is far rarer than one machine missing two scrapes.
    early_limit = np.maximum(
        config.silence_s,
        config.domain_silence_intervals * intervals,
    )
    early = known & ~silent & (now - last >= early_limit)
    if early.any():
        silent |= early & _whole_domains(window, known, silent | early, config)
    return [
        Finding(
            machine=int(m),
            kind=AlertKind.SILENCE,
            family="silence",
            metric="silence",
            score=float(now - last[m]),
            first_sec=int(last[m]) + 1,
            evidence={
                "rule": "silence",
                "last_sample_ts": int(last[m]),
                "silent_s": int(now - last[m]),
                "interval_s": float(intervals[m]),
                "peers_reporting": int(reporting.sum()),
            },
        )
        for m in np.flatnonzero(silent)
    ]


def _whole_domains(
    window: JobWindow, known: np.ndarray, quiet: np.ndarray, config: DetectorConfig
) -> np.ndarray:
    """Machines whose domain is quiet as a whole: at least ``domain_min_machines`` and
    ``domain_fraction`` of its machines in the job."""
    names = [info.domain for info in window.machines[: known.size]]
    out = np.zeros(known.size, dtype=bool)
    for domain in {names[m] for m in np.flatnonzero(quiet)}:
        if not domain:
            continue
        members = np.asarray([d == domain for d in names]) & known
        needed = max(config.domain_min_machines, math.ceil(config.domain_fraction * members.sum()))
        if (members & quiet).sum() >= needed:
            out |= members
    return out
