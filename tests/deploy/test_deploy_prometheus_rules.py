"""Prometheus configuration and rules of deploy/prometheus and deploy/compose.

promtool checks the rules and the scrape configurations and runs the rule unit tests; the
Python checks hold the conventions promtool does not know (severity, runbook link, every alert
tested both firing and not firing, only metrics Minder exports).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_contract import AGENT_METRICS, SERVICE_METRICS

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "minder.rules.yml"
RULE_TESTS = RULES_DIR / "minder.rules.test.yml"

REQUIRED_ALERTS = {
    "MinderDetectionStalled",
    "MinderProcessingLagHigh",
    "MinderConsumerLagHigh",
    "MinderDeadLettersRising",
    "MinderAgentSpoolFilling",
    "MinderAgentDroppingBatches",
    "MinderNoDataFromJob",
    "MinderAgentDown",
    "MinderServiceDown",
    "MinderDeliveriesFailing",
    "MinderDeliveryBacklog",
    "MinderDeliveriesExpired",
    "MinderActionsBreakerTripped",
}
SEVERITIES = {"critical", "warning", "info"}
SCRAPE_JOBS = {"minder", "minder-agent"}


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def _alerts() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def test_promtool_check_rules(
    tool: Callable[[str], str], run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    result = run([tool("promtool"), "check", "rules", RULES])
    assert result.returncode == 0, explain(result)
    assert "SUCCESS" in result.stdout, explain(result)


def test_promtool_unit_tests_pass(
    tool: Callable[[str], str], run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    result = run([tool("promtool"), "test", "rules", RULE_TESTS], cwd=RULES_DIR)
    assert result.returncode == 0, explain(result)
    assert "SUCCESS" in result.stdout, explain(result)


def test_promtool_unit_tests_catch_a_wrong_expectation(
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
    tmp_path: Path,
) -> None:
    # Proof that the unit tests are real: the same tests against a broken rule fail.
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    broken = RULES.read_text(encoding="utf-8").replace(
        "expr: minder_processing_lag_seconds > 30", "expr: minder_processing_lag_seconds > 300"
    )
    assert broken != RULES.read_text(encoding="utf-8"), "the rule to break was not found"
    (tmp_path / RULES.name).write_text(broken, encoding="utf-8")
    result = run([tool("promtool"), "test", "rules", RULE_TESTS.name], cwd=tmp_path)
    assert result.returncode != 0, explain(result)
    assert "MinderProcessingLagHigh" in result.stdout + result.stderr, explain(result)


@pytest.mark.parametrize(
    ("config", "rules_glob"),
    [
        ("deploy/prometheus/prometheus.yml", "/etc/prometheus/rules/*.rules.yml"),
        ("deploy/compose/prometheus.yml", "/etc/prometheus/rules/*.rules.yml"),
    ],
)
def test_promtool_check_config(
    config: str,
    rules_glob: str,
    repo: Path,
    tool: Callable[[str], str],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
    tmp_path: Path,
) -> None:
    # Point the rule_files glob at the repository's rules, so promtool checks them with the
    # configuration that loads them (and proves the glob leaves the unit-test file out).
    text = (repo / config).read_text(encoding="utf-8")
    assert rules_glob in text
    copy = tmp_path / "prometheus.yml"
    copy.write_text(text.replace(rules_glob, f"{RULES_DIR}/*.rules.yml"), encoding="utf-8")
    result = run([tool("promtool"), "check", "config", copy])
    assert result.returncode == 0, explain(result)
    assert re.search(r"\b1 rule files? found", result.stdout), explain(result)


@pytest.mark.parametrize(
    "config", ["deploy/prometheus/prometheus.yml", "deploy/compose/prometheus.yml"]
)
def test_scrape_jobs_match_the_rules(config: str, repo: Path) -> None:
    document = yaml.safe_load((repo / config).read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in document["scrape_configs"]}
    assert jobs.keys() >= SCRAPE_JOBS
    for name in SCRAPE_JOBS:
        # Minder exports no `job`/`instance` label: the target's own labels must stay.
        assert not jobs[name].get("honor_labels", False), name
        assert jobs[name].get("metrics_path", "/metrics") == "/metrics"
    rule_jobs = set(re.findall(r'job="([^"]+)"', RULES.read_text(encoding="utf-8")))
    assert rule_jobs <= SCRAPE_JOBS, rule_jobs - SCRAPE_JOBS


def test_every_required_alert_exists() -> None:
    names = [rule["alert"] for rule in _alerts()]
    assert len(names) == len(set(names)), "duplicate alert names"
    assert set(names) >= REQUIRED_ALERTS, REQUIRED_ALERTS - set(names)


@pytest.mark.parametrize("alert", _alerts(), ids=lambda rule: rule["alert"])
def test_alert_conventions(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    assert re.fullmatch(r"Minder[A-Z][A-Za-z]+", name)
    assert alert.get("labels", {}).get("severity") in SEVERITIES, name
    annotations = alert.get("annotations", {})
    assert {"summary", "description", "runbook_url"} <= annotations.keys(), name
    assert annotations["runbook_url"] == f"docs/operations.md#{name.lower()}"
    for key in ("summary", "description"):
        assert "\n" not in annotations[key].strip(), f"{name} {key}: one line, please"
    # Alerts about a job or a machine say which one.
    expr = alert["expr"]
    for label in ("job_id", "machine"):
        if f"by ({label})" in expr or (label == "machine" and "minder_agent_" in expr):
            assert f"$labels.{label}" in annotations["summary"] + annotations["description"], (
                f"{name} does not name its {label}"
            )


def test_recording_rule_names_follow_the_convention() -> None:
    for rule in _rules():
        if "record" in rule:
            assert re.fullmatch(r"minder:[a-z_]+(:[a-z0-9_]+)?", rule["record"]), rule["record"]


def test_rules_use_only_exported_metrics() -> None:
    exported = SERVICE_METRICS | AGENT_METRICS
    for rule in _rules():
        for metric in re.findall(r"\b(minder_[a-z0-9_]+)", rule["expr"]):
            assert metric in exported or metric.startswith("minder_node_"), (
                f"{rule.get('alert') or rule.get('record')}: {metric} is not a Minder metric"
            )


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    document = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert document["rule_files"] == [RULES.name]
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in document["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in _alerts()}
    assert names - fires == set(), f"never tested firing: {sorted(names - fires)}"
    assert names - quiet == set(), f"never tested not firing: {sorted(names - quiet)}"


def test_rule_glob_leaves_the_test_file_out() -> None:
    # Prometheus loads /etc/prometheus/rules/*.rules.yml: the unit tests must not match.
    assert RULES.match("*.rules.yml")
    assert not RULE_TESTS.match("*.rules.yml")


def _exported_series() -> set[str]:
    """Names on the /metrics of the service (with its outbox, actions and what-if metrics) and
    of an agent with a sender: every family's (a labelled one has no series before its first
    value) and every series' (a histogram's ``_bucket``/``_sum``/``_count``)."""
    from prometheus_client import generate_latest

    from collectors.agent import Agent, AgentExporter, SenderCounters
    from minder.actions.executor import ActionMetrics
    from minder.delivery.worker import DeliveryMetrics
    from minder.service.prometheus_source import SourceMetrics
    from minder.service.selfcheck import SelfCheckMetrics
    from minder.service.telemetry import ServiceMetrics
    from minder.service.whatif_runner import WhatIfMetrics

    service = ServiceMetrics()
    DeliveryMetrics(service.registry)  # registered by the service's outbox
    ActionMetrics(service.registry)  # registered when scheduler actions are configured
    selfchecks = SelfCheckMetrics(service.registry)  # registered when self-checks are enabled
    selfchecks.in_progress.labels("slurm").set(0)
    source = SourceMetrics(service.registry)  # registered with a Prometheus source
    source.batches.labels("prometheus")
    source.errors.labels("prometheus", "unreachable")
    source.skipped.labels("prometheus")
    source.last.labels("prometheus")
    WhatIfMetrics.on(service.registry).set_job("job-1", 1.25, "worker")
    agent = Agent([], job="job-1", node="node-1", labels={})
    agent.collect_once(time.time())  # some series exist only after a collection
    exporter = AgentExporter(agent)
    exporter.set_sender(SenderCounters)
    names: set[str] = set()
    for registry in (service.registry, exporter.registry):
        text = generate_latest(registry).decode()
        for line in text.splitlines():
            if line.startswith("# HELP "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(line.split("{")[0].split()[0])
    return names


def test_rules_use_metrics_the_exporters_really_export() -> None:
    exported = _exported_series()
    used = {m for rule in _rules() for m in re.findall(r"\b(minder_[a-z0-9_]+)", rule["expr"])}
    assert used - exported == set(), f"used by the rules, exported by nobody: {used - exported}"


def test_the_metric_contract_is_what_the_exporters_export() -> None:
    missing = (SERVICE_METRICS | AGENT_METRICS) - _exported_series()
    assert missing == set(), f"in tests/metric_contract.py, exported by nobody: {sorted(missing)}"
