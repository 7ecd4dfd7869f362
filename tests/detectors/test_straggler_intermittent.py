"""The straggler detector's intermittent rule (accumulated excess, a one-sided CUSUM of each
rank's log ratio to its reference): a worker that loses the job time in bursts while single steps
dip back to normal is named; ordinary jitter is not; workers a few % slower stay the persistent
rule's, named once; bad step times are skipped, counted, never accumulated; and the rule's
in-control average run length under the noise model of :class:`StragglerConfig`, computed by the
Markov-chain method and checked against the recursion itself."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

from detectors.straggler import (
    MIN_OBSERVATIONS,
    Excess,
    StragglerConfig,
    StragglerDetector,
    accumulate_excess,
    excess_due,
    reset_excess,
)
from detectors.window import JobWindow
from minder.core.alert import Alert

START = 3_000_000
BASE_S = 2.0
"""A balanced step's signal (busy time in a synchronous job, step time in an asynchronous one)."""
COMM_S = 0.6

REAL_BURST = [1.6, 1.7, 1.0, 2.4, 1.3, 1.8, 1.2, 1.7, 1.4, 1.0, 1.9, 1.2, 1.3, 1.5]
"""The real worker's 14 sampled steps (times the median): about 1.5x on average, single steps
back at 1.0x, 1.3x and 1.2x between peaks of 1.7-2.4x."""

Edit = Callable[[int, int, int, dict[str, float]], None]
"""``edit(machine, rank, step, sample)``: change a rank's sample before it is reported."""


def examples(count: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``count`` examples, derandomised (every run checks the same ones), no deadline."""
    return settings(
        max_examples=count,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def feed(
    factors: np.ndarray,
    *,
    sync: bool,
    jitter: float = 0.01,
    seed: int = 0,
    edit: Edit | None = None,
    detector: StragglerDetector | None = None,
) -> tuple[list[Alert], StragglerDetector, np.ndarray]:
    """Run the job whose rank ``(m, r)`` takes ``factors[step, m, r]`` times the balanced signal
    (times lognormal jitter of ``jitter``) through a :class:`JobWindow` and the detector, the way
    the service does: each rank's step reported at the second it ends, the detector evaluated
    each second. Synchronous: busy times, collective times and the common step time (the
    slowest rank's busy time plus communication); asynchronous: each rank's own step time only.
    Returns the alerts, the detector and the second at which each rank ended each step
    (``[step, machine, rank]``)."""
    steps, machines, ranks = factors.shape
    rng = np.random.default_rng(seed)
    signal = BASE_S * factors * np.exp(rng.normal(0.0, jitter, factors.shape))
    window = JobWindow("j", horizon_s=64, tick_s=1)
    detector = detector or StragglerDetector()
    alerts: list[Alert] = []
    clock = np.zeros((machines, ranks))
    pending: dict[int, list[tuple[int, int, dict[str, float]]]] = {}
    ends = np.zeros(factors.shape)
    for s in range(steps):
        work = signal[s]
        if sync:
            took = np.full((machines, ranks), float(work.max()) + COMM_S)
            clock += took
        else:
            took = work
            clock += work
        ends[s] = START + clock
        for m in range(machines):
            for r in range(ranks):
                sample = {"train_step_seconds": float(took[m, r]), "train_step_number": s + 1.0}
                if sync:
                    sample["train_busy_seconds"] = float(work[m, r])
                    sample["nccl_collective_seconds"] = float(took[m, r] - work[m, r])
                if edit is not None:
                    edit(m, r, s, sample)
                sec = START + math.floor(clock[m, r])
                pending.setdefault(sec, []).append((m, r, sample))
        horizon = START + math.floor(clock.min())
        for sec in sorted(k for k in pending if k < horizon):
            for m, r, sample in pending.pop(sec):
                window.add_samples(
                    sec, f"m{m:02d}", [(k, f"rank{r}", v) for k, v in sample.items()]
                )
            alerts += detector.evaluate(window, sec)
    return alerts, detector, ends


def job(steps: int, machines: int, ranks: int = 1) -> np.ndarray:
    """A balanced job's factors (all 1)."""
    return np.ones((steps, machines, ranks))


def named(alerts: list[Alert]) -> list[str]:
    return [a.machine for a in alerts]


# --- the real pattern ---------------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync-busy", "async-step"])
def test_the_real_bursty_worker_is_named_within_its_fourteen_steps(sync: bool) -> None:
    onset, slow = 60, 7
    factors = job(150, 10)
    factors[onset : onset + len(REAL_BURST), slow, 0] = REAL_BURST
    alerts, detector, ends = feed(factors, sync=sync, jitter=0.02, seed=4)
    assert named(alerts) == ["m07"]
    alert = alerts[0]
    ev = alert.evidence
    assert ev["straggler"] == "intermittent" and ev["verdict"] == "worker"
    assert ev["sync"] is sync
    assert alert.metric == ("train_busy_seconds" if sync else "train_step_seconds")
    assert ev["cusum"] >= ev["cusum_threshold"] == detector.config.intermittent_threshold
    assert ev["episode_ratio"] == pytest.approx(1.5, abs=0.12)
    assert 10 <= ev["steps"] <= len(REAL_BURST)
    # Named within the burst (a second of reporting), its onset at the burst's start.
    assert alert.detected_ts <= float(ends[onset + 13, slow, 0]) + 1
    assert alert.first_ts >= float(ends[onset - 2, slow, 0])
    # Its cost (live S, M_W) by the same path as the other rules', over the steps it judged
    # (its latest step is a dip back to 1.0x): the job at about 1.5x of that worker's pace.
    assert ev["ratio"] == ev["episode_ratio"] == alert.score
    # Synchronous: every step waits for its busy time; asynchronous: the job's throughput, one
    # worker of ten at 1/1.5 of the pace.
    sync_s = (1.5 * BASE_S + COMM_S) / (BASE_S + COMM_S)
    true_s = sync_s if sync else 1 / (1 - (1 - 1 / 1.5) / 10)
    assert ev["slowdown"] == pytest.approx(true_s, rel=0.05)
    assert ev["job_slowdown"] == pytest.approx(true_s, rel=0.05)
    assert ev["share"] > 0.7
    assert ev["gpu_hours_lost_per_hour"] == pytest.approx(10 * (1 - 1 / true_s), rel=0.2)


@pytest.mark.parametrize("sync", [True, False], ids=["sync-busy", "async-step"])
def test_the_other_rules_alone_miss_the_real_bursty_worker(sync: bool) -> None:
    """Why the rule exists: with its threshold out of reach nothing names the worker."""
    factors = job(150, 10)
    factors[60 : 60 + len(REAL_BURST), 7, 0] = REAL_BURST
    blind = StragglerDetector(StragglerConfig(intermittent_threshold=1e9))
    alerts, _, _ = feed(factors, sync=sync, jitter=0.02, seed=4, detector=blind)
    assert alerts == []


# --- property-based ------------------------------------------------------------------------------


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, int]:
    """4-64 ranks: machines of 1, 2 or 4 ranks."""
    ranks = draw(st.sampled_from([1, 2, 4]))
    machines = draw(st.integers(min_value=4, max_value=64 // ranks))
    return machines, ranks


@examples(25)
@given(
    shape=shapes(),
    steps=st.integers(min_value=20, max_value=300),
    jitter=st.floats(min_value=0.0, max_value=0.05),
    sync=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_fault_free_jobs_with_ordinary_jitter_raise_nothing(
    shape: tuple[int, int], steps: int, jitter: float, sync: bool, seed: int
) -> None:
    machines, ranks = shape
    alerts, detector, _ = feed(job(steps, machines, ranks), sync=sync, jitter=jitter, seed=seed)
    assert alerts == []
    assert detector.stats.skipped == 0


@st.composite
def bursts(draw: st.DrawFn) -> list[float]:
    """A burst of 12-24 steps averaging 1.4-2x: up to a quarter of its steps dip back to
    1.0-1.3x at random positions, the others are peaks about equal (within 15 %) scaled so the
    burst's mean is exactly the drawn one."""
    n = draw(st.integers(min_value=12, max_value=24))
    mean = draw(st.floats(min_value=1.4, max_value=2.0))
    dips = draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=n // 4))
    dip = {i: draw(st.floats(min_value=1.0, max_value=1.3)) for i in sorted(dips)}
    weights = [draw(st.floats(min_value=0.87, max_value=1.15)) for _ in range(n - len(dip))]
    peak = (mean * n - sum(dip.values())) / sum(weights)
    shape = iter(weights)
    return [dip[i] if i in dip else peak * next(shape) for i in range(n)]


WORST = (1.4 * 12 - 3) / 9
"""The peaks of a 12-step burst averaging 1.4x with a quarter of its steps at 1.0x."""


@examples(25)
@given(
    shape=shapes(),
    burst=bursts(),
    onset=st.integers(min_value=10, max_value=60),
    jitter=st.floats(min_value=0.0, max_value=0.05),
    sync=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**16),
    pick=st.integers(min_value=0, max_value=63),
)
# The boundary cases: 12 steps at 1.4x, a quarter of them at 1.0x opening, closing or spread
# through the burst, at the most jitter, in the smallest and the largest job.
@example((4, 1), [1.0, 1.0, 1.0, *[WORST] * 9], 30, 0.05, True, 1, 2)
@example((16, 4), [*[WORST] * 9, 1.0, 1.0, 1.0], 30, 0.05, False, 2, 9)
@example((16, 4), [WORST, WORST, WORST, 1.0] * 3, 45, 0.05, True, 3, 15)
def test_a_bursty_rank_averaging_at_least_1_4x_over_12_steps_is_named(
    shape: tuple[int, int],
    burst: list[float],
    onset: int,
    jitter: float,
    sync: bool,
    seed: int,
    pick: int,
) -> None:
    machines, ranks = shape
    slow = pick % machines
    note(f"burst mean {np.mean(burst):.3f} over {len(burst)} steps: {np.round(burst, 2)}")
    factors = job(onset + len(burst) + 20, machines, ranks)
    factors[onset : onset + len(burst), slow, 0] = burst
    alerts, _, ends = feed(factors, sync=sync, jitter=jitter, seed=seed)
    assert named(alerts) == [f"m{slow:02d}"]
    alert = alerts[0]
    # By this rule or the transient one (a burst with few dips is a transient straggler too),
    # within two steps of the burst's end (and a second of reporting): the rule judges
    # ``transient_steps`` steps at least, so dips that open the burst delay it a little.
    assert alert.evidence["straggler"] in {"intermittent", "transient"}
    last = onset + len(burst) - 1
    assert alert.detected_ts <= float(ends[last + 2, slow, 0]) + 1
    assert alert.devices == ("rank0",)


# --- persistent workers keep their rule, once ---------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync-busy", "async-step"])
@pytest.mark.parametrize("seed", [1, 2])
def test_workers_6_to_8_percent_slower_are_named_once_each_beside_a_bursty_one(
    sync: bool, seed: int
) -> None:
    steady = {2: 1.06, 5: 1.07, 11: 1.08}
    factors = job(400, 16)
    for m, f in steady.items():
        factors[:, m, 0] = f
    factors[100 : 100 + len(REAL_BURST), 9, 0] = REAL_BURST
    alerts, _, _ = feed(factors, sync=sync, jitter=0.01, seed=seed)
    rules = {a.machine: a.evidence["straggler"] for a in alerts}
    assert sorted(named(alerts)) == ["m02", "m05", "m09", "m11"]  # each exactly once
    assert rules == {
        "m02": "persistent",
        "m05": "persistent",
        "m11": "persistent",
        "m09": "intermittent",
    }


def test_a_rank_that_keeps_bursting_holds_one_alert_and_is_named_again_after_rearming() -> None:
    """Reset on alert: bursts every 40 steps keep the alert (no second one); after the rank has
    been back at the reference for ``rearm_steps`` steps a new series of bursts is named again."""
    cfg = StragglerConfig()
    factors = job(200 + cfg.rearm_steps + 100, 8)
    for start in (30, 70, 110, 150):
        factors[start : start + len(REAL_BURST), 3, 0] = REAL_BURST
    again = 150 + len(REAL_BURST) + cfg.rearm_steps + 20
    factors[again : again + len(REAL_BURST), 3, 0] = REAL_BURST
    alerts, _, ends = feed(factors, sync=True, jitter=0.01)
    assert named(alerts) == ["m03", "m03"]
    assert [a.evidence["straggler"] for a in alerts] == ["intermittent", "intermittent"]
    assert alerts[1].detected_ts > float(ends[again, 3, 0])


def test_a_long_slow_spell_does_not_hold_the_sum_after_the_worker_recovers() -> None:
    """Reset on alert: a worker 25 % slower for 300 steps is named once; its sum restarts at
    each signal instead of growing with the spell, so once it is back at the reference it is
    re-armed after ``rearm_steps`` steps and a later burst is named again."""
    cfg = StragglerConfig()
    factors = job(300 + cfg.rearm_steps + 60, 8)
    factors[:300, 5, 0] = 1.25
    again = 300 + cfg.rearm_steps + 25
    factors[again : again + len(REAL_BURST), 5, 0] = REAL_BURST
    alerts, _, _ = feed(factors, sync=True, jitter=0.01)
    assert named(alerts) == ["m05", "m05"]
    assert alerts[0].evidence["straggler"] == "intermittent"
    assert alerts[1].evidence["steps"] <= len(REAL_BURST)


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync-busy", "async-step"])
def test_bad_step_times_are_skipped_counted_and_never_accumulated(sync: bool) -> None:
    """Rank 0 of m04 reports bad steps (zero, negative, NaN, infinite, 1000x: its step and busy
    times) in place of a burst and between its normal steps: each is counted as skipped and adds
    nothing to its sum."""
    bad_values = [0.0, -1.0, math.nan, math.inf, 1000 * BASE_S]
    bad_steps = set(range(40, 60)) | set(range(80, 200, 3))
    sums: list[float] = []

    def edit(m: int, r: int, s: int, sample: dict[str, float]) -> None:
        if m == 4 and s in bad_steps:
            for key in ("train_step_seconds", "train_busy_seconds"):
                if key in sample:
                    sample[key] = bad_values[s % len(bad_values)]

    class Watching(StragglerDetector):
        def evaluate(self, window: JobWindow, now: int) -> list[Alert]:
            out = super().evaluate(window, now)
            if self._excess.total.shape[0] > 4:
                sums.append(float(self._excess.total[4, 0]))
            return out

    alerts, detector, _ = feed(job(200, 8), sync=sync, jitter=0.005, edit=edit, detector=Watching())
    assert alerts == []
    assert detector.stats.skipped == len(bad_steps)
    assert sums and max(sums) == 0.0


def test_a_nan_ratio_leaves_a_ranks_sum_as_it_was() -> None:
    cfg = StragglerConfig()
    excess = Excess.zeros((1, 3))
    for _ in range(3):
        accumulate_excess(excess, np.array([[1.8, 1.8, 1.8]]), np.ones((1, 3)), cfg)
    before = (excess.total.copy(), excess.steps.copy(), excess.above.copy())
    accumulate_excess(excess, np.array([[math.nan, 1.0, 5.0]]), np.ones((1, 3)), cfg)
    assert excess.total[0, 0] == before[0][0, 0] and excess.steps[0, 0] == before[1][0, 0]
    assert excess.above[0, 0] == before[2][0, 0]
    # A normal step pays the allowance back; a 5x one counts as twice the reference at most.
    k, cap = math.log1p(cfg.intermittent_allowance), math.log(cfg.intermittent_clip)
    assert excess.total[0, 1] == pytest.approx(before[0][0, 1] - k)
    assert excess.total[0, 2] == pytest.approx(before[0][0, 2] + cap - k)


# --- the rule itself ------------------------------------------------------------------------------


@given(
    ratios=st.lists(st.floats(min_value=0.01, max_value=19.0), min_size=1, max_size=40),
    position=st.integers(min_value=0, max_value=39),
    spike=st.floats(min_value=1.0, max_value=1e6),
    clip=st.sampled_from([StragglerConfig().intermittent_clip, 20.0]),
)
@settings(deadline=None, derandomize=True, database=None)
def test_one_step_never_alerts_however_slow(
    ratios: list[float], position: int, spike: float, clip: float
) -> None:
    """Whatever came before (at the reference or below, so nothing is accumulated), one step of
    any length followed by steps back at the reference never makes the rule fire: the clip
    keeps it under the threshold, and, were the clip as wide as ``max_factor``, the rule still
    needs ``MIN_OBSERVATIONS`` observations above the allowance."""
    cfg = StragglerConfig(intermittent_clip=clip)
    excess = Excess.zeros((1, 1))
    sequence = [min(r, 1.0) for r in ratios]
    sequence.insert(min(position, len(sequence)), spike)
    sequence += [1.0] * 30
    for r in sequence:
        accumulate_excess(excess, np.array([[r]]), np.ones((1, 1)), cfg)
        assert not excess_due(excess, cfg).any()
        assert excess.above[0, 0] <= 1


def test_a_burst_is_named_when_it_loses_what_the_transient_rules_smallest_case_loses() -> None:
    """Five steps at 2x (as much lost time as ten at 1.5x) are named, four are not; and every
    case needs ``transient_steps`` steps of accumulation, the transient rule's horizon."""
    cfg = StragglerConfig()

    def fired(burst: list[float]) -> int | None:
        excess = Excess.zeros((1, 1))
        for i, r in enumerate([*burst, *([1.0] * 30)]):
            accumulate_excess(excess, np.array([[r]]), np.ones((1, 1)), cfg)
            if excess_due(excess, cfg).any():
                return i + 1
        return None

    assert fired([2.0] * 5) == cfg.transient_steps
    assert fired([2.0] * 4) is None
    assert fired([1.5] * 10) == cfg.transient_steps
    assert fired([1.14] * 500) is None  # within the allowance: never


def test_an_observation_covering_many_steps_counts_once() -> None:
    """A scrape every minute of a job stepping every second reads one step's time: its excess
    counts once, not 60 times (one 2x hiccup would otherwise name a straggler), while the steps
    the accumulation spans are counted."""
    cfg = StragglerConfig()
    one, many = Excess.zeros((1, 1)), Excess.zeros((1, 1))
    accumulate_excess(one, np.array([[2.0]]), np.array([[1.0]]), cfg)
    accumulate_excess(many, np.array([[2.0]]), np.array([[60.0]]), cfg)
    assert (
        many.total[0, 0]
        == pytest.approx(one.total[0, 0])
        == pytest.approx(math.log(2.0) - math.log(1.15))
    )
    assert many.steps[0, 0] == 60 and one.steps[0, 0] == 1
    assert many.above[0, 0] == one.above[0, 0] == 1 < MIN_OBSERVATIONS


def test_one_hiccup_per_minute_scrape_never_names_a_straggler() -> None:
    """60 steps per observation, single 2x hiccups on 1 % of the observed steps, a thousand
    ranks for 200 scrapes (200,000 observations). Weighted by the steps it covered, one hiccup
    alone crossed h: hundreds were due. Counted once, the rate is the in-control one of a step
    per observation (one in about 10^6): at most one."""
    cfg = StragglerConfig()
    rng = np.random.default_rng(5)
    excess = Excess.zeros((1000, 1))
    due = 0
    for _ in range(200):
        ratio = np.exp(rng.normal(0, 0.05, size=(1000, 1)))
        ratio[rng.random((1000, 1)) < 0.01] = 2.0
        accumulate_excess(excess, ratio, np.full((1000, 1), 60.0), cfg)
        fired = excess_due(excess, cfg)
        due += int(fired.sum())
        reset_excess(excess, fired)
    assert due <= 1


@pytest.mark.parametrize(
    ("name", "build"),
    [
        ("intermittent_allowance", lambda: StragglerConfig(intermittent_allowance=0.0)),
        ("intermittent_threshold", lambda: StragglerConfig(intermittent_threshold=-1.0)),
        ("intermittent_threshold", lambda: StragglerConfig(intermittent_threshold=math.nan)),
        ("intermittent_clip", lambda: StragglerConfig(intermittent_clip=1.1)),
    ],
)
def test_bad_intermittent_parameters_are_named(
    name: str, build: Callable[[], StragglerConfig]
) -> None:
    with pytest.raises(ValueError, match=f"{name}=.*expected"):
        build()


# --- in-control average run length ----------------------------------------------------------------


def t3_cdf(x: np.ndarray, sd: float) -> np.ndarray:
    """CDF of a Student-t with 3 degrees of freedom scaled to standard deviation ``sd``."""
    z = np.asarray(x) / (sd / math.sqrt(3.0)) / math.sqrt(3.0)
    return np.asarray(0.5 + (z / (1 + z * z) + np.arctan(z)) / math.pi)


def noise_cdf(sd: float, hiccups: float) -> Callable[[np.ndarray], np.ndarray]:
    """CDF of a rank's log ratio under the noise model of :class:`StragglerConfig`: t3 jitter of
    ``sd``, and on a share ``hiccups`` of the steps a single-step hiccup of 1.2-2.5x."""
    slows = np.log(np.linspace(1.2, 2.5, 64))

    def cdf(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        plain = t3_cdf(x, sd)
        if not hiccups:
            return plain
        slowed = t3_cdf(x[..., None] - slows, sd).mean(axis=-1)
        return np.asarray((1 - hiccups) * plain + hiccups * slowed)

    return cdf


def sample_noise(
    rng: np.random.Generator, shape: tuple[int, ...], sd: float, hiccups: float
) -> np.ndarray:
    """Ratios to the reference drawn from the noise model (see :func:`noise_cdf`)."""
    log = rng.standard_t(3, shape) * sd / math.sqrt(3.0)
    slowed = rng.random(shape) < hiccups
    log += np.where(slowed, np.log(rng.uniform(1.2, 2.5, shape)), 0.0)
    return np.exp(log)


def cusum_arl(
    cfg: StragglerConfig, cdf: Callable[[np.ndarray], np.ndarray], cells: int = 200
) -> float:
    """Average run length (observations of one step each) of the sum alone, from 0 to the
    threshold, by the Markov-chain method (Brook and Evans, 1972): the sum's range cut in
    ``cells`` states, the first the atom at 0. The count and span guards only lengthen it, so
    this is a lower bound of the rule's."""
    h = cfg.intermittent_threshold
    k = math.log1p(cfg.intermittent_allowance)
    cap = math.log(cfg.intermittent_clip)
    width = h / cells
    level = (np.arange(cells) + 0.5) * width
    level[0] = 0.0
    edges = np.arange(1, cells + 1) * width
    # P(next sum < edge | sum): next = max(0, sum + min(r, cap) - k) < edge <=> r < edge - sum + k
    bound = edges[None, :] - level[:, None] + k
    below = np.where(bound > cap, 1.0, cdf(bound))
    moves = np.diff(np.concatenate([np.zeros((cells, 1)), below], axis=1), axis=1)
    return float(np.linalg.solve(np.eye(cells) - moves, np.ones(cells))[0])


def test_the_in_control_run_length_under_ordinary_jitter_is_long() -> None:
    """The figures of :class:`StragglerConfig`'s docstring: far beyond 100,000 rank-steps per
    false alarm under ordinary jitter, with hiccups, and at more than twice the jitter."""
    cfg = StragglerConfig()
    assert cusum_arl(cfg, noise_cdf(0.05, 0.0)) > 1e10
    assert cusum_arl(cfg, noise_cdf(0.05, 0.01)) > 1e6
    assert cusum_arl(cfg, noise_cdf(0.12, 0.0)) > 1e7
    # Two thirds of the threshold would not be, with hiccups: the test can tell.
    assert cusum_arl(replace(cfg, intermittent_threshold=1.0), noise_cdf(0.05, 0.01)) < 1e5


def test_the_run_length_calculation_matches_the_rules_own_recursion() -> None:
    """Where false alarms are frequent enough to count (hiccups on 5 % of the steps), the
    Markov chain's run length agrees with the run length of :func:`accumulate_excess` itself
    (reset when the sum reaches the threshold), and the rule's guards lengthen it."""
    cfg = StragglerConfig()
    predicted = cusum_arl(cfg, noise_cdf(0.05, 0.05))
    rng = np.random.default_rng(11)
    ranks, steps = 2000, 1500
    plain, guarded = Excess.zeros((1, ranks)), Excess.zeros((1, ranks))
    alarms = guarded_alarms = 0
    ones = np.ones((1, ranks))
    for _ in range(steps):
        ratio = sample_noise(rng, (1, ranks), 0.05, 0.05)
        accumulate_excess(plain, ratio, ones, cfg)
        signal = plain.total >= cfg.intermittent_threshold
        alarms += int(signal.sum())
        reset_excess(plain, signal)
        accumulate_excess(guarded, ratio, ones, cfg)
        due = excess_due(guarded, cfg)
        guarded_alarms += int(due.sum())
        reset_excess(guarded, due)
    measured = ranks * steps / max(alarms, 1)
    assert alarms >= 50, "too few alarms to measure the run length"
    assert measured == pytest.approx(predicted, rel=0.25)
    assert guarded_alarms <= alarms
