"""Parameters of the streaming detector, with the reason behind each default.

Durations are given twice: in seconds (what they are at the agent's 1-second sampling) and as a
number of samples, the least that still makes sense when a job is sampled every 5, 15 or 60 s.
:meth:`DetectorConfig.at_interval` turns both into the durations of one sampling interval (the
larger of the two wins), so one configuration serves every cadence (docs/detection-method.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Application-caused XIDs (a user kernel's fault, not the machine's): evicting the machine would
# not help. 13: graphics engine exception, 31: MMU fault, 43: GPU stopped processing (the
# process was killed), 45: preemptive cleanup after another fault.
BENIGN_XIDS: frozenset[int] = frozenset({13, 31, 43, 45})

# The smallest deviation worth a z-score of 1, per unit: below this the instruments' own
# resolution and normal machine-to-machine spread dominate. It keeps the robust scale from
# collapsing when every machine reads the same (a stalled job: tensor activity 0 everywhere).
UNIT_FLOORS: dict[str, float] = {
    "ratio": 0.02,
    "watts": 5.0,
    "celsius": 1.0,
    "hertz": 15e6,
    "bytes": 256 * 2**20,
    "bytes_per_second": 10e6,
    "1/s": 10.0,
    "seconds": 0.005,
    "1": 1.0,
}

METRIC_FLOORS: dict[str, float] = {
    # Integer-percent fields (DCGM, NVML): two steps of their resolution.
    "gpu_util_ratio": 0.02,
    "gpu_sm_active_ratio": 0.02,
    "gpu_tensor_active_ratio": 0.02,
    "gpu_gr_engine_active_ratio": 0.02,
    "gpu_dram_active_ratio": 0.02,
    "cpu_util_ratio": 0.02,
    # Board power is read to the watt but wanders by a few watts between identical GPUs.
    "gpu_power_watts": 5.0,
    # Temperature is read in whole degrees.
    "gpu_temperature_celsius": 1.0,
    # SM clocks move in 15 MHz bins.
    "gpu_sm_clock_hertz": 15e6,
    # Allocators reserve in large blocks: a few hundred MiB of frame buffer mean nothing.
    "gpu_memory_used_bytes": 256 * 2**20,
    "memory_used_bytes": 1024 * 2**20,
    # Link throughputs: below 10 MB/s is the control traffic of an idle link.
    "gpu_pcie_tx_bytes_per_second": 10e6,
    "gpu_pcie_rx_bytes_per_second": 10e6,
    "gpu_nvlink_tx_bytes_per_second": 10e6,
    "gpu_nvlink_rx_bytes_per_second": 10e6,
    "rdma_tx_bytes_per_second": 10e6,
    "rdma_rx_bytes_per_second": 10e6,
    "net_tx_bytes_per_second": 10e6,
    "net_rx_bytes_per_second": 10e6,
    "disk_read_bytes_per_second": 10e6,
    "disk_write_bytes_per_second": 10e6,
    "nccl_busbw_bytes_per_second": 10e6,
    # Congestion counters: tens per second is background on a busy fabric.
    "pfc_tx_pause_per_second": 10.0,
    "pfc_rx_pause_per_second": 10.0,
    "rdma_cnp_sent_per_second": 10.0,
    "rdma_cnp_handled_per_second": 10.0,
    "rdma_xmit_wait_per_second": 10.0,
    # Step and collective times are timed to the millisecond; 5 ms is below any step's jitter.
    "train_step_seconds": 0.005,
    "train_busy_seconds": 0.005,
    "nccl_collective_seconds": 0.005,
}
"""The smallest deviation worth a z-score of 1, per metric (docs/detection-method.md §10): the
instrument's resolution and the spread identical healthy machines show. It is what the robust
scale falls to when the peers' distribution is degenerate (a median absolute deviation of 0:
every peer idle at 0 %, or quantised to one value), so a tiny scale never makes any non-zero
value an outlier. Metrics not listed take their unit's floor (:data:`UNIT_FLOORS`)."""

CONGESTION_COUNTERS: frozenset[str] = frozenset(
    {
        "pfc_tx_pause_per_second",
        "pfc_rx_pause_per_second",
        "rdma_cnp_sent_per_second",
        "rdma_cnp_handled_per_second",
        "rdma_xmit_wait_per_second",
    }
)
"""Counters of congestion events on a NIC's port (pause frames, congestion notifications, time
waiting to send)."""

NETWORK_THROUGHPUTS: frozenset[str] = frozenset(
    {
        "rdma_tx_bytes_per_second",
        "rdma_rx_bytes_per_second",
        "net_tx_bytes_per_second",
        "net_rx_bytes_per_second",
    }
)
"""Throughputs of a machine's ports on the routed scale-out network (RDMA and host NICs)."""

NETWORK_REL_FLOOR = 0.05
"""The smallest scale of a :data:`NETWORK_THROUGHPUTS` metric as a fraction of its peers'
median (docs/detection-method.md §10). What one port of a synchronous job moves over a
scrape interval depends on the path its flows took: adaptive routing and ECMP put some flows
on busier links, and the congestion they meet comes and goes over minutes, so healthy ports
differ by 10-20 % at one instant, and wander. A port that lost a fifth of its peers' rate for
a while is that; a link fault takes far more (a port down carries nothing, a link trained at
half speed carries half). With this floor, a port must carry about 30 % less than its peers
to be an outlier at the default threshold of 6, and one that lost half of their rate is a
severe deviation (:data:`SEVERE_LOSS`)."""

SEVERE_LOSS = 0.5
"""On a work metric judged with a relative floor (:data:`NETWORK_THROUGHPUTS`), a machine that
lost at least this share of its peers' level is a severe deviation, however high the floor puts
the severe level in z: with a 5 % floor a port carrying nothing scores only 20 against the
severe 24, and a port at a tenth of its peers would wait for the mild continuity."""

METRIC_REL_FLOORS: dict[str, float] = {
    **dict.fromkeys(CONGESTION_COUNTERS, 1.5),
    **dict.fromkeys(NETWORK_THROUGHPUTS, NETWORK_REL_FLOOR),
}
"""The smallest scale of a metric as a fraction of its peers' median, where it is larger than
:attr:`DetectorConfig.rel_floor` (docs/detection-method.md §10): network throughputs take
:data:`NETWORK_REL_FLOOR`, congestion counters one and a half. Congestion counters differ
between healthy ports of one job by a factor, not by a margin: how often a port pauses or is
notified depends on where it sits in the fabric (its switch, its rail, the incast its traffic
meets, the ECMP hash that put it on a busy path), and that difference wanders over minutes, with
bursts of several times the peers' rate that decay for as long. A fault there is a surge of an
order of magnitude and more (a PCIe link that fell back and cannot drain the NIC's buffers
pauses the switch thousands of times a second; a NIC in a pause storm sends them at line rate).
With a scale of at least one and a half times the peers' level, a port must pause about ten
times as often as its peers (at the default threshold of 6) before it is an outlier."""


OWN_PAUSE_FACTORS = "0 (off) or a factor of 1 to 100"
"""What ``hang_own_pause_factor`` may be, in words (:func:`own_pause_factor_ok`)."""


def own_pause_factor_ok(value: object) -> bool:
    """Whether ``value`` is a hang detector's ``own_pause_factor``: 0 (off) or a number of 1 to
    100 (a stall held for less than the longest the job ended by itself would page at once)."""
    return isinstance(value, int | float) and (value == 0 or 1 <= value <= 100)


IDLE_AT_ZERO: frozenset[str] = frozenset(
    {
        "gpu_util_ratio",
        "gpu_sm_active_ratio",
        "gpu_tensor_active_ratio",
        "gpu_gr_engine_active_ratio",
        "gpu_dram_active_ratio",
        "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second",
        "gpu_nvlink_tx_bytes_per_second",
        "gpu_nvlink_rx_bytes_per_second",
        "rdma_tx_bytes_per_second",
        "rdma_rx_bytes_per_second",
        "net_tx_bytes_per_second",
        "net_rx_bytes_per_second",
        "disk_read_bytes_per_second",
        "disk_write_bytes_per_second",
        "cpu_util_ratio",
    }
)
"""Activity metrics that read 0 on an idle machine. When a machine's peers sit at that idle
level (their median within the metric's floor of 0), the job is not working on that metric and
there is no busy reference: a machine busier than idle peers is no fault signal (a serving pod
taking requests), so it is not scored as an outlier above them. Congestion and error counters
(PFC pauses, CNPs) are not here: there a surge above quiet peers is the fault."""

RISES_WITH_LOAD: frozenset[str] = IDLE_AT_ZERO | frozenset(
    {
        "gpu_power_watts",
        "gpu_sm_clock_hertz",
        "gpu_temperature_celsius",
        "gpu_memory_used_bytes",
        "nccl_busbw_bytes_per_second",
    }
)
"""Metrics that rise with a GPU's load. When a machine's peers' GPUs idle, reading above them
on these is being busy, not faulty. Congestion and error counters are not here."""


FAULT_BELOW_ONLY: frozenset[str] = (IDLE_AT_ZERO - {"cpu_util_ratio"}) | frozenset(
    {"gpu_power_watts", "gpu_sm_clock_hertz", "nccl_busbw_bytes_per_second"}
)
"""Metrics of the work a machine does (utilisation, throughput, clocks, power): a fault makes a
machine do *less* than its peers (a dead process, a throttled GPU, a degraded link), never more,
so only a deviation below the peers is judged (docs/detection-method.md §12). A machine above
its peers on these (its samples fall in a busier phase of the step, a background task, a burst
of traffic) does not slow a synchronous job; if it did, its step times would say so, and the
straggler detector judges those. Not here: host CPU use (a soft-lockup or an interrupt storm of a
failing device raises it), temperature (a GPU running hot is a cooling fault), congestion and
error counters (a surge there is the fault). A machine still busy after its peers halted is
judged separately, on its raw scores (a hung kernel, :mod:`detectors.halts`)."""


ABOVE_WITH_WORK_BELOW: frozenset[str] = frozenset({"cpu_util_ratio"})
"""Metrics on which a machine *above* its peers is a fault only while it also does less work
than they do (below them on a :data:`FAULT_BELOW_ONLY` metric at the same evaluation): host CPU
use. An interrupt storm or a soft lockup of a failing device takes the host from the job, and
its GPUs or NICs fall behind; a cron job, a log rotation or a heavier data loader raises the CPU
of a host whose work keeps pace, and draining it would not help the job
(docs/detection-method.md §12). Below the peers it is judged as before."""


def metric_floor(metric: str, unit: str) -> float:
    """The scale floor of ``metric`` (:data:`METRIC_FLOORS`, else its unit's)."""
    return METRIC_FLOORS.get(metric, UNIT_FLOORS.get(unit, 1.0))


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Parameters of :class:`detectors.engine.MinderDetector`.

    Attributes
    ----------
    window_s
        Seconds averaged into one score (Minder's window w = 8 s): the denoising step.
    threshold
        Robust z-score (deviation from the peers' median over a MAD-based scale) above which a
        machine is an outlier on a metric.
    continuity_s
        Consecutive seconds a machine must stay an outlier before a similarity alert (Minder
        uses 4 minutes in batch; streaming lets us act sooner).
    severe_threshold, severe_continuity_s
        A deviation this large (a process that died, a GPU idle among busy peers) is confirmed
        after this shorter run; it still outlasts a 15-second blip seen through the 8-second
        window. Default: 4 x ``threshold`` and the shorter of 25 s and ``continuity_s``.
    denoiser
        Filter of every metric the model has no trained denoiser for (``mean``, ``median``,
        ``ewma``; ``raw`` scores the window as measured).
    untrusted_factor
        Metrics the trained priority tree never used need this many times the threshold.
    silence_s
        Seconds without any sample from a machine, while its peers report, before a silence
        alert.
    min_machines
        Jobs with fewer machines have no meaningful peers and are skipped (logged once).
    min_group
        A ``group`` with fewer machines is compared with the whole job instead.
    rel_floor
        The robust scale is at least this fraction of the peers' median.
    lost_device_s
        Seconds all of a GPU's series must be absent, while its machine reports, to call the GPU
        lost.
    level_persist_s
        Seconds a PCIe link generation or width must stay below the peers' before a rule alert.
    error_seconds
        Of the last ``window_s`` seconds, how many must carry NVLink or symbol errors before a
        rule alert (a lone correctable error is normal).
    rearm_s
        A condition absent this long ends its episode; seeing it again is a new fault.
    domain_fraction, domain_min_machines
        When at least this share (and this count) of one domain's machines go silent or lose
        their links together, one alert names the domain instead of each machine.
    settle_s
        How long silence and link-down findings wait for their domain neighbours before firing.
    window_samples, continuity_samples, severe_continuity_samples
        At coarse sampling, the fewest samples in a window, and the fewest evaluations a run
        must last (mild and severe). Both defaults exceed the window, so one deviating sample,
        which stays in the window mean for ``window_samples`` evaluations, can never confirm a
        culprit on its own.
    silence_intervals
        Silence is at least this many sampling intervals without a sample (3 missed samples at
        the default): one missed scrape is not silence.
    domain_silence_intervals
        A domain (switch, rack) whose machines are all (``domain_fraction`` of them) without a
        sample is silent after this many intervals (2): one fewer than a lone machine.
    lost_device_intervals, level_persist_samples, error_samples, rearm_intervals
        The sample counts behind ``lost_device_s``, ``level_persist_s``, ``error_seconds`` and
        ``rearm_s`` at coarse sampling.
    batch_spread_s, batch_min_machines
        Machines that fall silent within this spread of each other (at least one sampling
        interval), this many or more, while the rest of the job keeps reporting, left the job
        together (a scale-down, a scheduler's kill): one membership change of the job, no
        machine alert. Only a domain that goes silent as a whole is a domain alert.
    coherence_share, coherence_min_outliers
        A metric is not peer-comparable in a job while more distinct machines than
        ``max(coherence_min_outliers, coherence_share x machines)`` were its outliers over the
        coherence horizon (:mod:`detectors.coherence`): faults are rare, about two a day per
        job, while in a fleet of mixed load the outliers rotate and grow with the fleet.
    coherence_horizon_s, coherence_horizon_samples
        How far back an outlier counts: the longer of these seconds and this many samples.
    hang_own_pause_factor
        The live hang detector's ``own_pause_factor`` (:class:`detectors.hang_watch.HangConfig`):
        0 (the default) keeps the hang bound whatever the job did before; 1 to 100 holds a
        stall with no rank stopped first up to that many times the longest stall the job ended
        by itself (an unreported checkpoint), never past the bound's 60 s cap (docs/hangs.md).
    """

    window_s: int = 8
    threshold: float = 6.0
    continuity_s: int = 30
    severe_threshold: float | None = None
    severe_continuity_s: int | None = None
    denoiser: str = "mean"
    untrusted_factor: float = 1.5
    silence_s: float = 10.0
    min_machines: int = 4
    min_group: int = 4
    rel_floor: float = 0.02
    lost_device_s: int = 3
    level_persist_s: int = 3
    error_seconds: int = 3
    rearm_s: int = 120
    domain_fraction: float = 0.5
    domain_min_machines: int = 2
    settle_s: int = 3
    window_samples: int = 3
    continuity_samples: int = 5
    severe_continuity_samples: int = 4
    silence_intervals: int = 3
    domain_silence_intervals: int = 2
    lost_device_intervals: int = 3
    level_persist_samples: int = 2
    error_samples: int = 2
    rearm_intervals: int = 4
    batch_spread_s: float = 5.0
    batch_min_machines: int = 2
    coherence_share: float = 0.05
    coherence_min_outliers: int = 3
    coherence_horizon_s: int = 1800
    coherence_horizon_samples: int = 60
    benign_xids: frozenset[int] = field(default=BENIGN_XIDS)
    hang_own_pause_factor: float = 0.0

    def __post_init__(self) -> None:
        # Derived defaults follow the mild level, so setting only threshold/continuity is coherent.
        if self.severe_threshold is None:
            object.__setattr__(self, "severe_threshold", 4 * self.threshold)
        if self.severe_continuity_s is None:
            object.__setattr__(self, "severe_continuity_s", min(25, self.continuity_s))
        for name in (
            "window_s",
            "continuity_s",
            "severe_continuity_s",
            "min_machines",
            "min_group",
            "rearm_s",
            "window_samples",
            "silence_intervals",
            "domain_silence_intervals",
            "lost_device_intervals",
            "level_persist_samples",
            "error_samples",
            "rearm_intervals",
            "batch_min_machines",
            "coherence_min_outliers",
            "coherence_horizon_s",
            "coherence_horizon_samples",
        ):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} is {value!r}: expected a positive integer")
        if self.threshold <= 0 or self.silence_s <= 0:
            raise ValueError(
                f"threshold={self.threshold!r} and silence_s={self.silence_s!r}: expected > 0"
            )
        if self.severe_level[0] < self.threshold or self.untrusted_factor < 1:
            raise ValueError(
                f"severe_threshold={self.severe_threshold!r} below threshold={self.threshold!r} "
                f"or untrusted_factor={self.untrusted_factor!r} below 1: expected neither"
            )
        factor = self.hang_own_pause_factor
        if not own_pause_factor_ok(factor):
            raise ValueError(f"hang_own_pause_factor is {factor!r}: expected {OWN_PAUSE_FACTORS}")
        if not 0 < self.coherence_share < 1:
            raise ValueError(f"coherence_share is {self.coherence_share!r}: expected (0, 1)")
        if not 0 < self.domain_fraction <= 1:
            raise ValueError(f"domain_fraction is {self.domain_fraction!r}: expected (0, 1]")
        if min(self.continuity_samples, self.severe_continuity_samples) < 1:
            raise ValueError(
                f"continuity_samples={self.continuity_samples!r}, severe_continuity_samples="
                f"{self.severe_continuity_samples!r}: expected at least 1 evaluation"
            )

    @property
    def severe_level(self) -> tuple[float, int]:
        """``(severe_threshold, severe_continuity_s)`` with the defaults filled in."""
        assert self.severe_threshold is not None and self.severe_continuity_s is not None
        return self.severe_threshold, self.severe_continuity_s

    @property
    def horizon_s(self) -> int:
        """Seconds of history the window must keep for these parameters (at 1 s sampling; a
        window with a coarser tick keeps as many ticks)."""
        return max(2 * self.window_s, int(self.silence_s) * 4, 64)

    def at_interval(self, interval_s: float) -> Cadence:
        """The durations of a job (or a metric) sampled every ``interval_s`` seconds."""
        if not interval_s > 0:
            raise ValueError(f"interval_s is {interval_s!r}: expected a positive number")
        i = float(interval_s)

        def ticks(seconds: float, samples: int) -> int:
            return max(math.ceil(seconds / i - 1e-9), samples)

        window = ticks(self.window_s, self.window_samples)
        # A window longer than window_s keeps a short deviation (a blip) in its mean longer:
        # the runs that confirm a culprit grow by as much, so a blip still cannot confirm one.
        longer = window - ticks(self.window_s, 1)
        spread = max(self.batch_spread_s, i)
        return Cadence(
            interval_s=i,
            window=window,
            continuity=max(ticks(self.continuity_s, 1) + longer, self.continuity_samples),
            severe_continuity=max(
                ticks(self.severe_level[1], 1) + longer, self.severe_continuity_samples
            ),
            silence_s=max(self.silence_s, self.silence_intervals * i),
            lost_device_s=max(float(self.lost_device_s), self.lost_device_intervals * i),
            level_persist=ticks(self.level_persist_s, self.level_persist_samples),
            error_ticks=min(window, ticks(self.error_seconds, self.error_samples)),
            rearm_s=max(float(self.rearm_s), self.rearm_intervals * i),
            batch_spread_s=spread,
            settle_s=max(float(self.settle_s), i),
            silence_settle_s=max(float(self.settle_s), spread),
        )


@dataclass(frozen=True, slots=True)
class Cadence:
    """:class:`DetectorConfig` durations for one sampling interval.

    Counts (``window``, ``continuity``, ``severe_continuity``, ``level_persist``,
    ``error_ticks``) are evaluations of that interval; the rest are seconds.
    """

    interval_s: float
    window: int
    continuity: int
    severe_continuity: int
    silence_s: float
    lost_device_s: float
    level_persist: int
    error_ticks: int
    rearm_s: float
    batch_spread_s: float
    settle_s: float
    silence_settle_s: float
    """Silence waits for the rest of its batch too (``batch_spread_s``)."""
