"""The generated dashboards: reproducible, well-formed, and querying only Minder's metric contract."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from metric_contract import AGENT_METRICS, SERVICE_METRICS
from prometheus_server import prometheus_server

from dashboards.queries import (
    annotation_queries,
    default_variables,
    iter_panels,
    panel_queries,
    substitute,
    variable_names,
    variable_options,
    variable_queries,
    variable_selector,
)
from minder.core.metrics import METRICS, MetricKind

ROOT = Path(__file__).resolve().parents[2]
JSON_DIR = ROOT / "dashboards" / "json"
PROVISIONING = ROOT / "dashboards" / "provisioning"

UIDS = {"minder-fleet", "minder-job", "minder-whatif", "minder-service", "minder-agents"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

NODE_GAUGES = {f"minder_node_{n}" for n, s in METRICS.items() if s.kind is not MetricKind.COUNT}
CONTRACT = SERVICE_METRICS | AGENT_METRICS | NODE_GAUGES

METRIC_NAME = re.compile(r"minder_[a-z0-9_]+")
# A selector of a Minder metric and the label matchers in its braces.
MINDER_SELECTOR = re.compile(r"(minder_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER_LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")

LIVE_VALUES = {"job_id": "job-a", "machine": "node-001"}
"""Values for the query variables, whose options come from live data."""


def _committed() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(JSON_DIR.glob("*.json"))}


DASHBOARDS = _committed()


def _every_expr(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Panel, annotation and variable queries (``label_values`` reduced to its selector)."""
    exprs = [(f"panel {t!r}", e) for t, e in panel_queries(dashboard)]
    exprs += [(f"annotation {n!r}", e) for n, e in annotation_queries(dashboard)]
    for name, text in variable_queries(dashboard):
        selector = variable_selector(text)
        if selector:
            exprs.append((f"variable {name!r}", selector))
    return exprs


def _expanded(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every query with the variables filled in, once per value of each custom variable."""
    defaults = {**default_variables(dashboard), **LIVE_VALUES}
    options = variable_options(dashboard)
    result = []
    for where, expr in _every_expr(dashboard):
        choices = [{}]
        for name in sorted(variable_names(expr) & set(options)):
            choices = [{**c, name: value} for c in choices for value in options[name]]
        for choice in choices:
            result.append((where, substitute(expr, {**defaults, **choice})))
    return result


# --- reproducible -----------------------------------------------------------------------------


def test_regenerating_gives_exactly_the_committed_files(tmp_path: Path) -> None:
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk is not installed")
    from dashboards import build

    build.write(tmp_path, readme=None)

    generated = {p.name: p.read_text() for p in sorted(tmp_path.glob("*.json"))}
    committed = {p.name: p.read_text() for p in sorted(JSON_DIR.glob("*.json"))}
    assert sorted(generated) == sorted(committed)
    for name, text in generated.items():
        assert text == committed[name], f"{name} differs: run `python -m dashboards.build`"
    assert build.diff(JSON_DIR) == []


def test_check_mode_prints_the_diff_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk is not installed")
    from dashboards import build

    folder = tmp_path / "json"
    shutil.copytree(JSON_DIR, folder)
    assert build.main(["--check", "--out", str(folder)]) == 0
    path = folder / "minder-fleet.json"
    path.write_text(path.read_text().replace("Jobs watched", "Jobs seen"))
    (folder / "stale.json").write_text("{}\n")

    assert build.main(["--check", "--out", str(folder)]) == 1

    printed = capsys.readouterr().out
    assert (
        '-      "title": "Jobs seen",' in printed and '+      "title": "Jobs watched",' in printed
    )
    assert "stale.json" in printed and "out of date" in printed
    assert (folder / "stale.json").exists()  # --check writes nothing
    build.main(["--out", str(folder)])
    assert not (folder / "stale.json").exists() and build.diff(folder) == []


# --- well-formed ------------------------------------------------------------------------------


def test_the_five_dashboards_with_stable_uids_and_tags() -> None:
    assert set(DASHBOARDS) == {f"{uid}.json" for uid in UIDS}
    for name, dashboard in DASHBOARDS.items():
        assert name == f"{dashboard['uid']}.json"
        assert dashboard["tags"] == ["minder"]
        assert dashboard["title"].startswith("Minder / ")
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in iter_panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"


def test_every_panel_reads_the_datasource_variable_and_says_what_it_shows() -> None:
    for name, dashboard in DASHBOARDS.items():
        panels = [p for p in iter_panels(dashboard) if p["type"] != "row"]
        assert len(panels) >= 5, name
        for panel in panels:
            where = f"{name}: panel {panel['title']!r}"
            assert panel["datasource"] == DATASOURCE, where
            assert len(panel.get("description", "")) >= 40, f"{where} has no description"
            assert panel["targets"], f"{where} has no query"
            for target in panel["targets"]:
                assert target["expr"].strip(), where
                assert target["datasource"] == DATASOURCE, where
                assert target["refId"], where
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        for annotation in dashboard["annotations"].get("list", []):
            assert annotation["datasource"] == DATASOURCE
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                assert variable["datasource"] == DATASOURCE


def test_the_job_dashboard_has_its_variables_heatmap_band_and_annotation() -> None:
    job = DASHBOARDS["minder-job.json"]
    variables = {v["name"]: v for v in job["templating"]["list"]}
    assert variables["job_id"]["query"] == "label_values(minder_job_machines, job_id)"
    # Every machine of the job (a silent one too), not only the top-k of minder_machine_score.
    assert variables["machine"]["query"] == (
        'label_values(minder_machine_score_all{job_id="$job_id"}, machine)'
    )
    metrics = variable_options(job)["metric"]
    assert {"gpu_util_ratio", "gpu_power_watts", "rdma_tx_bytes_per_second"} <= set(metrics)
    assert {f"minder_node_{m}" for m in metrics} <= NODE_GAUGES
    panels = {p["title"]: p for p in iter_panels(job)}
    heatmap = panels["Machine scores"]
    assert heatmap["type"] == "heatmap" and heatmap["options"]["calculate"] is False
    assert heatmap["targets"][0]["legendFormat"] == "{{machine}}"
    assert "minder_machine_score_all{" in heatmap["targets"][0]["expr"]
    assert "minder_machine_score_all{" in panels["Score of $machine"]["targets"][0]["expr"]
    band = panels["$metric: $machine against its peers"]
    exprs = [t["expr"] for t in band["targets"]]
    assert any(e.startswith("quantile(0.1,") for e in exprs)
    assert any(e.startswith("quantile(0.9,") for e in exprs)
    overrides = json.dumps(band["fieldConfig"]["overrides"])
    assert '"custom.fillBelowTo"' in overrides
    (annotation,) = job["annotations"]["list"]
    assert "minder_open_alerts" in annotation["expr"] and annotation["titleFormat"]
    assert annotation["useValueForTime"] is False


def test_the_job_dashboard_has_per_rank_straggler_panels() -> None:
    """Live S, straggler alerts, and rank lateness as a heatmap over time (one row per rank)."""
    job = DASHBOARDS["minder-job.json"]
    rows = [p["title"] for p in job["panels"] if p["type"] == "row"]
    assert "Stragglers: live slowdown and rank lateness" in rows
    panels = {p["title"]: p for p in iter_panels(job)}
    exprs = {t: [q["expr"] for q in p.get("targets") or []] for t, p in panels.items()}
    assert exprs["Live slowdown S"] == ['max(minder_job_live_slowdown{job_id="$job_id"})']
    assert exprs["Live slowdown S over time"] == exprs["Live slowdown S"]
    assert exprs["Straggler alerts"] == [
        'max(minder_open_alerts{job_id="$job_id", kind="straggler"})'
    ]
    lateness = panels["Rank lateness"]
    assert lateness["type"] == "heatmap" and lateness["options"]["calculate"] is False
    assert lateness["targets"][0]["expr"] == (
        'max by (machine, device) (minder_rank_lateness_seconds{job_id="$job_id"})'
    )
    assert lateness["targets"][0]["legendFormat"] == "{{machine}} {{device}}"
    assert lateness["fieldConfig"]["defaults"]["unit"] == "s"
    assert "topk(10," in exprs["Latest ranks now"][0]


# --- the metric contract ----------------------------------------------------------------------


def test_no_query_matches_job_or_instance_on_a_minder_metric() -> None:
    for name, dashboard in DASHBOARDS.items():
        for where, expr in _every_expr(dashboard):
            for metric, matchers in MINDER_SELECTOR.findall(expr.replace("${metric}", "x")):
                labels = set(MATCHER_LABEL.findall(matchers))
                assert not labels & {"job", "instance"}, f"{name} {where}: {metric}{{{matchers}}}"


def test_every_metric_queried_is_in_the_contract() -> None:
    used: set[str] = set()
    for name, dashboard in DASHBOARDS.items():
        for where, expr in _expanded(dashboard):
            for metric in METRIC_NAME.findall(expr):
                assert metric in CONTRACT, f"{name} {where}: {metric} is not an exported metric"
                used.add(metric)
    # The contract's main series all have a panel.
    for metric in (
        "minder_open_alerts",
        "minder_alerts_total",
        "minder_machine_score",
        "minder_machine_score_all",
        "minder_job_live_slowdown",
        "minder_rank_lateness_seconds",
        "minder_consumer_lag_messages",
        "minder_evaluation_seconds_bucket",
        "minder_whatif_verdict_info",
        "minder_agent_spool_max_bytes",
        "minder_agent_collect_seconds",
        "minder_outbox_deliveries_total",
        "minder_outbox_pending",
        "minder_outbox_oldest_pending_age_seconds",
        "minder_actions_total",
        "minder_actions_breaker_tripped",
        "minder_selfchecks_in_progress",
        "minder_selfchecks_total",
        "minder_selfcheck_drain_to_return_seconds_bucket",
    ):
        assert metric in used, metric


def test_the_service_dashboard_has_a_self_check_row() -> None:
    """Checks in progress, outcomes by state over the range, drain-to-return median and p90."""
    service = DASHBOARDS["minder-service.json"]
    rows = [p["title"] for p in service["panels"] if p["type"] == "row"]
    assert rows[-1] == "Self-checks"
    panels = {p["title"]: p for p in iter_panels(service)}
    exprs = {t: [q["expr"] for q in p.get("targets") or []] for t, p in panels.items()}
    assert exprs["Self-checks in progress"] == ["max by (target) (minder_selfchecks_in_progress)"]
    assert exprs["Self-check outcomes over the range"] == [
        "sum by (state) (increase(minder_selfchecks_total[$__range]))"
    ]
    bucket = "minder_selfcheck_drain_to_return_seconds_bucket[$__range]"
    assert exprs["Drain to return"] == [
        f"histogram_quantile({q}, sum by (le) (increase({bucket})))" for q in ("0.5", "0.9")
    ]
    assert [t["legendFormat"] for t in panels["Drain to return"]["targets"]] == ["median", "p90"]
    assert panels["Drain to return"]["fieldConfig"]["defaults"]["unit"] == "s"


# --- helpers for the end-to-end test ---------------------------------------------------------


def test_substitute_fills_every_variable_form() -> None:
    values = {"job_id": "j1", "machine": "m1", "metric": "gpu_util_ratio"}
    assert (
        substitute(
            'rate(minder_node_${metric}{job_id="$job_id", machine="[[machine]]"}[$__rate_interval])',
            values,
        )
        == 'rate(minder_node_gpu_util_ratio{job_id="j1", machine="m1"}[1m])'
    )
    assert substitute("increase(x[$__range]) / $__interval", {}) == "increase(x[1h]) / 15s"
    assert substitute("x[$__rate_interval]", {"__rate_interval": "5m"}) == "x[5m]"
    assert substitute("${job_id:raw}", values) == "j1"
    assert substitute('x{a=~"b$"}', {}) == 'x{a=~"b$"}'
    with pytest.raises(KeyError, match="job_id"):
        substitute('x{job_id="$job_id"}', {})


def test_every_query_has_all_its_variables_filled() -> None:
    for dashboard in DASHBOARDS.values():
        for where, expr in _expanded(dashboard):
            assert "$" not in expr, f"{where}: {expr}"
    job = DASHBOARDS["minder-job.json"]
    titles = [t for t, _ in panel_queries(job)]
    assert "Machine scores" in titles and len(titles) >= 12


def test_every_query_parses_in_prometheus(tmp_path: Path) -> None:
    checked = 0
    with prometheus_server(tmp_path) as prometheus:
        for name, dashboard in DASHBOARDS.items():
            for where, expr in _expanded(dashboard):
                answer = prometheus.query(expr)
                assert answer["status"] == "success", f"{name} {where}: {expr}\n{answer}"
                checked += 1
        # The check itself notices a broken query.
        broken = prometheus.query("sum by (job_id (minder_jobs)")
        assert broken["status"] == "error" and broken["errorType"] == "bad_data"
    assert checked > 100


# --- provisioning -----------------------------------------------------------------------------


def test_grafana_provisioning_files() -> None:
    import yaml

    datasources = yaml.safe_load((PROVISIONING / "datasources" / "minder.yaml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == "minder-prometheus"
    assert source["url"] == "http://prometheus:9090" and source["access"] == "proxy"

    providers = yaml.safe_load((PROVISIONING / "dashboards" / "minder.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["folder"] == "Minder"
    assert provider["folderUid"] == "minder"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards/minder"
