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

from detectors.config import Cadence, DetectorConfig
from detectors.findings import Finding
from detectors.window import NEVER, JobWindow, hold_forward
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
"""A port's two directions: dark when what it reports of them carries nothing."""
DARK_FLOOR = 10e6
"""At or below this many bytes a second a port carries nothing (an idle link's control
traffic)."""
CARRYING = 10.0
"""A port carries traffic above this many :data:`DARK_FLOOR` (100 MB/s)."""
DARK_S = 5.0
DARK_SAMPLES = 3
"""A port must be dark this long, and for this many samples at least."""
WORKED_S = 120.0
WORKED_SAMPLES = 4
"""How far back the job must have worked as one before a port went dark (at least this many
samples at coarse sampling)."""
ALIKE_SHARE = 0.9
"""At every sample before the port went dark, this share of the job's reporting machines
carried traffic on every port the job uses (working), or carried none (a pause of them all)."""
STILL_SHARE = 0.5
"""Share of the job's reporting machines that must still carry traffic while the port is dark."""


def _port_values(
    window: JobWindow, now: int, ticks: int, every: int, metric: str, devices: list[str]
) -> np.ndarray:
    """``[tick, machine, device]`` of ``metric`` over the last ``ticks`` ticks, each sample held
    for the ``every - 1`` ticks after it (:func:`~detectors.window.hold_forward`: series scraped
    every ``every`` ticks at their own offsets); NaN where a device does not report it."""
    out = np.full((ticks, window.n_machines, len(devices)), np.nan)
    cols, names = window.columns_of(metric)
    keep = [i for i, name in enumerate(names) if name in devices]
    if keep:
        values = hold_forward(window.window(now, ticks + every - 1, cols[keep]), every)[-ticks:]
        where = [devices.index(names[i]) for i in keep]
        out[-values.shape[0] :, :, where] = values
    return out


def _port_states(
    window: JobWindow, now: int, ticks: int, every: int, devices: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dark, carrying, known)`` of every port over the last ``ticks`` ticks, each
    ``[tick, machine, device]``: dark when every direction it reports is at most
    :data:`DARK_FLOOR`, carrying when one is above :data:`CARRYING` floors."""
    shape = (ticks, window.n_machines, len(devices))
    low = np.ones(shape, dtype=bool)
    known = np.zeros(shape, dtype=bool)
    carrying = np.zeros(shape, dtype=bool)
    for metric in DARK_METRICS:
        values = _port_values(window, now, ticks, every, metric, devices)
        present = np.isfinite(values)
        filled = np.where(present, values, 0.0)
        low &= ~present | (filled <= DARK_FLOOR)
        known |= present
        carrying |= filled > CARRYING * DARK_FLOOR
    return low & known, carrying, known


def dark_link_findings(window: JobWindow, now: int) -> list[Finding]:
    """An RDMA port that carries nothing while its job's other machines carry traffic, having
    carried it itself: a link that went down (a NIC, a cable, its leaf switch), where the port
    state is not collected. Peer similarity cannot see a fault that takes a whole peer group (a
    leaf switch whose machines are one declared group) and the port state is not everywhere.

    Named, as a ``nic`` finding: a port of a rail the job uses, dark (both directions it reports
    at most :data:`DARK_FLOOR`) for :data:`DARK_S` at least (:data:`DARK_SAMPLES` samples),
    while at every one of the last of those samples :data:`STILL_SHARE` of the job's reporting
    machines still carry traffic; before it went dark, for :data:`WORKED_S` or as far back as
    the window goes, the job reported throughout and its other machines worked as one (at every
    sample :data:`ALIKE_SHARE` of them carried traffic on all its rails, or carried none: a
    pause of them all), and the port carried traffic and never went dark while they worked. It
    is named from the moment the dark stretch is long enough for as long as the window still
    holds history from before it. Not named: a port whose state reads up (an idle port, not a
    lost link), a machine every one of whose rails went dark alone (its process or host
    stopped: peer similarity names it by its GPUs) unless machines of its ``domain`` went dark
    with it (a switch), and anything when more than half of the job's machines are dark.
    """
    devices = sorted({d for m in DARK_METRICS for d in window.columns_of(m)[1]})
    cols = np.concatenate([window.columns_of(m)[0] for m in DARK_METRICS])
    if cols.size == 0:
        return []
    every = int(window.series_every[cols].max())
    active = window.active()
    n_active = int(active.sum())
    dark, carrying, _ = _port_states(window, now, every, every, devices)
    used_now = (carrying[-1] & active[:, None]).sum(axis=0) * 2 >= n_active
    if not (dark[-1] & used_now[None, :]).any():
        return []  # no port of a rail in use reads dark now: the usual evaluation ends here
    samples = max(DARK_SAMPLES, math.ceil(DARK_S / (every * window.tick_s) - 1e-9))
    run = samples * every
    worked = max(WORKED_SAMPLES * every, math.ceil(WORKED_S / window.tick_s - 1e-9))
    ticks = min(run + worked, window.slots - every + 1)
    if ticks < run + every:
        return []
    dark, carrying, known = _port_states(window, now, ticks, every, devices)
    reporting = known.any(axis=2) & active[None, :]  # [tick, machine]
    n_reporting = reporting.sum(axis=1)
    sampled = (n_reporting * 2 >= n_active) & (n_reporting > 0)
    # The rails the job uses: ports that carried traffic on at least half of its machines.
    rails = (carrying.any(axis=0) & active[:, None]).sum(axis=0) * 2 >= n_active
    # Each port's current dark stretch: from the tick after its last sampled reading of more.
    lit = known & ~dark & sampled[:, None, None]
    ever_lit = lit.any(axis=0)
    start = np.where(ever_lit, ticks - np.argmax(lit[::-1], axis=0), 0)  # first dark tick
    during = slice(ticks - run, ticks)
    dark_now = (dark[during] & sampled[during, None, None]).sum(axis=0) >= run - every
    candidates = ever_lit & (ticks - start >= run) & dark_now & rails[None, :] & active[:, None]
    if not candidates.any():
        return []
    suspects = candidates.any(axis=1)
    if int(suspects.sum()) * 2 > n_active:
        return []  # more than half of the job: no link fault takes that many
    # The job before: its other machines worked as one (or paused as one) at every sample.
    others = reporting & ~suspects[None, :]
    n_others = others.sum(axis=1)
    on_rails = carrying[:, :, rails].any(axis=2) & reporting
    whole = on_rails & ~dark[:, :, rails].any(axis=2)
    working = (whole & others).sum(axis=1) >= ALIKE_SHARE * n_others
    paused = (others & ~on_rails).sum(axis=1) >= ALIKE_SHARE * n_others
    first = int(start[candidates].min())
    went = sampled[:first]
    if (
        first < every  # nothing from before it went dark
        or went.sum() < first - every  # the job did not report through all of it
        or not (working | paused)[:first][went].all()
        or working[:first][went].sum() < samples
    ):
        return []  # the job did not work as one before, for as long as the window holds
    still = on_rails.sum(axis=1) >= STILL_SHARE * n_reporting
    if not still[during][sampled[during]].all():
        return []  # the rest of the job barely moves traffic: a stall, not a lost link
    # The port, before its stretch: it carried traffic and never went dark while the job worked.
    prior = np.arange(ticks)[:, None, None] < start[None, :, :]
    worked_prior = prior & (working & sampled)[:, None, None]
    n_prior = worked_prior.sum(axis=0)
    was_carrying = ((carrying & worked_prior).sum(axis=0) * 2 >= n_prior) & (n_prior >= samples)
    never_dark = ~(dark & worked_prior).any(axis=0)
    hits = candidates & was_carrying & never_dark
    if window.columns_of("rdma_port_up")[0].size and hits.any():
        up = _port_values(window, now, run, every, "rdma_port_up", devices)
        hits &= ~(np.nan_to_num(up) >= 1).any(axis=0)  # reported up: an idle port, not a lost link
    machines = np.flatnonzero(hits.any(axis=1))
    # A machine whose every rail went dark: its process or host stopped, unless machines of its
    # domain went dark with it.
    domains = [window.machines[m].domain for m in machines]
    for m in machines:
        domain = window.machines[m].domain
        if (hits[m] | ~rails).all() and (not domain or domains.count(domain) < 2):
            hits[m] = False
    oldest = window.tick_of(now) - ticks + 1
    share = float(
        (on_rails.sum(axis=1) / np.maximum(n_reporting, 1))[during][sampled[during]].min()
    )
    return [
        Finding(
            machine=int(m),
            kind=AlertKind.RULE,
            family="nic",
            metric=DARK_METRICS[0],
            score=1.0,
            first_sec=(oldest + int(start[m, d])) * window.tick_s,
            devices=(devices[d],),
            evidence={
                "rule": "no_traffic",
                "dark_s": int((ticks - int(start[m, d])) * window.tick_s),
                "peers_carrying": round(share, 3),
            },
        )
        for m, d in np.argwhere(hits)
    ]


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
