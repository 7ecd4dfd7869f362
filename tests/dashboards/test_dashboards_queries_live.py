"""Every dashboard query returns data from series shaped like Minder's metric contract.

A synthetic exporter (prometheus_client, on loopback) serves the contract's series with the
contract's labels: a service (scrape job ``minder``) watching one job of four machines, and that
job's four agents (scrape job ``minder-agent``). A real Prometheus scrapes it every second; then
each panel, annotation and variable query of the committed dashboards, its variables filled in,
must come back non-empty. This checks the queries' meaning (label matching of ratios, quantiles
over peers, ``== 1`` filters) where the parse test only checks their syntax. It does not replace
the end-to-end test against the real service and agents.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import free_port, prometheus_server

from dashboards.queries import (
    annotation_queries,
    default_variables,
    panel_queries,
    substitute,
    variable_names,
    variable_options,
    variable_queries,
    variable_selector,
)
from minder.core.alert import AlertKind
from minder.core.metrics import METRICS, MetricKind

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

ROOT = Path(__file__).resolve().parents[2]
JSON_DIR = ROOT / "dashboards" / "json"
JOB = "job-a"
MACHINES = ["node-001", "node-002", "node-003", "node-004"]
START = time.time()


def _elapsed() -> float:
    return time.time() - START


def _gauge(name: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, name, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, rows: list[dict[str, str]], rate: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, name, labels=list(rows[0]) if rows else [])
    for row in rows or [{}]:
        family.add_metric(list(row.values()), rate * _elapsed())
    return family


class ServiceCollector:
    """The service's series for one job (``minder_*`` of minder.service.telemetry's contract)."""

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        yield _counter("minder_messages_consumed", [{}], 4.0)
        yield _counter("minder_batches_consumed", [{}], 4.0)
        yield _counter("minder_samples_consumed", [{}], 400.0)
        yield _counter("minder_batches_rejected", [{"reason": "future_timestamp"}], 0.1)
        yield _counter("minder_decode_failures", [{"reason": "corrupt"}], 0.1)
        yield _counter("minder_dead_letters", [{"reason": "corrupt"}], 0.1)
        yield _gauge("minder_processing_lag_seconds", {}, 1.5)
        lag = GaugeMetricFamily("minder_consumer_lag_messages", "", labels=["topic", "partition"])
        for partition in ("0", "1"):
            lag.add_metric(["minder.metrics", partition], 3.0)
        yield lag
        score = GaugeMetricFamily("minder_machine_score", "", labels=["job_id", "machine"])
        whole = GaugeMetricFamily("minder_machine_score_all", "", labels=["job_id", "machine"])
        lateness = GaugeMetricFamily(
            "minder_rank_lateness_seconds", "", labels=["job_id", "machine", "device"]
        )
        for i, machine in enumerate(MACHINES):
            score.add_metric([JOB, machine], 1.0 + 3 * i)
            whole.add_metric([JOB, machine], 1.0 + 3 * i)
            for rank in ("rank0", "rank1"):
                lateness.add_metric([JOB, machine, rank], 0.05 * i)
        yield from (score, whole, lateness)
        yield _gauge("minder_job_live_slowdown", {"job_id": JOB}, 1.12)
        yield _counter("minder_alerts", [{"kind": "similarity"}, {"kind": "rule"}], 0.05)
        # Every kind of a live job, 0 when none is open (as the service exports them).
        open_alerts = GaugeMetricFamily("minder_open_alerts", "", labels=["job_id", "kind"])
        for kind in AlertKind:
            open_alerts.add_metric([JOB, kind.value], 1 if kind is AlertKind.SIMILARITY else 0)
        yield open_alerts
        yield _counter("minder_alert_deliveries", [{"sink": "store", "outcome": "ok"}], 0.05)
        yield _counter("minder_alerts_suppressed", [{}], 0.01)
        yield _gauge("minder_assigned_partitions", {}, 2)
        yield _counter("minder_handler_failures", [{}], 0.0)
        yield _counter("minder_deadletter_failures", [{}], 0.0)
        destinations = ["kafka", "webhook:ops", "action:slurm"]
        yield _counter(
            "minder_outbox_deliveries",
            [
                {"destination": d, "outcome": o}
                for d in destinations
                for o in ("delivered", "retry")
            ],
            0.05,
        )
        for name, value in (
            ("minder_outbox_pending", 1.0),
            ("minder_outbox_oldest_pending_age_seconds", 3.0),
            ("minder_outbox_expired", 0.0),
        ):
            family = GaugeMetricFamily(name, name, labels=["destination"])
            for destination in destinations:
                family.add_metric([destination], value)
            yield family
        yield _counter(
            "minder_actions",
            [{"target": "slurm", "operation": "drain", "outcome": "dry_run"}],
            0.01,
        )
        yield _gauge("minder_actions_breaker_tripped", {}, 0)
        # self-checks of drained nodes (minder.service.selfcheck): one running, some ended
        yield _gauge("minder_selfchecks_in_progress", {"target": "slurm"}, 1)
        states = ("passed", "failed", "inconclusive", "timed_out", "cancelled")
        yield _counter("minder_selfchecks", [{"state": s} for s in states], 0.01)
        checks = 0.01 * _elapsed()
        yield HistogramMetricFamily(
            "minder_selfcheck_drain_to_return_seconds",
            "",
            buckets=[("60", 0.1 * checks), ("300", 0.7 * checks), ("+Inf", checks)],
            sum_value=240 * checks,
        )
        yield _gauge("minder_jobs", {}, 1)
        yield _gauge("minder_machines", {}, len(MACHINES))
        yield _gauge("minder_job_machines", {"job_id": JOB}, len(MACHINES))
        yield _gauge("minder_job_hang", {"job_id": JOB}, 1)
        culprits = GaugeMetricFamily(
            "minder_hang_culprit", "", labels=["job_id", "rank", "machine", "group", "reason"]
        )
        for rank, reason in ((5, "not_joined"), (6, "no_dump")):
            culprits.add_metric([JOB, str(rank), MACHINES[rank // 4], "default_pg", reason], 1)
        yield culprits
        yield _gauge("minder_job_last_sample_timestamp_seconds", {"job_id": JOB}, now - 2)
        yield _gauge("minder_job_last_evaluation_timestamp_seconds", {"job_id": JOB}, now - 1)
        n = 10 * _elapsed()
        yield HistogramMetricFamily(
            "minder_evaluation_seconds",
            "",
            buckets=[("0.001", 0.2 * n), ("0.01", 0.9 * n), ("0.1", n), ("+Inf", n)],
            sum_value=0.004 * n,
        )
        yield _gauge("minder_whatif_slowdown", {"job_id": JOB}, 1.2)
        yield _gauge("minder_whatif_waste_ratio", {"job_id": JOB}, 1 - 1 / 1.2)
        yield _gauge("minder_whatif_verdict_info", {"job_id": JOB, "verdict": "worker"}, 1)
        yield _counter("minder_whatif_reports", [{"status": "done"}, {"status": "failed"}], 0.01)
        yield _gauge("minder_build_info", {"version": "0.1.0"}, 1)


class AgentsCollector:
    """The four agents' series (every series with ``job_id`` and ``machine``)."""

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        machines = [{"job_id": JOB, "machine": m} for m in MACHINES]
        info = GaugeMetricFamily("minder_agent_info", "", labels=["job_id", "machine"])
        for row in machines:
            info.add_metric(list(row.values()), 1)
        yield info
        for metric, spec in METRICS.items():
            if spec.kind is MetricKind.COUNT:
                continue
            family = GaugeMetricFamily(
                f"minder_node_{metric}", "", labels=["job_id", "machine", "device"]
            )
            devices = {"gpu": ["gpu0", "gpu1"], "nic": ["mlx5_0"], "rank": ["rank0"]}.get(
                spec.family.value, [""]
            )
            for i, row in enumerate(machines):
                for device in devices:
                    family.add_metric([JOB, row["machine"], device], 0.5 + 0.1 * i)
            yield family
        yield _counter("minder_agent_collections", machines, 1.0)
        last = GaugeMetricFamily(
            "minder_agent_last_collection_timestamp_seconds", "", labels=["job_id", "machine"]
        )
        seconds = GaugeMetricFamily(
            "minder_agent_collect_seconds", "", labels=["job_id", "machine", "source"]
        )
        spool = GaugeMetricFamily("minder_agent_spool_bytes", "", labels=["job_id", "machine"])
        spool_max = GaugeMetricFamily(
            "minder_agent_spool_max_bytes", "", labels=["job_id", "machine"]
        )
        for i, row in enumerate(machines):
            values = list(row.values())
            last.add_metric(values, now - i)
            for source in ("nvml", "rdma", "host"):
                seconds.add_metric([*values, source], 0.01 * (i + 1))
            spool.add_metric(values, 1000.0 * i)
            spool_max.add_metric(values, 1e6)
        yield from (last, seconds, spool, spool_max)
        errors = [{**row, "source": "nvml", "reason": "exception"} for row in machines]
        yield _counter("minder_agent_source_errors", errors, 0.1)
        yield _counter("minder_agent_batches_sent", machines, 1.0)
        yield _counter("minder_agent_dropped_oldest", machines, 0.01)
        yield _counter("minder_agent_send_errors", machines, 0.01)


def _serve(collector: Any) -> tuple[Any, int]:
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(collector)
    port = free_port()
    server, _thread = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    return server, port


def _queries() -> list[tuple[str, str]]:
    """Every panel, annotation and variable query of every dashboard, variables filled in."""
    result = []
    for path in sorted(JSON_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        values = {**default_variables(dashboard), "job_id": JOB, "machine": MACHINES[0]}
        options = variable_options(dashboard)
        exprs = [(f"panel {t!r}", e) for t, e in panel_queries(dashboard)]
        exprs += [(f"annotation {n!r}", e) for n, e in annotation_queries(dashboard)]
        exprs += [
            (f"variable {n!r}", s)
            for n, q in variable_queries(dashboard)
            if (s := variable_selector(q))
        ]
        for where, expr in exprs:
            choices: list[dict[str, str]] = [{}]
            for name in sorted(variable_names(expr) & set(options)):
                choices = [{**c, name: v} for c in choices for v in options[name]]
            for choice in choices:
                result.append((f"{path.name} {where}", substitute(expr, {**values, **choice})))
    return result


@pytest.mark.slow
def test_every_query_returns_data_from_contract_shaped_series(tmp_path: Path) -> None:
    service, service_port = _serve(ServiceCollector())
    agents, agents_port = _serve(AgentsCollector())
    try:
        scrape = [
            {"job_name": "minder", "static_configs": [{"targets": [f"127.0.0.1:{service_port}"]}]},
            {
                "job_name": "minder-agent",
                "static_configs": [{"targets": [f"127.0.0.1:{agents_port}"]}],
            },
        ]
        with prometheus_server(tmp_path, scrape_configs=scrape) as prometheus:
            # rate() needs two scrapes of each target inside the window.
            deadline = time.monotonic() + 30
            ready = (
                "count(rate(minder_agent_batches_sent_total[1m]))"
                " + count(rate(minder_batches_consumed_total[1m]))"
            )
            while prometheus.query(ready)["data"]["result"] == []:
                assert time.monotonic() < deadline, prometheus.log_tail()
                time.sleep(0.5)
            empty = []
            for where, expr in _queries():
                answer = prometheus.query(expr)
                assert answer["status"] == "success", f"{where}: {expr}\n{answer}"
                if not answer["data"]["result"]:
                    empty.append(f"{where}: {expr}")
            assert empty == []
    finally:
        for server in (service, agents):
            server.shutdown()
            server.server_close()
