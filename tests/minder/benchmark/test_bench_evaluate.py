"""Matching alerts to labels and the benchmark's figures, on hand-made alerts and labels."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from minder.benchmark.evaluate import CaseRun, LatencyStats, f1_score, match_case, summarize
from minder.core.alert import Alert, AlertKind

T0 = 1_000_000.0
COLUMNS = ("job", "machine", "start_ts", "end_ts", "fault", "device", "domain", "fault_index")


def labels(*rows: tuple[str, float, float, str, str, int]) -> pd.DataFrame:
    """Rows of (machine, start offset, end offset, fault, domain, fault_index)."""
    return pd.DataFrame(
        [
            {
                "job": "j",
                "machine": m,
                "start_ts": T0 + s,
                "end_ts": T0 + e,
                "fault": f,
                "device": "",
                "domain": d,
                "fault_index": i,
            }
            for m, s, e, f, d, i in rows
        ],
        columns=list(COLUMNS),
    )


def alert(machine: str, at: float, **extra: Any) -> Alert:
    return Alert(
        job="j",
        machine=machine,
        kind=extra.pop("kind", AlertKind.RULE),
        metric=extra.pop("metric", "gpu_xid_count"),
        score=1.0,
        first_ts=T0 + at,
        detected_ts=T0 + at,
        **extra,
    )


def run(
    name: str,
    fault: str | None,
    truth: pd.DataFrame,
    alerts: list[Alert],
    machines: int = 16,
    seconds: float = 600.0,
    cpu: float = 1.0,
) -> CaseRun:
    return CaseRun(
        name=name,
        fault=fault,
        machines=machines,
        labels=truth,
        alerts=alerts,
        detect_cpu_s=cpu,
        job_seconds=seconds,
        machine_seconds=machines * seconds,
    )


EMPTY = labels()


def test_alert_on_the_faulty_machine_in_its_span_is_a_true_positive() -> None:
    truth = labels(("n1", 100, 300, "ecc_error", "leaf-00", 0))
    alerts = [
        alert("n1", 90),  # before the onset: a false positive
        alert("n1", 112),  # the detection
        alert("n2", 120),  # another machine
        alert("n1", 355, metric="gpu_util_ratio"),  # within the 60 s slack: a duplicate
        alert("n1", 365, metric="cpu_util_ratio"),  # past the slack
    ]
    match = match_case(run("c", "ecc_error", truth, alerts))
    verdict = {(m.alert.detected_ts - T0): m.true_positive for m in match.alerts}
    assert verdict == {90: False, 112: True, 120: False, 355: True, 365: False}
    assert [m.duplicate for m in match.alerts] == [False, False, False, True, False]
    assert match.true_positives == 2 and match.false_positives == 3 and match.duplicates == 1
    (instance,) = match.instances
    assert instance.detected and instance.latency_s == pytest.approx(12.0)
    assert instance.alerts == 2


def test_an_event_in_the_onset_second_counts_with_zero_latency() -> None:
    truth = labels(("n1", 100.4, 300, "gpu_lost", "leaf-00", 0))
    match = match_case(run("c", "gpu_lost", truth, [alert("n1", 100)]))
    assert match.alerts[0].true_positive
    assert match.instances[0].latency_s == 0.0


def test_domain_alert_matches_the_rebooted_switch_and_member_alerts_are_duplicates() -> None:
    members = [f"n{i}" for i in range(4)]
    truth = labels(*((m, 200, 290, "switch_reboot", "leaf-01", 0) for m in members))
    domain = alert(
        "leaf-01",
        203,
        domain="leaf-01",
        kind=AlertKind.SILENCE,
        metric="silence",
        evidence={"domain_members": members},
    )
    wrong_domain = alert(
        "leaf-02", 204, domain="leaf-02", evidence={"domain_members": ["n9", "n10"]}
    )
    member = alert("n2", 206, metric="rdma_port_up")
    match = match_case(run("c", "switch_reboot", truth, [member, domain, wrong_domain]))
    by_machine = {m.alert.machine: m for m in match.alerts}
    assert by_machine["leaf-01"].true_positive and not by_machine["leaf-01"].duplicate
    assert by_machine["n2"].true_positive and by_machine["n2"].duplicate
    assert not by_machine["leaf-02"].true_positive
    (instance,) = match.instances  # four label rows, one fault
    assert instance.machines == tuple(members) and instance.latency_s == pytest.approx(3.0)


def test_a_domain_alert_does_not_match_a_single_machine_fault_of_that_domain() -> None:
    truth = labels(("n1", 100, 300, "machine_unreachable", "leaf-00", 0))
    domain = alert("leaf-00", 115, domain="leaf-00", evidence={"domain_members": ["n1", "n2"]})
    assert not match_case(run("c", "machine_unreachable", truth, [domain])).alerts[0].true_positive


def test_summary_overall_per_type_modes_false_alarms_and_cpu() -> None:
    runs = [
        # ECC: detected after 5 s, plus one false positive on a healthy machine.
        run(
            "ecc",
            "ecc_error",
            labels(("a1", 100, 600, "ecc_error", "", 0)),
            [alert("a1", 105), alert("a7", 300)],
            machines=16,
            cpu=2.0,
        ),
        # PCIe (fail-slow): detected after 80 s.
        run(
            "pcie",
            "pcie_downgrade",
            labels(("b3", 100, 600, "pcie_downgrade", "", 0)),
            [alert("b3", 180)],
            machines=64,
            cpu=4.0,
        ),
        # NIC down: missed.
        run("nic", "nic_down", labels(("c2", 100, 600, "nic_down", "", 0)), [], machines=16),
        # Fault-free: 2 false alarms on 1000 machines x 1 h = 1000 machine-hours.
        run(
            "free",
            None,
            EMPTY,
            [alert("d1", 50), alert("d2", 70)],
            machines=1000,
            seconds=3600.0,
            cpu=10.0,
        ),
    ]
    summary = summarize(runs)
    overall = summary.overall
    assert (overall.alerts, overall.tp_alerts, overall.fp_alerts) == (5, 2, 3)
    assert overall.precision == pytest.approx(2 / 5)
    assert overall.recall == pytest.approx(2 / 3)
    assert overall.f1 == pytest.approx(2 * 0.4 * (2 / 3) / (0.4 + 2 / 3))
    assert overall.latency.n == 2 and overall.latency.median == pytest.approx(42.5)
    assert summary.fail_stop.latency.median == pytest.approx(5.0)
    assert summary.fail_slow.latency.median == pytest.approx(80.0)
    assert summary.fail_stop.recall == pytest.approx(0.5)  # ECC found, NIC missed
    assert summary.fail_stop.precision == pytest.approx(0.5)  # ECC case: 1 TP of 2 alerts
    ecc = summary.by_fault["ecc_error"]
    assert (ecc.precision, ecc.recall, ecc.f1) == pytest.approx((0.5, 1.0, 2 / 3))
    nic = summary.by_fault["nic_down"]
    assert nic.precision is None and nic.recall == 0.0 and nic.f1 == 0.0
    assert summary.by_fault["pcie_downgrade"].f1 == pytest.approx(1.0)
    assert None not in summary.by_fault
    fa = summary.false_alarms
    assert fa.count == 2 and fa.machine_hours == pytest.approx(1000.0)
    assert fa.per_1000_machine_hours == pytest.approx(2.0)
    cpu = summary.cpu
    assert cpu.seconds == pytest.approx(17.0)
    assert cpu.per_job_second == pytest.approx(17.0 / (3 * 600 + 3600))
    assert cpu.by_size[16] == pytest.approx((2.0 + 1.0) / 1200)
    assert cpu.by_size[1000] == pytest.approx(10.0 / 3600)
    data = summary.to_dict()
    assert data["false_alarms"]["per_1000_machine_hours"] == pytest.approx(2.0)
    assert [c["case"] for c in data["cases"]] == ["ecc", "pcie", "nic", "free"]
    assert data["cases"][0]["false_positives"][0]["machine"] == "a7"


def test_p95_latency_and_edge_cases() -> None:
    stats = LatencyStats.of([float(x) for x in range(1, 101)])
    assert stats.median == pytest.approx(50.5) and stats.p95 == pytest.approx(95.05)
    assert LatencyStats.of([]).median is None
    assert f1_score(None, 0.0) == 0.0 and f1_score(None, None) is None
    empty = summarize([])
    assert empty.overall.precision is None and empty.overall.recall is None
    assert empty.false_alarms.per_1000_machine_hours is None
    assert empty.cpu.per_job_second is None


def test_duplicates_are_left_out_of_precision() -> None:
    truth = labels(("n1", 100, 300, "ecc_error", "leaf-00", 0))
    once = [alert("n1", 112), alert("n2", 120)]
    repeated = once + [alert("n1", 130 + i, metric=f"m{i}") for i in range(8)]
    p_once = summarize([run("a", "ecc_error", truth, once)]).overall
    p_repeated = summarize([run("a", "ecc_error", truth, repeated)]).overall
    assert p_once.precision == pytest.approx(0.5)
    # Eight more alerts on the same fault neither raise nor lower precision.
    assert p_repeated.precision == pytest.approx(0.5) and p_repeated.duplicates == 8


def test_straggler_figures_steps_and_live_slowdown_error() -> None:
    truth = labels(("m1", 100, 600, "slow_worker", "", 0), ("pp1", 100, 600, "slow_stage", "", 1))
    truth["group"] = ["", "pp1"]
    truth["slowdown"] = [1.2, 1.1]
    truth.loc[1, "machine"] = "m5"
    found = [
        alert("m1", 112.0, kind=AlertKind.SIMILARITY, metric="gpu_power_watts"),
        alert(
            "m1",
            124.0,
            kind=AlertKind.STRAGGLER,
            metric="train_busy_seconds",
            evidence={"verdict": "worker", "job_slowdown": 1.26, "steps": 50},
        ),
        alert(
            "pp1",
            160.0,
            kind=AlertKind.STRAGGLER,
            metric="train_busy_seconds",
            evidence={"verdict": "stage", "job_slowdown": 1.1, "steps": 27},
        ),
    ]
    asked: list[tuple[float, float, int | None]] = []
    replayed = {(T0 + 100, T0 + 124, 50): 1.25, (T0 + 100, T0 + 160, 27): 1.0}

    def replay(start: float, end: float, last: int | None) -> float | None:
        asked.append((start, end, last))
        return replayed.get((start, end, last), 1.15)  # 1.15: over the whole fault

    case = run("c", "slow_worker", truth, found)
    case.step_s = 2.0
    case.replay = replay
    summary = summarize([case])
    assert summary.overall.recall == 1.0 and summary.overall.precision == 1.0
    stats = summary.stragglers
    # The first straggler alert (not the similarity one) 24 s after onset at 2 s x S=1.2 per
    # step: 10 steps; the stage: 60 s / (2 x 1.1)
    assert stats["steps_to_alert"]["slow_worker"]["median"] == pytest.approx(10.0)
    assert stats["steps_to_alert"]["slow_stage"]["median"] == pytest.approx(60 / 2.2)
    # Replayed over the steps each alert judged (from the onset to the alert), and over the
    # whole fault.
    assert sorted(asked) == sorted(
        [*replayed, (T0 + 100, T0 + 600, None), (T0 + 100, T0 + 600, None)]
    )
    err = stats["slowdown_error"]  # against the replayed S: 1.26 vs 1.25, 1.1 vs 1.0
    assert err["n"] == 2 and err["within_5pct"] == 0.5
    assert err["median"] == pytest.approx((0.01 / 1.25 + 0.1) / 2)
    closed = stats["slowdown_error_closed_form"]  # against the labels' S: 5 % and 0 %
    assert closed["n"] == 2 and closed["median"] == pytest.approx((0.05 + 0.0) / 2)
    assert stats["slowdown_error_async"]["n"] == 0
    assert stats["replay_vs_closed_form"]["max"] == pytest.approx(0.1 / 1.1)
    by_case = {c["fault"]: c for c in stats["cases"]}
    assert by_case["slow_worker"]["replayed_fault"] == 1.15
    assert by_case["slow_stage"]["replayed"] == 1.0


def test_asynchronous_stragglers_are_scored_against_the_closed_form() -> None:
    truth = labels(("m1", 100, 600, "slow_worker", "", 0))
    truth["slowdown"] = [1.1]
    found = [
        alert(
            "m1",
            150.0,
            kind=AlertKind.STRAGGLER,
            metric="train_step_seconds",
            evidence={"verdict": "worker", "job_slowdown": 1.12, "sync": False, "ratio": 1.3},
        )
    ]
    case = run("c", "slow_worker", truth, found)
    case.replay = lambda start, end, last: None  # the replay has no shared step to replay
    stats = summarize([case]).stragglers
    assert stats["slowdown_error"]["n"] == 0
    assert stats["slowdown_error_async"]["n"] == 1
    assert stats["slowdown_error_async"]["median"] == pytest.approx(0.02 / 1.1)
    assert stats["cases"][0]["sync"] is False


def test_stray_job_level_hangs_are_counted_apart_from_the_machine_alerts() -> None:
    """A hang no fault explains (a checkpoint the loop did not report) is listed and counted
    apart: in a fault-free case, and in a slowed job long after its fault; a hang after a
    fail-stop onset is the fault's. None of them changes the attribution figures."""
    hang = alert("", 200, kind=AlertKind.HANG, metric="hang")
    free = summarize([run("free", None, EMPTY, [hang], machines=1000, seconds=3600.0)])
    assert free.false_alarms.count == 0
    assert (free.stray_job_alerts.count, free.stray_job_alerts.cases) == (1, 1)
    assert free.stray_job_alerts.per_100_job_hours == pytest.approx(100.0)
    assert free.to_dict()["stray_job_alerts"]["count"] == 1
    later = alert("", 900, kind=AlertKind.HANG, metric="hang")
    slow = labels(("n1", 100, 300, "pcie_downgrade", "", 0))
    slowed = summarize([run("pcie", "pcie_downgrade", slow, [alert("n1", 110), later])])
    assert (slowed.overall.alerts, slowed.overall.tp_alerts, slowed.overall.fp_alerts) == (1, 1, 0)
    assert slowed.stray_job_alerts.count == 1
    assert slowed.cases[0].to_dict()["stray_job_alerts"][0]["detected_ts"] == T0 + 900
    halted = summarize(
        [
            run(
                "nic",
                "nic_down",
                labels(("n1", 100, 300, "nic_down", "", 0)),
                [alert("n1", 110), later],
            )
        ]
    )
    assert halted.stray_job_alerts.count == 0 and halted.overall.alerts == 1
