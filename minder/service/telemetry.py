"""Prometheus metrics the detection service exports (prefix ``minder_``, base units)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServiceMetrics:
    """The service's own metrics, registered in one registry (one per service instance)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.messages = Counter(
            "minder_messages_consumed_total",
            "Kafka messages read from the metrics topic",
            registry=r,
        )
        self.batches = Counter(
            "minder_batches_consumed_total",
            "Node batches decoded and placed in job windows",
            registry=r,
        )
        self.samples = Counter(
            "minder_samples_consumed_total", "Metric samples placed in job windows", registry=r
        )
        self.batches_rejected = Counter(
            "minder_batches_rejected_total",
            "Decoded batches refused by the service (e.g. timestamps far in the future)",
            ["reason"],
            registry=r,
        )
        self.samples_too_old = Counter(
            "minder_samples_too_old_total",
            "Samples older than the job window's horizon (counted, not scored)",
            registry=r,
        )
        self.decode_failures = Counter(
            "minder_decode_failures_total",
            "Messages that failed to decode and went to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.lag = Gauge(
            "minder_processing_lag_seconds",
            "Wall-clock time minus the newest sample time processed",
            registry=r,
        )
        self.machine_score = Gauge(
            "minder_machine_score",
            "Highest robust peer z-score of a machine over all metrics at the last evaluation",
            ["job", "machine"],
            registry=r,
        )
        self.alerts = Counter(
            "minder_alerts_total", "Alerts raised (new faults)", ["kind"], registry=r
        )
        self.alert_deliveries = Counter(
            "minder_alert_deliveries_total",
            "Alert deliveries by sink and outcome",
            ["sink", "outcome"],
            registry=r,
        )
        self.jobs = Gauge("minder_jobs", "Jobs with a live detection window", registry=r)
        self.machines = Gauge("minder_machines", "Machines across live job windows", registry=r)
        self.evaluation_seconds = Histogram(
            "minder_evaluation_seconds",
            "CPU time of one detection pass over one job-second",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        for kind in ("rule", "similarity", "straggler", "silence"):
            self.alerts.labels(kind=kind)
