"""Jobs that grow and shrink: goodbyes, scale-downs, late joiners and ended jobs raise no
machine alert; a machine that really fails still does."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from detectors.config import DetectorConfig
from detectors.engine import MinderDetector
from detectors.offline import detect_table
from detectors.window import JobWindow
from minder.core.alert import Alert, AlertKind
from minder.core.records import Event, EventKind, NodeBatch
from minder.core.table import normalize_table

START = 1_000_000
Sample = dict[tuple[str, str], float]


def readings(rng: np.random.Generator, sec: int, offset: float) -> Sample:
    computing = sec % 6 < 4
    out: Sample = {}
    for g in range(4):
        out[("gpu_util_ratio", f"gpu{g}")] = float(np.clip(0.97 + rng.normal(0, 0.01), 0, 1))
        out[("gpu_power_watts", f"gpu{g}")] = (600 if computing else 350) * (1 + offset) + float(
            rng.normal(0, 8)
        )
    out[("rdma_tx_bytes_per_second", "mlx5_0")] = (2e8 if computing else 2e9) * (
        1 + float(rng.normal(0, 0.02))
    )
    return out


class Job:
    """A 16-machine job over 4 leaf switches, fed one second at a time."""

    def __init__(self, machines: int = 16, domains: int = 4) -> None:
        self.rng = np.random.default_rng(7)
        self.offsets = self.rng.normal(0, 0.02, machines)
        self.machines = machines
        self.domains = domains
        self.detector = MinderDetector(DetectorConfig())
        self.window = JobWindow("job", horizon_s=self.detector.horizon_s)
        self.alerts: list[Alert] = []

    def run(
        self,
        seconds: range,
        present: Callable[[int, int], bool] = lambda m, t: True,
        edit: Callable[[int, int, Sample], None] | None = None,
        goodbye: Callable[[int, int], bool] = lambda m, t: False,
    ) -> None:
        for t in seconds:
            sec = START + t
            for m in range(self.machines):
                labels = {"domain": f"leaf-{m * self.domains // self.machines}"}
                if goodbye(m, t):
                    self.window.add_batch(
                        NodeBatch(
                            "job",
                            f"m{m:03d}",
                            float(sec),
                            labels=labels,
                            events=[Event(EventKind.LEAVE, "", float(sec), message="SIGTERM")],
                        )
                    )
                if not present(m, t):
                    continue
                sample = readings(self.rng, sec, float(self.offsets[m]))
                if edit is not None:
                    edit(m, t, sample)
                self.window.add_batch(
                    NodeBatch(
                        "job",
                        f"m{m:03d}",
                        float(sec) + 0.5,
                        labels=labels,
                        samples=[(k, d, v) for (k, d), v in sample.items()],
                    )
                )
            self.alerts += self.detector.evaluate(self.window, sec)

    def changes(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(c.change, c.machines) for c in self.window.take_membership()]


def test_a_machine_that_says_goodbye_is_dropped_not_alerted_and_comes_back() -> None:
    job = Job()
    job.run(
        range(300),
        present=lambda m, t: not (m == 5 and 100 <= t < 160),
        goodbye=lambda m, t: m == 5 and t == 100,
    )
    assert job.alerts == []
    assert job.changes() == [("left", ("m005",)), ("joined", ("m005",))]
    assert not job.window.departed[5]


def test_machines_silent_together_across_domains_are_one_change_not_alerts() -> None:
    job = Job()
    leaving = {1, 6, 11}  # three leaf switches: not one switch's fault
    job.run(range(200), present=lambda m, t: not (m in leaving and t >= 100 + m % 3))
    assert job.alerts == []
    changes = job.changes()
    assert changes == [("left_together", ("m001", "m006", "m011"))]
    assert job.window.departed[sorted(leaving)].all()


def test_a_whole_domain_falling_silent_is_still_its_switch() -> None:
    job = Job()
    job.run(range(200), present=lambda m, t: not (m // 4 == 2 and t >= 100))
    assert [(a.machine, a.kind) for a in job.alerts] == [("leaf-2", AlertKind.SILENCE)]
    assert job.changes() == []


def test_one_silent_machine_is_still_alerted() -> None:
    job = Job()
    job.run(range(200), present=lambda m, t: not (m == 9 and t >= 100))
    assert [(a.machine, a.kind) for a in job.alerts] == [("m009", AlertKind.SILENCE)]


def test_a_late_joiner_is_compared_once_it_has_a_full_window() -> None:
    job = Job()
    # m015 joins at t=120; a deviating late joiner is still caught, a healthy one is not.
    job.run(range(400), present=lambda m, t: m != 15 or t >= 120)
    assert job.alerts == []
    late = Job()

    def slow(m: int, t: int, s: Sample) -> None:
        if m == 15:
            for g in range(4):
                s[("gpu_power_watts", f"gpu{g}")] *= 0.5

    late.run(range(400), present=lambda m, t: m != 15 or t >= 120, edit=slow)
    assert [(a.machine, a.kind) for a in late.alerts] == [("m015", AlertKind.SIMILARITY)]
    assert late.alerts[0].detected_ts >= START + 120 + DetectorConfig().window_s


def test_a_job_that_ends_raises_nothing_and_is_noted_once() -> None:
    job = Job()
    job.run(range(240), present=lambda m, t: t < 100 + m % 4)
    assert job.alerts == []
    assert [c for c, _ in job.changes()] == ["quiet"]


def test_departed_machines_are_not_peers() -> None:
    job = Job()
    job.run(
        range(160), goodbye=lambda m, t: m < 8 and t == 60, present=lambda m, t: m >= 8 or t < 60
    )
    assert job.alerts == []
    assert int(job.window.active().sum()) == 8


def _outage_table(domains: bool, back: bool) -> pd.DataFrame:
    """32 machines at 5 s; 8 of them (no common domain unless ``domains``) send nothing for
    120 s from sample 40, and come back if ``back``."""
    rng = np.random.default_rng(4)
    rows = []
    for t in range(100):
        for m in range(32):
            if 8 <= m < 16 and t >= 40 and (t < 64 or not back):
                continue
            for g in range(2):
                rows.append(
                    {
                        "ts": 1_700_000_000 + 5 * t,
                        "job": "j",
                        "machine": f"m{m:02d}",
                        "metric": "gpu_power_watts",
                        "device": f"gpu{g}",
                        "value": 600 + rng.normal(0, 8),
                        "domain": (f"leaf{m // 8}" if domains else ""),
                    }
                )
    return normalize_table(pd.DataFrame(rows))


def test_a_silent_batch_that_comes_back_was_an_outage_not_a_scale_down() -> None:
    run = detect_table(_outage_table(domains=False, back=True))
    named = sorted(a.machine for a in run.alerts)
    assert named == [f"m{m:02d}" for m in range(8, 16)]
    for alert in run.alerts:
        assert alert.kind is AlertKind.SILENCE
        assert abs(alert.first_ts - (1_700_000_000 + 5 * 40)) <= 15
        assert alert.evidence["returned_after_s"] >= 120
    assert [c.change for c in run.membership][:1] == ["left_together"]


def test_a_silent_batch_that_stays_away_was_a_scale_down() -> None:
    run = detect_table(_outage_table(domains=False, back=False))
    assert run.alerts == []
    assert "left_together" in [c.change for c in run.membership]


def test_a_domain_that_falls_silent_is_one_alert_and_its_return_adds_none() -> None:
    run = detect_table(_outage_table(domains=True, back=True))
    assert [(a.machine, a.domain) for a in run.alerts] == [("leaf1", "leaf1")]
