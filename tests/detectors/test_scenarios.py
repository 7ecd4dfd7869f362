"""The bundled simulator scenarios through the offline detector: every injected fault is named,
and nothing else is."""

from __future__ import annotations

import pytest

from collectors.sim import bundled_scenario, load_scenario, scenario_labels, simulate_table
from detectors.offline import detect_table

pytestmark = pytest.mark.slow


def _run(name: str) -> tuple[set[str], dict[str, float], list]:
    scenario = load_scenario(bundled_scenario(name))
    labels = scenario_labels(scenario)
    run = detect_table(simulate_table(scenario))
    onsets = labels.groupby("machine")["start_ts"].min().to_dict()
    for domain, start in labels.groupby("domain")["start_ts"].min().items():
        if domain:
            onsets.setdefault(str(domain), start)
    return set(labels["machine"]), onsets, run.alerts


def test_three_faults_of_different_types_are_named_and_nothing_else() -> None:
    faulty, onsets, alerts = _run("three-faults")
    assert len(faulty) == 3
    assert {a.machine for a in alerts} == faulty
    assert len(alerts) == 3
    for alert in alerts:
        assert 0 <= alert.detected_ts - onsets[alert.machine] <= 60


def test_switch_reboot_is_one_domain_alert() -> None:
    faulty, onsets, alerts = _run("switch-reboot")
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.domain == alert.machine and set(alert.evidence["domain_members"]) == faulty
    assert alert.detected_ts - onsets[alert.machine] <= 30


def test_fault_free_run_with_confounders_raises_nothing() -> None:
    faulty, _, alerts = _run("fault-free")
    assert faulty == set()
    assert alerts == []
