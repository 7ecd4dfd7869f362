"""The step-indexed straggler detector: persistent and transient stragglers, several at once,
stages, job-wide slowdowns, asynchronous jobs, and bad step times."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from detectors.straggler import StragglerDetector
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind

START = 2_000_000
RANKS = 4

Factor = Callable[[int, int, int], float]
"""``factor(machine, rank, step)``: how many times the balanced busy time that rank takes."""


def run_job(
    *,
    machines: int = 16,
    steps: int = 200,
    step_s: float = 2.0,
    factor: Factor = lambda m, r, s: 1.0,
    sync: bool = True,
    busy: bool = True,
    collective: bool = True,
    stages: int = 1,
    seed: int = 0,
    edit: Callable[[int, int, int, dict[str, float]], None] | None = None,
    detector: StragglerDetector | None = None,
    skew_s: float = 0.0,
) -> tuple[list[Alert], StragglerDetector, float]:
    """Steps of a job; each rank's step reported at the second it ends (the probe's mean of the
    steps that ended in that second), machine ``m`` ``(m % 8) * skew_s`` seconds late. Returns the
    alerts, the detector and the job's true slowdown at its last step."""
    rng = np.random.default_rng(seed)
    base = step_s * 0.7  # balanced busy time; the rest is communication
    comm = step_s - base
    window = JobWindow("j", horizon_s=64, tick_s=1)
    detector = detector or StragglerDetector()
    alerts: list[Alert] = []
    clock = np.zeros((machines, RANKS))  # async: each rank's own time
    t_sync = 0.0
    pending: dict[int, list[tuple[int, int, dict[str, float]]]] = {}
    true_s = 1.0
    for s in range(steps):
        work = np.array(
            [
                [base * factor(m, r, s) * (1 + rng.normal(0, 0.005)) for r in range(RANKS)]
                for m in range(machines)
            ]
        )
        if sync:
            step_time = work.max() + comm
            t_sync += step_time
            ends = np.full((machines, RANKS), t_sync)
            true_s = step_time / (work.mean() + comm)
        else:
            clock += work + comm
            ends = clock.copy()
        for m in range(machines):
            for r in range(RANKS):
                took = step_time if sync else work[m, r] + comm
                sample = {"train_step_seconds": took, "train_step_number": float(s + 1)}
                if busy:
                    sample["train_busy_seconds"] = work[m, r]
                if collective:
                    sample["nccl_collective_seconds"] = took - work[m, r]
                if edit is not None:
                    edit(m, r, s, sample)
                sec = START + math.floor(ends[m, r] + (m % 8) * skew_s)
                pending.setdefault(sec, []).append((m, r, sample))
        horizon = START + math.floor(ends.min())
        for sec in sorted(k for k in pending if k < horizon):
            for m, r, sample in pending.pop(sec):
                window.add_samples(
                    sec,
                    f"m{m:02d}",
                    [(k, f"rank{r}", v) for k, v in sample.items()],
                    group=f"pp{m * stages // machines}" if stages > 1 else "",
                )
            alerts += detector.evaluate(window, sec)
    return alerts, detector, true_s


def named(alerts: list[Alert]) -> list[str]:
    return [a.machine for a in alerts]


def test_a_balanced_job_raises_nothing() -> None:
    alerts, detector, _ = run_job(steps=300)
    assert alerts == []
    assert detector.live_slowdown == pytest.approx(1.0, abs=0.02)


def test_a_persistent_straggler_is_named_with_its_cost() -> None:
    alerts, detector, true_s = run_job(
        steps=300, factor=lambda m, r, s: 1.10 if (m == 6 and r == 2 and s >= 50) else 1.0
    )
    assert named(alerts) == ["m06"]
    alert = alerts[0]
    assert alert.kind is AlertKind.STRAGGLER and alert.devices == ("rank2",)
    ev = alert.evidence
    assert ev["verdict"] == "worker" and ev["straggler"] == "persistent"
    assert ev["ratio"] == pytest.approx(1.10, abs=0.02)
    # Named within 100 steps of its start, the step time measured in seconds of the stream.
    assert alert.detected_ts - (START + 50 * 2.0 * 1.03) <= 100 * 2.1
    # The job's live slowdown and the worker's share of it, against the simulated truth.
    assert detector.live_slowdown == pytest.approx(true_s, rel=0.05)
    assert ev["slowdown"] == pytest.approx(true_s, rel=0.05)
    assert ev["share"] > 0.8  # the others' noise keeps some of the slowdown
    assert ev["gpu_hours_lost_per_hour"] == pytest.approx(64 * (1 - 1 / true_s), rel=0.1)


def test_a_transient_straggler_is_named_within_fifteen_steps() -> None:
    alerts, _, _ = run_job(
        steps=200, factor=lambda m, r, s: 2.0 if (m == 3 and 100 <= s < 125) else 1.0
    )
    assert named(alerts) == ["m03"]
    assert alerts[0].evidence["straggler"] == "transient"
    step_s = 2.0 * 0.7 * 2.0 + 0.6  # the slowed job's step
    assert alerts[0].detected_ts <= START + 100 * 2.0 + 15 * step_s + 2


def test_several_slow_workers_all_slow_for_the_whole_job_are_all_named() -> None:
    slow = {1, 4, 7, 10, 13}

    def factor(m: int, r: int, s: int) -> float:
        if m == 4 and 120 <= s < 135:  # one of them briefly at normal speed
            return 1.0
        return 1.25 if m in slow else 1.0

    alerts, _, _ = run_job(steps=300, factor=factor)
    assert sorted(named(alerts)) == [f"m{m:02d}" for m in sorted(slow)]


def test_everyone_slow_together_is_no_straggler() -> None:
    alerts, detector, _ = run_job(steps=300, factor=lambda m, r, s: 1.5 if s >= 100 else 1.0)
    assert alerts == []
    assert detector.live_slowdown == pytest.approx(1.0, abs=0.02)


def test_a_stage_that_slows_down_is_one_stage_alert() -> None:
    alerts, _, _ = run_job(
        steps=300,
        stages=4,
        factor=lambda m, r, s: (1.2 if s >= 100 else 1.0) if 4 <= m < 8 else 1.0,
    )
    assert [(a.machine, a.evidence["verdict"]) for a in alerts] == [("pp1", "stage")]


def test_a_stage_heavier_from_the_start_is_the_design_not_an_alert() -> None:
    alerts, detector, _ = run_job(
        steps=300, stages=4, factor=lambda m, r, s: 1.12 if m >= 12 else 1.0
    )
    assert alerts == []
    assert detector.live_slowdown > 1.05


def test_one_step_a_minute_is_still_followed() -> None:
    alerts, _, _ = run_job(
        machines=8, steps=120, step_s=60.0, factor=lambda m, r, s: 1.2 if m == 5 else 1.0
    )
    assert named(alerts) == ["m05"]


def test_an_asynchronous_job_without_busy_time_uses_step_times() -> None:
    alerts, _, _ = run_job(
        steps=200,
        sync=False,
        busy=False,
        collective=False,
        factor=lambda m, r, s: 1.3 if m == 9 else 1.0,
    )
    assert named(alerts) == ["m09"]
    assert alerts[0].metric == "train_step_seconds"
    assert alerts[0].evidence["sync"] is False


class Recording(StragglerDetector):
    """Notes, after each evaluation, whether the job was taken for a synchronous one."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[bool] = []

    def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
        out = super().evaluate(window, now)
        self.syncs.append(self.cost.sync)
        return out


def test_an_asynchronous_job_stays_asynchronous_in_ticks_its_slow_worker_misses() -> None:
    """The slow worker reports once per longer step of its own: the ticks it misses see only
    ranks at the same step, which must not make the job synchronous (nor its cost)."""
    detector = Recording()
    alerts, _, _ = run_job(
        steps=200,
        sync=False,
        detector=detector,
        factor=lambda m, r, s: 1.5 if m == 9 else 1.0,
    )
    assert named(alerts) == ["m09"]
    own = (1.4 * 1.5 + 0.6) / 2.0  # the slow ranks' step over the others'
    throughput_s = 1 / (1 - (4 / 64) * (1 - 1 / own))
    assert alerts[0].evidence["sync"] is False
    assert alerts[0].evidence["job_slowdown"] == pytest.approx(throughput_s, rel=0.01)
    later = detector.syncs[len(detector.syncs) // 2 :]  # m09 several steps behind by then
    assert not any(later)


def test_a_synchronous_job_with_long_steps_stays_synchronous_while_it_slows_down() -> None:
    """Steps of 7 s reported over several seconds: most ticks see one rank step or none, and
    right after a slowdown the ranks' latest step times differ (some reported the slower step,
    some not yet); neither makes the job asynchronous, nor its live S the asynchronous one."""
    detector = Recording()
    alerts, _, true_s = run_job(
        steps=150,
        step_s=7.0,
        stages=4,
        skew_s=0.9,
        detector=detector,
        factor=lambda m, r, s: (1.3 if s >= 40 else 1.0) if 8 <= m < 12 else 1.0,
    )
    assert [(a.machine, a.evidence["verdict"]) for a in alerts] == [("pp2", "stage")]
    assert all(detector.syncs)
    assert alerts[0].evidence["job_slowdown"] == pytest.approx(true_s, rel=0.03)


def test_a_rank_that_left_after_one_very_long_step_holds_the_asynchronous_verdict_briefly() -> None:
    """A rank restores for an hour in one step, out of step with the others, then leaves: the
    job is asynchronous for that tick, and synchronous again within about 10 typical steps
    times 3 (the hold is capped), not for three hours of the departed rank's step."""
    detector = Recording()

    def edit(m: int, r: int, s: int, sample: dict[str, float]) -> None:
        if (m, r) != (5, 0) or s < 20:
            return
        if s == 20:
            sample["train_step_seconds"] = 3600.0
            sample["train_step_number"] += 50
        else:
            sample.clear()  # gone

    run_job(steps=150, edit=edit, detector=detector)
    assert not all(detector.syncs)  # the restore's tick was taken for an asynchronous job
    first_async = detector.syncs.index(False)
    # back within 3 x 10 typical steps of 2 s (and a tick), i.e. about 30 steps of the job
    back = detector.syncs[first_async + 70 :]
    assert back and all(back)


def test_without_busy_time_the_late_rank_is_the_one_others_wait_for() -> None:
    alerts, _, _ = run_job(
        steps=200, busy=False, factor=lambda m, r, s: 1.15 if (m == 2 and r == 1) else 1.0
    )
    assert named(alerts) == ["m02"]
    assert alerts[0].metric == "nccl_collective_seconds" and alerts[0].devices == ("rank1",)


def test_bad_step_times_are_skipped_and_counted_never_alerted() -> None:
    def edit(m: int, r: int, s: int, sample: dict[str, float]) -> None:
        if m == 5 and s % 7 == 0:
            sample["train_busy_seconds"] = [0.0, -1.0, math.nan, math.inf, 1e6][s % 5]
        if m == 8 and s == 60:  # a restore from checkpoint: a step 500 times the others
            sample["train_busy_seconds"] *= 500

    alerts, detector, _ = run_job(steps=200, edit=edit)
    assert alerts == []
    assert detector.stats.skipped >= 200 // 7


# --- lateness: how long the others wait for a rank (train_lateness_seconds) ---------------------


@pytest.mark.parametrize("busy", [True, False], ids=["with-busy", "collective-only"])
def test_the_rank_late_at_every_collective_is_the_latest_and_the_one_named(busy: bool) -> None:
    late = (2, 1)
    alerts, detector, _ = run_job(
        steps=200, busy=busy, factor=lambda m, r, s: 1.15 if (m, r) == late else 1.0
    )
    ranks = detector.late_ranks(5)
    assert [(x.machine, x.device) for x in ranks][:1] == [("m02", "rank1")]
    # Its compute is 15 % longer: the others wait that long for it each step.
    assert ranks[0].seconds == pytest.approx(0.15 * 1.4, rel=0.1)
    assert all(x.seconds < 0.2 * ranks[0].seconds for x in ranks[1:])
    assert named(alerts) == ["m02"]
    assert alerts[0].evidence["lateness_s"] == pytest.approx(0.15 * 1.4, rel=0.1)


def test_in_a_balanced_job_nobody_is_late() -> None:
    _, detector, _ = run_job(steps=150)
    ranks = detector.late_ranks(64)
    assert len(ranks) == 64
    # The ranks' jitter (0.5 % of the 1.4 s busy time, 64 ranks): under 1.5 % of a step.
    assert max(x.seconds for x in ranks) < 0.015 * 2.0


def test_a_slow_stage_is_late_for_the_other_stages_not_for_itself() -> None:
    alerts, detector, _ = run_job(
        steps=300,
        stages=4,
        factor=lambda m, r, s: (1.2 if s >= 100 else 1.0) if 4 <= m < 8 else 1.0,
    )
    assert [a.machine for a in alerts] == ["pp1"]
    assert alerts[0].evidence["lateness_s"] == pytest.approx(0.2 * 1.4, rel=0.1)
    assert max(x.seconds for x in detector.late_ranks(8)) < 0.015 * 2.0


def test_in_an_asynchronous_job_nobody_waits() -> None:
    alerts, detector, _ = run_job(
        steps=200, sync=False, factor=lambda m, r, s: 1.3 if m == 9 else 1.0
    )
    assert named(alerts) == ["m09"]
    assert detector.late_ranks(10) == []
    assert alerts[0].evidence["lateness_s"] is None


def test_no_lateness_before_any_step() -> None:
    assert StragglerDetector().late_ranks(10) == []


@pytest.mark.parametrize("same_position", [True, False])
@pytest.mark.parametrize("k_median", [1.0, 0.3, 2.5])
def test_the_persistent_test_reads_each_ranks_newest_observations(
    same_position: bool, k_median: float
) -> None:
    """Over the rings, wrapped or not and whether the ranks are at the same position or not, the
    persistent verdict, mean ratio and onset are those of each rank's newest observations."""
    rng = np.random.default_rng(3)
    detector = StragglerDetector()
    cfg = detector.config
    m, d, b = 12, 3, cfg.ring
    detector._grow((m, d))
    ratios = np.where(rng.random((m, d, b)) < 0.1, np.nan, 1 + rng.normal(0.03, 0.05, (m, d, b)))
    detector._ring[:] = ratios
    detector._ring_k[:] = rng.integers(1, 3, (m, d, b))
    detector._ring_tick[:] = rng.integers(0, 10_000, (m, d, b))
    detector._pos[:] = rng.integers(0, b) if same_position else rng.integers(0, b, (m, d))
    detector._k_median = k_median
    persistent, mean, parts = detector._persistent(m, d)
    n_obs = min(b, max(1, math.ceil(cfg.persistent_steps / max(k_median, 1.0))))
    for i in range(m):
        for j in range(d):
            newest = [(int(detector._pos[i, j]) - 1 - age) % b for age in range(n_obs)]
            r = ratios[i, j, newest]
            used = np.isfinite(r)
            k = detector._ring_k[i, j, newest][used]
            want = float((r[used] * k).sum() / k.sum()) if k.sum() else math.nan
            slow = r[used] >= 1 + cfg.persistent_excess / 2
            verdict = (
                k.sum() >= cfg.persistent_steps
                and used.sum() >= 3
                and want >= 1 + cfg.persistent_excess
                and slow.mean() >= cfg.persistent_share
            )
            assert bool(persistent[i, j]) == verdict
            assert mean[i, j] == pytest.approx(1.0 if math.isnan(want) else want, rel=1e-12)
            onset = min(
                (
                    int(s)
                    for s, y in zip(detector._ring_tick[i, j, newest][used], slow, strict=True)
                    if y
                ),
                default=np.iinfo(np.int64).max,
            )
            first = min(
                int(np.where(s[i, j], t[i, j], np.iinfo(np.int64).max).min()) for s, t in parts
            )
            assert first == onset


# --- intermittent stragglers: accumulated excess (see also test_straggler_intermittent.py) ------

BURST = [1.6, 1.7, 1.0, 2.4, 1.3, 1.8, 1.2, 1.7, 1.4, 1.0, 1.9, 1.2, 1.3, 1.5]
"""A real worker's 14 sampled steps: about 1.5x the median, single steps back at 1.0-1.3x."""


@pytest.mark.parametrize(
    ("sync", "busy"),
    [(True, True), (True, False), (False, False)],
    ids=["sync-busy", "sync-collective", "async-step"],
)
def test_a_worker_slow_in_bursts_with_dips_back_to_normal_is_named(sync: bool, busy: bool) -> None:
    onset, base, comm = 100, 1.4, 0.6

    def factor(m: int, r: int, s: int) -> float:
        if (m, r) != (11, 3) or not onset <= s < onset + len(BURST):
            return 1.0
        if sync:
            return BURST[s - onset]
        # Asynchronous: the worker's own step time (busy + communication) is BURST times.
        return (BURST[s - onset] * (base + comm) - comm) / base

    alerts, _, _ = run_job(steps=200, factor=factor, sync=sync, busy=busy, collective=sync)
    assert named(alerts) == ["m11"]
    alert = alerts[0]
    assert alert.devices == ("rank3",)
    ev = alert.evidence
    assert ev["straggler"] == "intermittent" and ev["verdict"] == "worker"
    assert ev["cusum"] >= ev["cusum_threshold"] > 0
    assert ev["episode_ratio"] == pytest.approx(1.5, abs=0.1)
    # Named within its 14 bursty steps: each of them at most 2.4 x 1.4 + 0.6 s in a sync job.
    assert alert.detected_ts <= START + onset * 2.0 + sum(b * base + comm for b in BURST) + 2
    assert alert.first_ts >= START + (onset - 1) * 2.0


def test_a_steady_worker_a_quarter_slower_is_named_before_the_persistent_window() -> None:
    """Above the allowance the sum grows on every step: a steady worker 25 % slower is named
    after about h / (log 1.25 - log 1.15) = 18 steps, by the intermittent rule, with its cost."""
    alerts, detector, true_s = run_job(
        steps=150, factor=lambda m, r, s: 1.25 if (m == 6 and s >= 50) else 1.0
    )
    assert named(alerts) == ["m06"]
    ev = alerts[0].evidence
    assert ev["straggler"] == "intermittent"
    assert 15 <= ev["steps"] <= 25 < detector.config.persistent_steps
    assert ev["episode_ratio"] == pytest.approx(1.25, abs=0.02)
    assert ev["job_slowdown"] == pytest.approx(true_s, rel=0.05)


@pytest.mark.parametrize(
    "blip",
    [[2.0] * 4, [19.0], [19.0, 1.0, 19.0], [2.5, 2.5, 1.0, 1.0, 2.5]],
    ids=["4-steps-2x", "one-19x", "two-19x", "three-2.5x-spread"],
)
def test_short_blips_are_not_named(blip: list[float]) -> None:
    """A burst that loses less than the transient rule's smallest case (10 steps at 1.5x), and
    single steps however slow (below ``max_factor``; they count as 2x at most), are not named."""
    alerts, detector, _ = run_job(
        steps=150,
        factor=lambda m, r, s: (
            blip[s - 80] if (m == 2 and r == 0 and 80 <= s < 80 + len(blip)) else 1.0
        ),
    )
    assert alerts == []
    assert detector.stats.skipped == 0
