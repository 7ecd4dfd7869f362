"""Prometheus metrics the detection service exports (prefix ``minder_``, base units).

Label hygiene (docs/metrics.md): no label is named ``job`` or ``instance``, which Prometheus
attaches to every scraped series itself (a default scrape would rename ours to
``exported_job``); Minder's job is ``job_id``. Per-job series exist while the job is active and
are removed when it becomes idle or ends (docs/operations.md, "Job lifecycle"), so their number
follows the jobs and machines this worker watches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from minder import __version__
from minder.core.alert import AlertKind
from minder.core.codec import LayoutCache, layout_cache
from minder.core.signing import AUTH_REASONS

JOB_LABEL = "job_id"
"""The label that names Minder's job (``job`` belongs to Prometheus' scrape configuration)."""
HANG_CULPRIT_SERIES = 32
"""``minder_hang_culprit`` series per job at most (the culprits of lowest rank; the API lists
them all)."""


class ServiceMetrics:
    """The service's own metrics, registered in one registry (one per service instance)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        Info("minder_build", "Version of the running Minder", registry=r).info(
            {"version": __version__}
        )
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
            "Decoded batches refused by the service (timestamps far in the future, a job id too "
            "long, too many jobs, too old to start a job)",
            ["reason"],
            registry=r,
        )
        self.refused_jobs = Counter(
            "minder_refused_jobs_total",
            "New jobs refused, by reason (name_too_long, too_many_jobs, too_old_for_new_job): "
            "each job counted once while its refusals go on, again after it was admitted or "
            "went 15 minutes (idle_job_s) without a refused batch",
            ["reason"],
            registry=r,
        )
        self.evicted_jobs = Counter(
            "minder_evicted_jobs_total",
            "Jobs whose window was dropped at the jobs bound for a new job worth more, by "
            "reason (one_shot: one machine, a few batches, then silent for a minute; "
            "for_several_machines: for a job several machines report for; for_confirmed_job: "
            "for a job the scheduler confirms)",
            ["reason"],
            registry=r,
        )
        self.scheduler_lookups = Counter(
            "minder_scheduler_lookups_total",
            "Admission's questions to the scheduler whether a job runs, by outcome (confirmed, "
            "not_found, error; dropped: not asked, the queue of questions was full)",
            ["outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "minder_rejected_total",
            "Samples, events and batches a job window refused at its limits, by reason "
            "(name_too_long, too_many_machines, too_many_series, too_many_events, event_time)",
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
            "Messages of the metrics topic that could not be decoded, by reason class",
            ["reason"],
            registry=r,
        )
        self.unauthenticated = Counter(
            "minder_batches_unauthenticated_total",
            "Messages of the metrics topic whose signature did not hold, by reason (unsigned, "
            "malformed_signature, unknown_key, bad_signature, misattributed, replayed, "
            "outside_window) and what was done (dead_lettered; accepted in permissive mode)",
            ["reason", "action"],
            registry=r,
        )
        self.batches_verified = Counter(
            "minder_batches_verified_total",
            "Batches whose signature held (their node's key, a new sequence number), by the "
            "cluster key id they were signed under",
            ["kid"],
            registry=r,
        )
        self.dead_letters = Counter(
            "minder_dead_letters_total",
            "Messages written to the dead-letter topic (acknowledged by the broker), by reason",
            ["reason"],
            registry=r,
        )
        self.messages_skipped = Counter(
            "minder_messages_skipped_total",
            "Messages of the metrics topic skipped because they could be neither decoded nor "
            "dead-lettered (not even truncated) after bounded retries",
            registry=r,
        )
        self.deadletter_failures = Counter(
            "minder_deadletter_failures_total",
            "Polls retried because a dead letter could not be written",
            registry=r,
        )
        self.handler_failures = Counter(
            "minder_handler_failures_total",
            "Polls retried because detection raised on their batches",
            registry=r,
        )
        self.lag = Gauge(
            "minder_processing_lag_seconds",
            "Wall-clock time minus the newest sample time processed",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "minder_consumer_lag_messages",
            "Messages of an assigned partition not consumed yet (high watermark - "
            "minder_consumer_offset), also while its polls are retried",
            ["topic", "partition"],
            registry=r,
        )
        self.consumer_offset = Gauge(
            "minder_consumer_offset",
            "Next offset of an assigned partition this worker will consume (after its last "
            "handled poll; what it commits). Standing still while minder_consumer_lag_messages "
            "grows: the partition is stuck",
            ["topic", "partition"],
            registry=r,
        )
        self.assigned_partitions = Gauge(
            "minder_assigned_partitions",
            "Partitions of the metrics topic this worker owns in its consumer group",
            registry=r,
        )
        self.machine_score = Gauge(
            "minder_machine_score",
            "Highest robust peer z-score of a machine over all metrics at the last evaluation",
            [JOB_LABEL, "machine"],
            registry=r,
        )
        self.machine_score_all = JobSeriesCollector(
            "minder_machine_score_all",
            "Highest robust peer z-score of a machine over all metrics at the last evaluation, "
            "for every machine of the job up to MINDER_DETECTION__MACHINE_SERIES_PER_JOB (4,096 "
            "by default; the highest scores beyond it); 0 for a machine without a score (silent, "
            "new)",
            ["machine"],
        )
        r.register(self.machine_score_all)
        self.alerts = Counter(
            "minder_alerts_total", "Alerts raised (new faults)", ["kind"], registry=r
        )
        self.alerts_suppressed = Counter(
            "minder_alerts_suppressed",
            "Alerts not raised because their machine already has an open alert (same episode)",
            registry=r,
        )
        self.open_alerts = Gauge(
            "minder_open_alerts",
            "Alerts open or acknowledged (not yet resolved), per job and kind",
            [JOB_LABEL, "kind"],
            registry=r,
        )
        self.alert_deliveries = Counter(
            "minder_alert_deliveries_total",
            "Alert deliveries by sink and outcome",
            ["sink", "outcome"],
            registry=r,
        )
        self.jobs = Gauge(
            "minder_jobs",
            "Active jobs this worker holds (status 'active' in GET /api/v1/jobs: idle and ended "
            "jobs are not counted)",
            registry=r,
        )
        self.stalled_jobs = Gauge(
            "minder_stalled_jobs",
            "Jobs whose data keeps arriving while their evaluation has not advanced for a minute",
            registry=r,
        )
        self.machines = Gauge(
            "minder_machines",
            "Machines in the active jobs now (the sum of minder_job_machines)",
            registry=r,
        )
        self.job_machines = Gauge(
            "minder_job_machines",
            "Machines in the job now: reported and not departed (active_machines in GET "
            "/api/v1/jobs); only while the job is active, gone when it is idle or ended",
            [JOB_LABEL],
            registry=r,
        )
        self.membership_changes = Counter(
            "minder_membership_changes_total",
            "Membership changes of the watched jobs: joined, left (goodbye), left_together "
            "(fell silent together: a scale-down), quiet (most of a job stopped reporting)",
            ["change"],
            registry=r,
        )
        self.job_slowdown = Gauge(
            "minder_job_live_slowdown",
            "The job's live slowdown S from its step and busy times: observed step time over "
            "the balanced step time (1 = no straggler)",
            [JOB_LABEL],
            registry=r,
        )
        self.rank_lateness = JobSeriesCollector(
            "minder_rank_lateness_seconds",
            "How long the rank's peers waited for it per step (train_lateness_seconds, derived "
            "from the ranks' collective times); every rank of the job up to "
            "MINDER_DETECTION__MACHINE_SERIES_PER_JOB (4,096 by default; the latest beyond it)",
            ["machine", "device"],
        )
        r.register(self.rank_lateness)
        self.job_peer_coherence = Gauge(
            "minder_job_peer_coherence",
            "Share of the job's machines that stayed with their peers on the metric over the "
            "detector's horizon; exported only while the metric is not peer-comparable (the "
            "machines are not alike on it: no similarity alerts on it)",
            [JOB_LABEL, "metric"],
            registry=r,
        )
        self.job_hang = Gauge(
            "minder_job_hang",
            "1 while the job's latest hang analysis says it is hung (every rank waits in a "
            "collective some rank never joined; or, without any analysis, while its job-level "
            "hang alert is open), else 0",
            [JOB_LABEL],
            registry=r,
        )
        self.hang_culprit = Gauge(
            "minder_hang_culprit",
            "1 per culprit of the job's latest hang analysis while it is hung: the rank the "
            "hang waits on, its machine, its process group and why it is named (not_joined, "
            f"no_dump, mismatch, stopped_first); the first {HANG_CULPRIT_SERIES} by rank (GET "
            "/api/v1/jobs/{job}/hang lists them all); gone when the hang ends",
            [JOB_LABEL, "rank", "machine", "group", "reason"],
            registry=r,
        )
        self.job_interval = Gauge(
            "minder_job_sampling_interval_seconds",
            "Sampling interval the job's detection follows (learnt from its data)",
            [JOB_LABEL],
            registry=r,
        )
        self.job_last_sample = Gauge(
            "minder_job_last_sample_timestamp_seconds",
            "Unix time of the newest sample received for the job (freshness: time() - this)",
            [JOB_LABEL],
            registry=r,
        )
        self.job_last_evaluation = Gauge(
            "minder_job_last_evaluation_timestamp_seconds",
            "Wall-clock unix time of the job's last detection pass",
            [JOB_LABEL],
            registry=r,
        )
        self.evaluation_seconds = Histogram(
            "minder_evaluation_seconds",
            "CPU time of one detection pass over one job-second",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        # Job state written off the poll loop (minder/service/persistence.py)
        self.state_writes = Counter(
            "minder_state_writes_total",
            "Writes of job state (machines, current scores) to the database, by outcome",
            ["outcome"],
            registry=r,
        )
        self.state_write_seconds = Histogram(
            "minder_state_write_seconds",
            "Wall time of one write of a job's changed machines (in the state writer's thread)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.state_machines_written = Counter(
            "minder_state_machines_written_total",
            "Machines whose state was written (only those that changed)",
            registry=r,
        )
        self.state_captures_superseded = Counter(
            "minder_state_captures_superseded_total",
            "Job state captures replaced by a newer one before they were written (the writer "
            "is behind; the newer one carries their changes)",
            registry=r,
        )
        for outcome in ("ok", "error"):
            self.state_writes.labels(outcome=outcome)
        for kind in AlertKind:
            if kind is not AlertKind.SUSPICIOUS_SOURCE:  # raised by the actions, counted there
                self.alerts.labels(kind=kind.value)
        for change in ("joined", "left", "left_together", "quiet"):
            self.membership_changes.labels(change=change)
        for reason in ("future_timestamp", "name_too_long", "too_many_jobs", "too_old_for_new_job"):
            self.batches_rejected.labels(reason=reason)
        for reason in ("name_too_long", "too_many_jobs", "too_old_for_new_job"):
            self.refused_jobs.labels(reason=reason)
        for reason in ("one_shot", "for_several_machines", "for_confirmed_job"):
            self.evicted_jobs.labels(reason=reason)
        for reason in (
            "name_too_long",
            "too_many_machines",
            "too_many_series",
            "too_many_events",
            "event_time",
        ):
            self.rejected.labels(reason=reason)
        self.init_store()
        r.register(LayoutStoreCollector(layout_cache()))

    def init_store(self) -> None:
        """Export the alert store's outcomes from the start (at 0), so rates exist before
        alerts."""
        for outcome in ("ok", "error", "dropped"):
            self.alert_deliveries.labels(sink="store", outcome=outcome)

    def init_reasons(self, reasons: tuple[str, ...]) -> None:
        """Export every decode-failure and dead-letter reason class from the start (at 0)."""
        for reason in reasons:
            if reason not in AUTH_REASONS:  # signature failures: minder_batches_unauthenticated
                self.decode_failures.labels(reason=reason)
            self.dead_letters.labels(reason=reason)

    def init_scheduler_lookups(self) -> None:
        """Export every outcome of admission's scheduler lookups from the start (at 0): only
        when a scheduler is configured."""
        for outcome in ("confirmed", "not_found", "error", "dropped"):
            self.scheduler_lookups.labels(outcome=outcome)

    def scheduler_lookup(self, outcome: str) -> None:
        """Count one outcome of a scheduler lookup (called by the lookup thread)."""
        self.scheduler_lookups.labels(outcome=outcome).inc()

    def init_auth(self, action: str) -> None:
        """Export every signature failure reason from the start (at 0)."""
        for reason in AUTH_REASONS:
            self.unauthenticated.labels(reason=reason, action=action)

    def forget_job(self, job: str) -> None:
        """Remove the gauges of a job no longer active (idle or ended; its per-machine series
        are the engine's)."""
        gauges = (
            self.job_machines,
            self.job_interval,
            self.job_slowdown,
            self.job_last_sample,
            self.job_last_evaluation,
            self.job_hang,
        )
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(job)


class JobSeriesCollector(Collector):
    """A gauge of per-job series (``job_id`` and ``labels``) that the detection loop replaces a
    job at a time, built at scrape time: thousands of series per job cost the loop one list per
    job and nothing per series (a :class:`Gauge` child per series would cost microseconds each
    at every refresh). ``minder_machine_score_all`` and ``minder_rank_lateness_seconds``, up to
    ``DetectionSettings.machine_series_per_job`` per job."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = [JOB_LABEL, *labels]
        self._jobs: dict[str, tuple[tuple[tuple[str, ...], float], ...]] = {}

    def set_job(self, job: str, rows: Iterable[tuple[tuple[str, ...], float]]) -> None:
        """Replace ``job``'s series with ``(label values after job_id, value)`` rows."""
        self._jobs[job] = tuple(rows)

    def forget(self, job: str) -> None:
        """Remove ``job``'s series."""
        self._jobs.pop(job, None)

    def series(self, job: str) -> dict[tuple[str, ...], float]:
        """``job``'s series now, by label values after ``job_id``."""
        return dict(self._jobs.get(job, ()))

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for job, rows in list(self._jobs.items()):  # the loop replaces entries, never edits
            for values, value in rows:
                family.add_metric([job, *values], value)
        yield family


class LayoutStoreCollector(Collector):
    """``minder_layout_store_total{outcome}``: what the decoder's layout store did (read from the
    cache's own counters at each scrape, so nothing in the poll loop keeps them up to date)."""

    def __init__(self, cache: LayoutCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[CounterMetricFamily]:
        cache = self.cache
        family = CounterMetricFamily(
            "minder_layout_store",
            "Wire layouts the decoder loaded from the shared database (loaded: batches decoded "
            "that a restarted or new partition owner would have dead-lettered), saved to it, "
            "looked up in vain (not_found), found there but invalid, and store calls that "
            "failed (error)",
            labels=["outcome"],
        )
        for outcome, value in (
            ("loaded", cache.store_loaded),
            ("saved", cache.store_saved),
            ("not_found", cache.store_misses),
            ("invalid", cache.store_refused),
            ("error", cache.store_failures),
        ):
            family.add_metric([outcome], value)
        yield family
