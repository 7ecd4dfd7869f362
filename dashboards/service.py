"""``minder-service``: health of the detection service (Kafka consumption, detection, delivery)."""

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
            "failures and dead letters, detection time and alert deliveries.",
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
                "Decode failures, dead letters and rejected batches",
                "Per second, by reason: messages that could not be decoded, messages written "
                "to the dead-letter topic, and decoded batches the service refused. Normally "
                "all 0; a rising reason names what is wrong (an agent of another version, a "
                "clock far off, corrupt data). Dead letters raise MinderDeadLettersRising.",
                queries(
                    (_rate("minder_decode_failures_total", "reason"), "decode failure: {{reason}}"),
                    (_rate("minder_dead_letters_total", "reason"), "dead letter: {{reason}}"),
                    (_rate("minder_batches_rejected_total", "reason"), "rejected: {{reason}}"),
                ),
                unit="cps",
                min_val=0,
                span=24,
            )
        )
        .with_row(row("Detection and delivery"))
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
                "Alert deliveries",
                "Alert deliveries per minute by sink (store, webhook ...) and outcome. Any "
                "outcome other than ok/accepted means alerts do not reach that sink: check its "
                "endpoint (MinderAlertDeliveriesFailing).",
                queries(
                    (
                        f"60 * sum by (sink, outcome) "
                        f"(rate(minder_alert_deliveries_total[{PER_SECOND}]))",
                        "{{sink}} {{outcome}}",
                    )
                ),
                unit="epm",
                min_val=0,
            )
        )
    )
