"""Live hang detection (detectors/hang_watch.py): a job whose ranks all stop stepping while its
machines report, within the bound at every sampling interval; what is not a hang (the end of a
job, its first steps, a reported pause); episodes; and the flight-recorder summaries that arrive
in node batches."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from detectors.base import CompositeDetector
from detectors.hang_watch import HangConfig, HangDetector
from detectors.hangs import analyze
from detectors.methods import default_factory
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.hang import (
    CulpritReason,
    EntryState,
    FrEntry,
    GroupState,
    HangAnalysis,
    RankSummary,
    rank_runs,
)
from minder.core.records import Event, EventKind, NodeBatch

START = 1_700_000_000
INTERVALS = (1, 5, 15, 30, 60)


@dataclass
class Job:
    """A synchronous training job as its node agents report it.

    Every ``step_s`` seconds each rank completes a step (numbered from 1), until ``hang_at``;
    ``resume_at`` it steps again, until ``hang2_at``. Machine ``m`` reports every ``interval``
    seconds (at its own phase): for each rank, the step time and last step number when the rank
    stepped since its previous report (the agent's ProbeSource), or always (``held``: a
    Prometheus scrape of the agent's gauges); a host metric always.
    """

    machines: int = 4
    ranks: int = 2
    interval: int = 1
    step_s: float = 2.0
    seconds: int = 400
    hang_at: float | None = 200.0
    resume_at: float | None = None
    hang2_at: float | None = None
    behind: set[int] = field(default_factory=set)
    """Global ranks that stop one step before the others."""
    pause: tuple[float, float] | None = None
    """(start, end) of a pause every rank reports (the hang clock stops)."""
    pause_ranks: set[int] | None = None
    leave_at: float | None = None
    """The machines say goodbye then (the job ended)."""
    silent_at: float | None = None
    """The machines stop reporting then."""
    held: bool = False
    phases: Sequence[int] | None = None
    names: Sequence[str] | None = None
    shift: int = 0
    flight: dict[int, list[RankSummary]] = field(default_factory=dict)
    """Second (relative) -> summaries sent with the batches of that second (machine of rank)."""

    def name(self, m: int) -> str:
        return self.names[m] if self.names is not None else f"node-{m:02d}"

    def steps_done(self, t: float, rank: int) -> int:
        """Steps the rank completed by time ``t`` (relative)."""
        windows = [(0.0, self.hang_at)]
        if self.resume_at is not None:
            windows.append((self.resume_at, self.hang2_at))
        done = _steps_in(windows, self.step_s, t)
        if rank in self.behind and self.hang_at is not None and t >= self.hang_at:
            done = max(0, done - 1)
        return done

    def batches(self) -> dict[int, list[NodeBatch]]:
        """Absolute second -> the batches of that second."""
        out: dict[int, list[NodeBatch]] = {}
        phases = self.phases or [m % self.interval for m in range(self.machines)]
        last_done: dict[int, int] = {}
        last_pause: dict[int, bool] = {}
        for m in range(self.machines):
            for t in range(phases[m], self.seconds, self.interval):
                if self.silent_at is not None and t >= self.silent_at:
                    break
                samples: list[tuple[str, str, float]] = [("cpu_util_ratio", "", 0.5)]
                for r in range(m * self.ranks, (m + 1) * self.ranks):
                    dev = f"rank{r}"
                    done = self.steps_done(t, r)
                    if done and (self.held or done != last_done.get(r, 0)):
                        samples.append(("train_step_seconds", dev, self.step_s))
                        samples.append(("train_step_number", dev, float(done)))
                    last_done[r] = done
                    paused = self.pause is not None and self.pause[0] <= t < self.pause[1]
                    if self.pause_ranks is not None and r not in self.pause_ranks:
                        paused = False
                    if paused:
                        samples.append(("train_paused_seconds", dev, t - self.pause[0] + 0.5))  # type: ignore[index]
                    elif last_pause.get(r):
                        samples.append(("train_paused_seconds", dev, 0.0))
                    last_pause[r] = paused
                events = []
                leaving = self.leave_at is not None and t >= self.leave_at
                if leaving:
                    events = [
                        Event(EventKind.LEAVE, "", float(START + self.shift + t), message="done")
                    ]
                flight = [s for s in self.flight.get(t, []) if s.rank // self.ranks == m]
                sec = START + self.shift + t
                out.setdefault(sec, []).append(
                    NodeBatch(
                        job="job",
                        node=self.name(m),
                        ts=float(sec),
                        samples=[] if leaving else samples,
                        events=events,
                        flight_recorder=flight,
                    )
                )
                if leaving:
                    break
        return out

    def last_step_report(self, before: float | None = None) -> int:
        """Absolute second of the report that carried the job's last step before ``before``."""
        phases = self.phases or [m % self.interval for m in range(self.machines)]
        best = -1
        for m in range(self.machines):
            prev = 0
            for t in range(phases[m], self.seconds, self.interval):
                if before is not None and t >= before + self.interval:
                    break
                top = max(
                    self.steps_done(t, r) for r in range(m * self.ranks, (m + 1) * self.ranks)
                )
                if top != prev:
                    best = max(best, t)
                prev = top
        return START + self.shift + best


def run(
    job: Job,
    detector: Any | None = None,
    *,
    lag: int = 0,
    order: Callable[[list[NodeBatch]], list[NodeBatch]] | None = None,
) -> tuple[list[Alert], Any, JobWindow]:
    """Feed the job's batches second by second; evaluate ``lag`` seconds behind the data."""
    detector = detector or HangDetector(analyze=_no_analysis)
    window = JobWindow("job", horizon_s=64)
    batches = job.batches()
    alerts: list[Alert] = []
    first = START + job.shift
    for sec in range(first, first + job.seconds + lag + 1):
        todo = batches.get(sec, [])
        if order is not None:
            todo = order(todo)
        if todo:
            window.add_batches(todo)
        if sec - lag >= first:
            alerts.extend(detector.evaluate(window, sec - lag))
    return alerts, detector, window


def _no_analysis(
    summaries: Sequence[RankSummary], machines: Any = None, *, now: float = 0.0
) -> HangAnalysis:
    raise AssertionError("no flight-recorder summaries were sent: nothing to analyse")


def job_alerts(alerts: list[Alert]) -> list[Alert]:
    return [a for a in alerts if a.kind is AlertKind.HANG and a.machine == ""]


def machine_alerts(alerts: list[Alert]) -> list[Alert]:
    return [a for a in alerts if a.kind is AlertKind.HANG and a.machine != ""]


# -- live hangs ---------------------------------------------------------------------------


@pytest.mark.parametrize("interval", INTERVALS)
def test_healthy_job_raises_nothing(interval: int) -> None:
    alerts, detector, _ = run(Job(interval=interval, hang_at=None, seconds=500))
    assert alerts == []
    assert detector.hang_analysis() is None


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("step_s", [0.5, 2.0, 9.0, 18.0])
@pytest.mark.parametrize("lag", [0, 2])
def test_hang_fires_once_within_the_bound(interval: int, step_s: float, lag: int) -> None:
    job = Job(interval=interval, step_s=step_s, hang_at=240.0, seconds=500)
    alerts, detector, _ = run(job, lag=lag)
    found = job_alerts(alerts)
    assert len(found) == 1, alerts
    alert = found[0]
    ev = alert.evidence
    last = job.last_step_report()
    assert ev["source"] == "steps"
    assert ev["last_step_ts"] == last
    assert alert.first_ts == last
    latency = alert.detected_ts - last
    bound = min(max(3 * step_s, 30.0), 60.0)
    assert ev["bound_s"] == pytest.approx(bound)
    # A hang is seen at the first report without progress: at a coarse interval no sooner.
    assert ev["threshold_s"] <= latency <= max(bound, interval) <= 60
    assert ev["stalled_s"] >= ev["threshold_s"]
    assert ev["last_step"] == job.steps_done(job.hang_at, 0)  # type: ignore[arg-type]
    assert ev["ranks"] == job.machines * job.ranks
    # Everyone stopped at the same step: nobody is named, and the evidence says so.
    assert ev["stopped_first"] == [] and ev["same_step"] is True
    assert machine_alerts(alerts) == []
    analysis = detector.hang_analysis()
    assert analysis is not None and analysis.hung and analysis.culprits == ()


@pytest.mark.parametrize("interval", [15, 60])
def test_hang_seen_through_held_gauges(interval: int) -> None:
    """A Prometheus scrape of the agent's gauges repeats the last step number: unchanged."""
    job = Job(interval=interval, step_s=2.0, hang_at=240.0, seconds=500, held=True)
    alerts, _, _ = run(job)
    (alert,) = job_alerts(alerts)
    assert alert.detected_ts - job.last_step_report() <= 60


@pytest.mark.parametrize("interval", INTERVALS)
def test_rank_a_step_behind_is_named_with_its_machine(interval: int) -> None:
    job = Job(interval=interval, machines=5, ranks=2, step_s=3.0, hang_at=240.0, seconds=500)
    job.behind = {7}  # machine 3's second rank
    alerts, detector, _ = run(job)
    (alert,) = job_alerts(alerts)
    ev = alert.evidence
    assert ev["stopped_first_ranks"] == [7]
    assert ev["stopped_first_machines"] == ["node-03"]
    assert ev["stopped_first_by"] == "behind" and ev["same_step"] is False
    assert ev["stopped_first"][0]["last_step"] == ev["last_step"] - 1
    (culprit,) = machine_alerts(alerts)
    assert culprit.machine == "node-03"
    assert culprit.first_ts == alert.first_ts and culprit.score == 1.0
    assert culprit.evidence["culprit_ranks"] == [7]
    assert culprit.evidence["reason"] == "stopped_first"
    assert culprit.evidence["job_alert"] == alert.id
    assert culprit.devices == ("rank7",)
    analysis = detector.hang_analysis()
    assert analysis is not None and analysis.hung
    assert [(c.rank, c.machine, c.reason) for c in analysis.culprits] == [
        (7, "node-03", CulpritReason.STOPPED_FIRST)
    ]


@pytest.mark.parametrize("interval", INTERVALS)
def test_checkpoint_pause_is_not_a_hang(interval: int) -> None:
    """Every rank stops for three minutes, saying it is paused: no alert; stepping resumes."""
    job = Job(interval=interval, hang_at=200.0, resume_at=380.0, seconds=600, pause=(200.0, 380.0))
    alerts, _, _ = run(job)
    assert alerts == []


def test_pause_reported_by_one_rank_is_enough() -> None:
    """Rank 0 writes the checkpoint while the others wait for it in a barrier."""
    job = Job(hang_at=200.0, resume_at=380.0, seconds=600, pause=(200.0, 380.0), pause_ranks={0})
    alerts, _, _ = run(job)
    assert alerts == []


@pytest.mark.parametrize("interval", [1, 15])
def test_stall_after_a_pause_ends_is_a_hang_counted_from_its_end(interval: int) -> None:
    job = Job(interval=interval, hang_at=200.0, seconds=600, pause=(200.0, 300.0))
    alerts, _, _ = run(job)
    (alert,) = job_alerts(alerts)
    end = alert.evidence["paused_until_ts"]
    assert end >= START + 300 - interval
    assert alert.first_ts == end
    assert alert.evidence["threshold_s"] <= alert.detected_ts - end <= 60


def test_a_pause_that_never_ends_hides_a_hang_only_for_max_pause() -> None:
    cfg = HangConfig(max_pause_s=120.0)
    job = Job(hang_at=200.0, seconds=600, pause=(200.0, 10_000.0))
    alerts, _, _ = run(job, HangDetector(cfg, analyze=_no_analysis))
    (alert,) = job_alerts(alerts)
    last = job.last_step_report()
    assert alert.first_ts == last + 120
    assert alert.detected_ts - (last + 120) <= 30


@pytest.mark.parametrize("interval", INTERVALS)
def test_job_that_ends_is_not_a_hang(interval: int) -> None:
    """Steps stop and the machines say goodbye a few seconds later."""
    job = Job(interval=interval, hang_at=200.0, leave_at=200.0 + interval, seconds=500)
    alerts, _, window = run(job)
    assert alerts == []
    assert not window.active().any()


@pytest.mark.parametrize("interval", [1, 15, 60])
def test_job_that_stops_reporting_is_silence_not_a_hang(interval: int) -> None:
    job = Job(interval=interval, hang_at=200.0, silent_at=201.0, seconds=500)
    alerts, _, _ = run(job)
    assert alerts == []


@pytest.mark.parametrize("interval", [1, 60])
def test_job_before_its_first_steps_is_not_a_hang(interval: int) -> None:
    """Machines report for minutes before the first step (loading, compiling), then one or two
    steps and a long compile of the next."""
    job = Job(interval=interval, hang_at=None, seconds=500)
    job.steps_done = lambda t, rank: 0 if t < 300 else (1 if t < 470 else 2)  # type: ignore[method-assign]
    alerts, _, _ = run(job)
    assert alerts == []


@pytest.mark.parametrize("interval", INTERVALS)
def test_resumed_job_then_second_hang_two_alerts(interval: int) -> None:
    job = Job(
        interval=interval, hang_at=150.0, resume_at=300.0, hang2_at=500.0, seconds=700, step_s=2.0
    )
    alerts, detector, _ = run(job)  # learning own pauses is off by default
    first, second = job_alerts(alerts)
    assert first.id != second.id
    assert first.first_ts == job.last_step_report(before=150.0)
    assert second.first_ts == job.last_step_report()
    assert second.detected_ts - second.first_ts <= 60
    assert first.detected_ts < START + 300 < second.first_ts
    analysis = detector.hang_analysis()
    assert analysis is not None and analysis.hung


def _steps_in(periods: Sequence[tuple[float, float | None]], step_s: float, t: float) -> int:
    """Steps completed by time ``t`` (relative) by a job that steps in ``periods`` (end None:
    to the end) only."""
    out = 0
    for begin, end in periods:
        if t < begin:
            break
        stop = t if end is None else min(t, end)
        out += math.floor((stop - begin) / step_s + 1e-9)
    return out


def _stepping(periods: Sequence[tuple[float, float | None]], step_s: float) -> Callable[..., int]:
    """``steps_done`` of a job that steps in ``periods`` only."""
    return lambda t, rank: _steps_in(periods, step_s, t)


def _learning() -> HangDetector:
    return HangDetector(HangConfig(own_pause_factor=1.5), analyze=_no_analysis)


CHECKPOINTS = [(0.0, 200.0), (250.0, 500.0), (550.0, 800.0)]
"""A job that stops 50 s for a checkpoint every 300 s without saying so, then hangs at 800."""


@pytest.mark.parametrize("interval", [1, 15])
def test_by_default_every_unreported_checkpoint_past_the_bound_pages(interval: int) -> None:
    """The bound holds whatever the job did before: both checkpoints and the hang alert."""
    job = Job(interval=interval, hang_at=None, seconds=1000)
    job.steps_done = _stepping(CHECKPOINTS, job.step_s)  # type: ignore[method-assign]
    alerts, _, _ = run(job)
    first, second, hang = job_alerts(alerts)
    assert first.first_ts < START + 250 < second.first_ts < START + 550 < START + 800
    assert hang.evidence["own_pause_s"] is None
    assert hang.detected_ts - job.last_step_report() <= 30


@pytest.mark.parametrize("interval", [1, 5, 15])
def test_unreported_checkpoints_page_once_and_a_later_hang_is_still_found(interval: int) -> None:
    """Learning on: the first stop raises one alert (nothing could tell it from a hang); it
    ends by itself, no rank first, so the next one raises nothing; a real hang later is alerted
    at 1.5x the longest such stop, never past 60 s after its last step."""
    job = Job(interval=interval, hang_at=None, seconds=1000)
    job.steps_done = _stepping(CHECKPOINTS, job.step_s)  # type: ignore[method-assign]
    alerts, _, _ = run(job, _learning())
    first, hang = job_alerts(alerts)
    assert machine_alerts(alerts) == []
    assert first.first_ts < START + 250 < START + 800 <= hang.detected_ts
    learnt = hang.evidence["own_pause_s"]
    # The longest stall the reports could show: at least what the first alert saw.
    assert first.evidence["stalled_s"] <= learnt <= 50 + job.step_s
    assert hang.evidence["threshold_s"] == pytest.approx(min(1.5 * learnt, 60 - interval + 1))
    assert hang.detected_ts - job.last_step_report() <= 60
    assert first.evidence["own_pause_s"] is None


def test_a_reported_pause_is_not_learnt_as_the_jobs_own() -> None:
    """A checkpoint reported for 300 s, then 30 s more without a report: only the 30 s is the
    job's own pause, and a later hang is alerted at 1.5 times it, not 1.5 times 330 s."""
    job = Job(hang_at=200.0, pause=(200.0, 500.0), resume_at=530.0, hang2_at=800.0, seconds=1000)
    alerts, _, _ = run(job, _learning())
    first, second = job_alerts(alerts)
    assert first.first_ts >= START + 499
    learnt = second.evidence["own_pause_s"]
    assert 29 <= learnt <= 30 + job.step_s
    assert second.detected_ts - job.last_step_report() <= 1.5 * learnt + 1


def test_a_long_stall_that_ends_by_itself_holds_a_later_hang_no_longer_than_the_cap() -> None:
    """400 s without a step, then the job steps on: a later hang is alerted within 60 s."""
    job = Job(hang_at=150.0, resume_at=550.0, hang2_at=800.0, seconds=1000)
    alerts, _, _ = run(job, _learning())
    _, second = job_alerts(alerts)
    assert second.evidence["own_pause_s"] > 300
    assert second.evidence["threshold_s"] == 60
    assert second.detected_ts - job.last_step_report() <= 60


def test_a_rank_that_stops_first_is_alerted_within_the_bound_after_learnt_pauses() -> None:
    """The job has shown 50 s checkpoints; then rank 3 stops one step before the others: no
    pause of the job's own, alerted within the 30 s bound, naming rank 3."""
    job = Job(hang_at=None, seconds=1000)
    steps = _stepping(CHECKPOINTS, job.step_s)
    job.steps_done = lambda t, rank: steps(t, rank) - (rank == 3 and t >= 800)  # type: ignore[method-assign]
    alerts, _, _ = run(job, _learning())
    _, hang = job_alerts(alerts)
    assert hang.evidence["own_pause_s"] is not None
    assert hang.evidence["stopped_first_ranks"] == [3]
    assert hang.detected_ts - job.last_step_report() <= 30
    assert [a.machine for a in machine_alerts(alerts)] == ["node-01"]


def test_a_stall_with_a_rank_behind_that_resumes_is_not_learnt() -> None:
    """A rank stopped first: that stall was no pause of the job's own, and the next hang is
    alerted within the bound."""
    job = Job(hang_at=150.0, resume_at=300.0, hang2_at=500.0, seconds=700, behind={3})
    alerts, _, _ = run(job, _learning())
    first, second = job_alerts(alerts)
    assert first.evidence["stopped_first_ranks"] == [3]
    assert second.evidence["own_pause_s"] is None
    assert second.detected_ts - second.first_ts <= 60


def test_hang_over_publishes_a_not_hung_analysis() -> None:
    job = Job(hang_at=150.0, resume_at=300.0, seconds=400)
    alerts, detector, _ = run(job)
    assert len(job_alerts(alerts)) == 1
    analysis = detector.hang_analysis()
    assert analysis is not None and not analysis.hung
    assert "over" in analysis.notes[0]


def test_bound_never_under_two_steps_for_slow_jobs() -> None:
    cfg = HangConfig()
    assert cfg.bound_s(1.0) == 30.0
    assert cfg.bound_s(15.0) == 45.0
    assert cfg.bound_s(25.0) == 60.0
    assert cfg.bound_s(40.0) == 80.0
    assert cfg.bound_s(math.nan) == 30.0
    job = Job(step_s=40.0, hang_at=None, seconds=600)
    assert run(job)[0] == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cap_s": 0.0}, "cap_s is 0.0"),
        ({"floor_s": 90.0}, "expected floor <= cap"),
        ({"max_pause_s": -1.0}, "max_pause_s is -1.0"),
        ({"min_advances": 0}, "min_advances is 0"),
        ({"own_pause_factor": 0.5}, "own_pause_factor is 0.5"),
        ({"min_alive_share": 0.0}, "min_alive_share is 0.0"),
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HangConfig(**kwargs)


def test_default_factory_runs_the_hang_detector_beside_the_others() -> None:
    detector = default_factory()()
    assert isinstance(detector, CompositeDetector)
    assert any(isinstance(p, HangDetector) for p in detector.parts)
    job = Job(machines=4, ranks=2, interval=1, step_s=2.0, hang_at=200.0, seconds=300)
    job.behind = {5}
    alerts, composite, _ = run(job, detector)
    hangs = [a for a in alerts if a.kind is AlertKind.HANG]
    assert {a.machine for a in hangs} == {"", "node-02"}
    # Only the hang detector speaks of it: no similarity alert on the paused/step metrics.
    assert all(a.metric not in {"train_paused_seconds", "train_step_number"} for a in alerts)
    analysis = composite.hang_analysis()
    assert analysis is not None and analysis.culprit_ranks == [5]


def test_one_rank_paused_alone_raises_nothing_in_the_default_engine() -> None:
    job = Job(hang_at=120.0, resume_at=260.0, seconds=320, pause=(120.0, 260.0), pause_ranks={0})
    alerts, _, _ = run(job, default_factory()())
    assert alerts == []


# -- flight recorder ----------------------------------------------------------------------


def summary(rank: int, world: int, *, completed: int, enqueued: int, dumped: float) -> RankSummary:
    entries: tuple[FrEntry, ...] = (
        FrEntry(
            record_id=completed, seq=completed, op="nccl:all_reduce", state=EntryState.COMPLETED
        ),
    )
    if enqueued > completed:
        entries += (
            FrEntry(
                record_id=enqueued, seq=enqueued, op="nccl:all_reduce", state=EntryState.STARTED
            ),
        )
    group = GroupState(
        group="0",
        desc="default_pg",
        ranks=rank_runs(list(range(world))),
        last_enqueued=enqueued,
        last_started=enqueued,
        last_completed=completed,
        entries=entries,
    )
    return RankSummary(
        rank=rank, version="2.10", groups=(group,), dumped_ts=dumped, source=f"d{rank}"
    )


class Recording:
    """The real analysis (:func:`detectors.hangs.analyze`), recording its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[RankSummary], dict[int, str], float]] = []

    def __call__(
        self, summaries: Sequence[RankSummary], machines: Any = None, *, now: float = 0.0
    ) -> HangAnalysis:
        self.calls.append((list(summaries), dict(machines or {}), now))
        return analyze(summaries, machines, now=now)


def test_summaries_arriving_in_batches_raise_the_analysis_alerts() -> None:
    job = Job(machines=4, ranks=2, step_s=2.0, hang_at=200.0, seconds=400)
    world = 8
    dumped = START + 250.0
    # Rank 5 never enqueued seq 42; its dump comes a few seconds after the others'. Rank 6's
    # dump never comes: its machine is known from the step probe.
    sent = {
        r: summary(r, world, completed=41, enqueued=41 if r == 5 else 42, dumped=dumped)
        for r in range(world)
    }
    job.flight = {251: [sent[r] for r in (0, 1, 2, 3)], 253: [sent[4], sent[7]], 255: [sent[5]]}
    analyze = Recording()
    alerts, detector, _ = run(job, HangDetector(analyze=analyze))
    assert len(analyze.calls) == 1  # once settled, not once per batch
    summaries, machines, now = analyze.calls[0]
    assert sorted(s.rank for s in summaries) == [0, 1, 2, 3, 4, 5, 7]
    assert all(s.node == f"node-{s.rank // 2:02d}" for s in summaries)  # the batch's node
    assert machines[6] == "node-03"  # from the probe's rank6 device
    assert now == START + 255 + HangConfig().settle_s  # settled: no new summary since
    live, recorded = job_alerts(alerts)
    assert live.evidence["source"] == "steps"
    assert recorded.evidence["source"] == "flight_recorder" and recorded.score == 2.0
    assert recorded.id == live.id and recorded.first_ts == live.first_ts
    assert recorded.evidence["analysis"]["culprit_ranks"] == [5, 6]
    assert recorded.evidence["live"]["last_step_ts"] == live.evidence["last_step_ts"]
    per_machine = {a.machine: a for a in machine_alerts(alerts)}
    assert set(per_machine) == {"node-02", "node-03"}
    assert per_machine["node-02"].evidence["culprit_ranks"] == [5]
    assert per_machine["node-02"].evidence["reason"] == "not_joined"
    assert per_machine["node-02"].evidence["seq"] == 42
    assert per_machine["node-03"].evidence["culprit_ranks"] == [6]
    assert per_machine["node-03"].evidence["reason"] == "no_dump"
    assert all(a.evidence["job_alert"] == live.id for a in per_machine.values())
    assert detector.hang_analysis().culprit_ranks == [5, 6]


def test_summaries_settle_at_once_when_every_rank_sent_one() -> None:
    job = Job(machines=2, ranks=2, hang_at=200.0, seconds=300)
    sent = [
        summary(r, 4, completed=9, enqueued=9 if r == 0 else 10, dumped=START + 240.0)
        for r in range(4)
    ]
    job.flight = {241: sent}
    analyze = Recording()
    alerts, _, _ = run(job, HangDetector(analyze=analyze))
    assert [c[2] for c in analyze.calls] == [START + 241]
    assert {a.machine for a in machine_alerts(alerts)} == {"node-00"}


def test_more_summaries_raise_again_only_with_new_culprits() -> None:
    job = Job(machines=2, ranks=2, hang_at=200.0, seconds=320)
    first = [
        summary(r, 4, completed=9, enqueued=9 if r == 0 else 10, dumped=START + 240.0)
        for r in range(4)
    ]
    again = [
        summary(r, 4, completed=9, enqueued=9 if r == 0 else 10, dumped=START + 270.0)
        for r in range(4)
    ]
    more = [
        summary(r, 4, completed=9, enqueued=9 if r in (0, 3) else 10, dumped=START + 290.0)
        for r in range(4)
    ]
    job.flight = {241: first, 271: again, 291: more}
    analyze = Recording()
    alerts, _, _ = run(job, HangDetector(analyze=analyze))
    assert len(analyze.calls) == 3
    recorded = [a for a in job_alerts(alerts) if a.evidence["source"] == "flight_recorder"]
    assert [a.evidence["culprit_ranks"] for a in recorded] == [[0], [0, 3]]
    assert [a.machine for a in machine_alerts(alerts)] == ["node-00", "node-01"]


def test_summaries_without_a_step_probe_open_the_hang() -> None:
    """A job without the step probe: the flight recorder alone says it hangs."""
    window = JobWindow("job", horizon_s=64)
    analyze = Recording()
    detector = HangDetector(analyze=analyze)
    alerts: list[Alert] = []
    sent = [
        summary(r, 4, completed=3, enqueued=3 if r == 2 else 4, dumped=START + 5.0)
        for r in range(4)
    ]
    for sec in range(START, START + 30):
        for m in range(2):
            window.add_batch(
                NodeBatch(
                    job="job",
                    node=f"n{m}",
                    ts=float(sec),
                    samples=[("cpu_util_ratio", "", 0.5)],
                    flight_recorder=[s for s in sent if s.rank // 2 == m]
                    if sec == START + 6
                    else [],
                )
            )
        alerts.extend(detector.evaluate(window, sec))
    job_level = job_alerts(alerts)
    assert len(job_level) == 1 and job_level[0].first_ts == START + 5
    assert [a.machine for a in machine_alerts(alerts)] == ["n1"]


def test_window_keeps_the_latest_summary_per_rank_bounded() -> None:
    from detectors.window import WindowLimits

    window = JobWindow("job", horizon_s=8, limits=WindowLimits(max_flight_records=2))
    old = summary(0, 4, completed=1, enqueued=2, dumped=10.0)
    new = summary(0, 4, completed=1, enqueued=2, dumped=20.0)
    batch = NodeBatch(job="job", node="n0", ts=100.0, flight_recorder=[new, old])
    window.add_batch(batch)
    window.add_batch(
        NodeBatch(
            job="job",
            node="n1",
            ts=100.0,
            flight_recorder=[summary(r, 4, completed=1, enqueued=2, dumped=20.0) for r in (1, 2)],
        )
    )
    taken = window.take_flight_records()
    assert [(s.rank, s.dumped_ts, s.node) for s in taken] == [(0, 20.0, "n0"), (1, 20.0, "n1")]
    assert window.stats.rejected == {"older_flight_record": 1, "too_many_flight_records": 1}
    assert window.stats.flight_records == 4
    assert window.take_flight_records() == []


# -- metamorphic --------------------------------------------------------------------------


def _outcome(job: Job, shift: int, names: list[str], perm: list[int]) -> tuple[Any, ...]:
    job.shift = shift
    job.names = names
    alerts, _, _ = run(
        job,
        order=lambda batches: [batches[i] for i in perm if i < len(batches)] + batches[len(perm) :],
    )
    return tuple(
        (
            a.machine,
            a.detected_ts - shift,
            a.first_ts - shift,
            tuple(a.evidence.get("stopped_first_ranks", ())),
        )
        for a in alerts
    )


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    interval=st.sampled_from(INTERVALS),
    step_s=st.sampled_from([1.0, 3.0, 12.0]),
    hang_at=st.integers(150, 260),
    behind=st.sets(st.integers(0, 7), max_size=2),
    shift=st.integers(-100_000, 100_000),
    perm=st.permutations(list(range(4))),
    names=st.permutations(["a", "bb", "c-3", "zz"]),
)
def test_renaming_reordering_and_shifting_change_nothing(
    interval: int,
    step_s: float,
    hang_at: int,
    behind: set[int],
    shift: int,
    perm: list[int],
    names: list[str],
) -> None:
    def job() -> Job:
        return Job(
            machines=4,
            ranks=2,
            interval=interval,
            step_s=step_s,
            hang_at=float(hang_at),
            seconds=360,
            behind=set(behind),
        )

    base = _outcome(job(), 0, [f"node-{m:02d}" for m in range(4)], list(range(4)))
    other = _outcome(job(), shift, list(names), list(perm))
    rename = dict(zip([f"node-{m:02d}" for m in range(4)], names, strict=True))
    assert sorted((rename.get(m, m), *rest) for m, *rest in base) == sorted(other)
    assert sum(1 for a in base if a[0] == "") == 1


def test_dumps_that_come_apart_name_only_the_rank_the_hang_waits_on() -> None:
    # node-00's dumps come 11 s before the others' (each agent takes a dump after two of its
    # polls): until the rest arrive, ranks 2-7 would look like ranks that wrote none.
    job = Job(machines=4, ranks=2, step_s=2.0, hang_at=200.0, seconds=420)
    sent = {
        r: summary(r, 8, completed=41, enqueued=41 if r == 5 else 42, dumped=START + 250.0)
        for r in range(8)
    }
    job.flight = {251: [sent[0], sent[1]], 262: [sent[r] for r in range(2, 8)]}
    alerts, detector, _ = run(job, HangDetector(analyze=Recording()))
    assert {a.machine for a in machine_alerts(alerts)} == {"node-02"}
    assert detector.hang_analysis().culprit_ranks == [5]


def test_a_dump_of_a_working_job_raises_nothing_and_is_dropped() -> None:
    # An on-demand dump of a healthy job catches rank 1 not yet in the next collective.
    job = Job(machines=4, ranks=2, step_s=2.0, hang_at=None, seconds=300)
    job.flight = {
        150: [
            summary(r, 8, completed=74, enqueued=74 if r == 1 else 75, dumped=START + 149.0)
            for r in range(8)
        ]
    }
    analyze = Recording()
    alerts, detector, _ = run(job, HangDetector(analyze=analyze))
    assert alerts == [] and analyze.calls == []
    assert detector.stats.stale_summaries == 8


def test_a_summary_for_a_rank_the_probe_places_elsewhere_is_refused() -> None:
    # node-00 sends a summary of rank 6, which the step probe places on node-03.
    job = Job(machines=4, ranks=2, step_s=2.0, hang_at=200.0, seconds=300)
    _, detector, window = run(job, HangDetector(analyze=Recording()))
    forged = summary(6, 8, completed=41, enqueued=41, dumped=START + 299.0)
    window.add_batches([NodeBatch("job", "node-00", float(START + 300), flight_recorder=[forged])])
    detector.evaluate(window, START + 300)
    assert detector.stats.refused_summaries == 1 and detector._summaries == {}


def test_when_the_machines_leave_the_hang_is_over_and_its_dumps_forgotten() -> None:
    job = Job(machines=4, ranks=2, step_s=2.0, hang_at=200.0, leave_at=300.0, seconds=360)
    job.flight = {
        251: [
            summary(r, 8, completed=41, enqueued=41 if r == 5 else 42, dumped=START + 250.0)
            for r in range(8)
        ]
    }
    _, detector, _ = run(job, HangDetector(analyze=Recording()))
    analysis = detector.hang_analysis()
    assert analysis is not None and not analysis.hung
    assert detector._summaries == {}
