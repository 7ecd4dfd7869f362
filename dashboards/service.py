"""``minder-service``: the detection service (Kafka consumption, detection, outbox, actions)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import common as common_m

from dashboards.panels import (
    new_dashboard,
    queries,
    row,
    stat_panel,
    textbox_variable,
    timeseries_panel,
    value_text,
)

UID = "minder-service"
TITLE = "Minder / Service health"

PER_SECOND = "$__rate_interval"
RANGE = "$__range"
"""The dashboard's time range, for counts over it."""


def _rate(metric: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}[{PER_SECOND}]))"


def build() -> dashboard.Dashboard:
    """The service health dashboard."""
    return (
        new_dashboard(
            UID,
            TITLE,
            "The Minder detection service: scrape health, Kafka consumption and lag, decode "
            "failures and dead letters, detection time, outbox deliveries, scheduler "
            "actions and the self-checks of drained nodes.",
        )
        .with_variable(
            textbox_variable(
                "service_job",
                "Scrape job",
                "minder",
                "Prometheus scrape job (job label) of the Minder service's /metrics",
            )
        )
        .with_row(row("Availability"))
        .with_panel(
            stat_panel(
                "Service targets",
                "Prometheus' scrape result (up) for every Minder service replica of the scrape "
                "job in the 'Scrape job' variable. DOWN means Prometheus cannot read that "
                "replica's /metrics: it is stopped or unreachable. No value at all means no "
                "target is configured under that job name.",
                queries(('up{job="$service_job"}', "{{instance}}")),
                unit="none",
                span=12,
                graph=False,
                mappings=[value_text({"1": ("UP", "green"), "0": ("DOWN", "red")})],
                threshold_steps=((None, "red"), (1, "green")),
                text_mode=common_m.BigValueTextMode.VALUE_AND_NAME,
            )
        )
        .with_panel(
            stat_panel(
                "Versions running",
                "Replicas per Minder version (minder_build_info). More than one version is a "
                "rolling update in progress or a replica left behind.",
                queries(("count by (version) (minder_build_info)", "{{version}}")),
                unit="none",
                span=6,
                graph=False,
                decimals=0,
                text_mode=common_m.BigValueTextMode.VALUE_AND_NAME,
            )
        )
        .with_panel(
            stat_panel(
                "Processing lag",
                "Wall-clock time minus the newest sample time the service has processed, worst "
                "replica. A few seconds is normal; past 30 s (MinderProcessingLagHigh) alerts "
                "come late because the service falls behind its input.",
                queries(("max(minder_processing_lag_seconds)", "lag")),
                unit="s",
                span=6,
                threshold_steps=((None, "green"), (10, "orange"), (30, "red")),
            )
        )
        .with_row(row("Kafka consumption"))
        .with_panel(
            timeseries_panel(
                "Consumer lag per partition",
                "Messages of each assigned partition of the metrics topic not consumed yet "
                "(high watermark minus position). Flat near 0 is healthy; a partition whose "
                "lag keeps growing has a stuck or too slow consumer. The topic total above "
                "1000 and rising raises MinderConsumerLagHigh.",
                queries(
                    (
                        "sum by (topic, partition) (minder_consumer_lag_messages)",
                        "{{topic}}/{{partition}}",
                    )
                ),
                unit="short",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Processing lag per replica",
                "minder_processing_lag_seconds of each service replica: how far behind real "
                "time the newest processed sample is. Dashed line at 30 s.",
                queries(("max by (instance) (minder_processing_lag_seconds)", "{{instance}}")),
                unit="s",
                min_val=0,
                threshold_steps=((None, "green"), (30, "red")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Throughput",
                "Kafka messages read and node batches decoded per second, all replicas. It "
                "should follow the number of agents divided by their send interval; a drop to "
                "0 with agents running means consumption stopped.",
                queries(
                    (_rate("minder_messages_consumed_total"), "messages"),
                    (_rate("minder_batches_consumed_total"), "batches"),
                ),
                unit="cps",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Samples consumed",
                "Metric samples placed in job windows per second, all replicas: the load the "
                "detector works on (agents x metrics x devices per interval).",
                queries((_rate("minder_samples_consumed_total"), "samples")),
                unit="cps",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Assigned partitions per replica",
                "Partitions of the metrics topic each replica owns in the consumer group. "
                "Summed over the replicas it equals the topic's partition count; a replica at "
                "0 is idle (more replicas than partitions), a dip is a rebalance (a replica "
                "started or stopped).",
                queries(("max by (instance) (minder_assigned_partitions)", "{{instance}}")),
                unit="none",
                decimals=0,
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Decode failures, dead letters, rejected batches, retried polls",
                "Per second, by reason: messages that could not be decoded, messages written "
                "to the dead-letter topic, decoded batches the service refused (future_timestamp: "
                "a node's clock is far ahead), and polls consumed again because detection raised "
                "or a dead letter could not be written. Normally all 0; a rising line names what "
                "is wrong (an agent of another version, a clock far off, corrupt data, a bug). "
                "Dead letters raise MinderDeadLettersRising.",
                queries(
                    (_rate("minder_decode_failures_total", "reason"), "decode failure: {{reason}}"),
                    (_rate("minder_dead_letters_total", "reason"), "dead letter: {{reason}}"),
                    (_rate("minder_batches_rejected_total", "reason"), "rejected: {{reason}}"),
                    (_rate("minder_handler_failures_total"), "poll retried: detection raised"),
                    (_rate("minder_deadletter_failures_total"), "poll retried: dead letter unsent"),
                ),
                unit="cps",
                min_val=0,
            )
        )
        .with_row(row("Detection"))
        .with_panel(
            timeseries_panel(
                "Evaluation time",
                "CPU time of one detection pass over one job-second, median and 99th "
                "percentile over all jobs and replicas. It must stay well below 1 s, or "
                "detection falls behind the data (evaluation age rises in the job drill-down).",
                queries(
                    (
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(minder_evaluation_seconds_bucket[{PER_SECOND}])))",
                        "p99",
                    ),
                    (
                        "histogram_quantile(0.5, sum by (le) "
                        f"(rate(minder_evaluation_seconds_bucket[{PER_SECOND}])))",
                        "p50",
                    ),
                ),
                unit="s",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Alerts stored and suppressed",
                "Per minute: new alerts written to the alert store by outcome (ok; error: the "
                "write failed and is retried; dropped: too many alerts waited for a failing "
                "store and the oldest was lost), and alerts not raised because their machine "
                "already has an open alert (the same episode). Every stored alert is then "
                "delivered through the outbox below.",
                queries(
                    (
                        "60 * sum by (outcome) (rate(minder_alert_deliveries_total"
                        f'{{sink="store"}}[{PER_SECOND}]))',
                        "store: {{outcome}}",
                    ),
                    (
                        f"60 * sum (rate(minder_alerts_suppressed_total[{PER_SECOND}]))",
                        "suppressed (machine already alerted)",
                    ),
                ),
                unit="epm",
                min_val=0,
            )
        )
        .with_row(row("Outbox deliveries"))
        .with_panel(
            timeseries_panel(
                "Deliveries by destination and outcome",
                "Outbox delivery attempts per minute, all replicas, by destination (kafka, "
                "webhook:<name>, alertmanager, action:<target>) and outcome: delivered; retry "
                "(the receiver failed or timed out, tried again with backoff); expired (given "
                "up: refused for good or past its time to live); held (not due yet: an action "
                "waits until its alert has stayed open for the hold of its kind; no attempt is "
                "counted). Retries that keep coming raise "
                "MinderDeliveriesFailing, expiries MinderDeliveriesExpired.",
                queries(
                    (
                        "60 * sum by (destination, outcome) "
                        f"(rate(minder_outbox_deliveries_total[{PER_SECOND}]))",
                        "{{destination}} {{outcome}}",
                    )
                ),
                unit="epm",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Pending deliveries per destination",
                "Outbox rows not delivered yet, per destination (read from the database, the "
                "same on every replica). Near 0 is healthy; a destination whose backlog only "
                "grows has a receiver that is down or refuses (see its retries on the left).",
                queries(("max by (destination) (minder_outbox_pending)", "{{destination}}")),
                unit="short",
                decimals=0,
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Oldest pending delivery",
                "Age of the oldest undelivered row per destination (0 when none). Rows held "
                "on purpose before an action wait up to the hold of their alert kind (120 s "
                "by default); past 600 s (dashed) MinderDeliveryBacklog fires: that receiver "
                "hears of new alerts late or not at all.",
                queries(
                    (
                        "max by (destination) (minder_outbox_oldest_pending_age_seconds)",
                        "{{destination}}",
                    )
                ),
                unit="s",
                min_val=0,
                threshold_steps=((None, "green"), (600, "red")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Expired deliveries per destination",
                "Outbox rows given up per destination (permanently refused, or not delivered "
                "within the delivery time to live, 24 h by default). Each step up is an alert "
                "event that destination never received: find it in the API's deliveries and "
                "fix the receiver (MinderDeliveriesExpired).",
                queries(("max by (destination) (minder_outbox_expired)", "{{destination}}")),
                unit="short",
                decimals=0,
                min_val=0,
            )
        )
        .with_row(row("Scheduler actions"))
        .with_panel(
            timeseries_panel(
                "Actions by operation and outcome",
                "Scheduler action decisions per minute (drain/resume on Slurm, cordon/uncordon "
                "on Kubernetes) by outcome: applied, unchanged (the node was already so), "
                "dry_run (log-only mode: audited, nothing executed), failed (the scheduler "
                "command failed; retried when the error is transient), skipped_policy (alert "
                "kind not acted on, or alert no longer open), skipped_opt_out (the job opted "
                "out), skipped_breaker. No data when actions are not configured "
                "(MINDER_ACTIONS__TARGET=none) or before the first decision.",
                queries(
                    (
                        "60 * sum by (operation, outcome) "
                        f"(rate(minder_actions_total[{PER_SECOND}]))",
                        "{{operation}} {{outcome}}",
                    )
                ),
                unit="epm",
                min_val=0,
                span=18,
            )
        )
        .with_panel(
            stat_panel(
                "Actions circuit breaker",
                "TRIPPED (red) when too many machines were taken out within the breaker's "
                "window (per job or share of the fleet): no action is taken until an operator "
                "resets the breaker through the API (MinderActionsBreakerTripped). No data "
                "when actions are not configured.",
                queries(("max(minder_actions_breaker_tripped)", "breaker")),
                unit="none",
                span=6,
                height=8,
                graph=False,
                mappings=[value_text({"0": ("closed", "green"), "1": ("TRIPPED", "red")})],
                threshold_steps=((None, "green"), (1, "red")),
            )
        )
        .with_row(row("Self-checks"))
        .with_panel(
            stat_panel(
                "Self-checks in progress",
                "Self-checks of drained nodes launched on the scheduler and waiting for their "
                "verdict, per target (minder_selfchecks_in_progress: a Slurm job pinned to the "
                "node under a MAINT reservation, or a Kubernetes Job with nodeName). A count that "
                "stays up longer than the check timeout means checks hang or their reports do "
                "not reach the API. No data when self-checks are not configured.",
                queries(("max by (target) (minder_selfchecks_in_progress)", "{{target}}")),
                unit="none",
                span=6,
                height=6,
                decimals=0,
                text_mode=common_m.BigValueTextMode.VALUE_AND_NAME,
            )
        )
        .with_panel(
            stat_panel(
                "Self-check outcomes over the range",
                "Self-checks that ended within the dashboard's time range, by state "
                "(minder_selfchecks_total): passed (the node was returned to scheduling and its "
                "alert cleared_by_selfcheck), failed (the node stays out, the alert is "
                "confirmed), inconclusive (a check crashed or none could run) and timed_out (no "
                "report in time): both keep the node out and notify; cancelled (by a person). "
                "Many inconclusive or timed-out checks point at the check itself, not the "
                "nodes.",
                queries(
                    (
                        f"sum by (state) (increase(minder_selfchecks_total[{RANGE}]))",
                        "{{state}}",
                    )
                ),
                unit="none",
                span=10,
                height=6,
                graph=False,
                decimals=0,
                text_mode=common_m.BigValueTextMode.VALUE_AND_NAME,
            )
        )
        .with_panel(
            stat_panel(
                "Drain to return",
                "Time from Minder draining a node to the node back in service after a passed "
                "self-check, median and 90th percentile over the checks that passed within the "
                "dashboard's time range (minder_selfcheck_drain_to_return_seconds). It is what a "
                "wrongly drained node costs: the wait for its job to leave, a free slot, the "
                "check itself and the service's reaction. No value when no node came back in "
                "the range.",
                queries(
                    (_drain_to_return(0.5), "median"),
                    (_drain_to_return(0.9), "p90"),
                ),
                unit="s",
                span=8,
                height=6,
                graph=False,
                text_mode=common_m.BigValueTextMode.VALUE_AND_NAME,
            )
        )
    )


def _drain_to_return(quantile: float) -> str:
    """A quantile of the drain-to-return time over the checks that passed in the range."""
    return (
        f"histogram_quantile({quantile:g}, sum by (le) "
        f"(increase(minder_selfcheck_drain_to_return_seconds_bucket[{RANGE}])))"
    )
