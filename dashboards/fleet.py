"""``minder-fleet``: every job Minder watches, its alerts and how fresh its data is."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.panels import (
    data_link,
    new_dashboard,
    queries,
    row,
    stat_panel,
    timeseries_panel,
)

UID = "minder-fleet"
TITLE = "Minder / Fleet"

JOB_LINK = (
    "/d/minder-job?var-datasource=${datasource}&var-job_id=${__field.labels.job_id}"
    "&${__url_time_range}"
)
"""Data link of per-job series to the job drill-down, keeping the datasource and time range."""


def build() -> dashboard.Dashboard:
    """The fleet overview dashboard."""
    to_job: list[cogbuilder.Builder[dm.DashboardLink]] = [
        data_link("Open job ${__field.labels.job_id}", JOB_LINK)
    ]
    return (
        new_dashboard(
            UID,
            TITLE,
            "Jobs watched by Minder, open alerts, alert rate and data freshness per job.",
        )
        .with_row(row("Fleet"))
        .with_panel(
            stat_panel(
                "Jobs watched",
                "Jobs that have a live detection window in the Minder service (summed over "
                "service replicas). It should match the number of training jobs whose agents "
                "send data; 0 while agents run means the service consumes nothing.",
                queries(("sum(minder_jobs)", "jobs")),
                unit="none",
                span=6,
                decimals=0,
            )
        )
        .with_panel(
            stat_panel(
                "Machines watched",
                "Machines across all live job windows (summed over service replicas). A drop "
                "without a job ending means machines stopped reporting.",
                queries(("sum(minder_machines)", "machines")),
                unit="none",
                span=6,
                decimals=0,
            )
        )
        .with_panel(
            stat_panel(
                "Open alerts",
                "Alerts open or acknowledged (not yet resolved) over all jobs and kinds. "
                "Anything above 0 is a machine an operator should look at (see the panels "
                "below for which job and kind).",
                queries(("sum(max by (job_id, kind) (minder_open_alerts))", "open alerts")),
                unit="none",
                span=6,
                decimals=0,
                threshold_steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            stat_panel(
                "Stalest job data",
                "Age of the newest sample of the job whose data is oldest: time() minus "
                "minder_job_last_sample_timestamp_seconds. Orange past 60 s, red past 300 s "
                "(the MinderNoDataFromJob alert): that job's agents or its Kafka path stopped.",
                queries(
                    (
                        "max(time() - max by (job_id) (minder_job_last_sample_timestamp_seconds))",
                        "oldest",
                    )
                ),
                unit="s",
                span=6,
                threshold_steps=((None, "green"), (60, "orange"), (300, "red")),
            )
        )
        .with_row(row("Alerts"))
        .with_panel(
            timeseries_panel(
                "Open alerts by job and kind",
                "Open (or acknowledged) alerts per job and alert kind (rule, similarity, "
                "straggler, silence) over time. A step up is a new fault; it steps down when an "
                "operator resolves the alert. Click a series to open that job's drill-down.",
                queries(("max by (job_id, kind) (minder_open_alerts)", "{{job_id}} · {{kind}}")),
                unit="none",
                decimals=0,
                min_val=0,
                stacked=True,
                fill_opacity=30,
            ).data_links(to_job)
        )
        .with_panel(
            timeseries_panel(
                "Alert rate by kind",
                "New alerts raised per minute, by kind, from rate(minder_alerts_total). "
                "Bursts of 'similarity' across many jobs at once point at something shared "
                "(network, storage) rather than single machines.",
                queries(
                    (
                        "60 * sum by (kind) (rate(minder_alerts_total[$__rate_interval]))",
                        "{{kind}}",
                    )
                ),
                unit="epm",
                min_val=0,
            )
        )
        .with_row(row("Jobs"))
        .with_panel(
            timeseries_panel(
                "Data freshness per job",
                "Seconds since the newest sample of each job reached the service (time() - "
                "minder_job_last_sample_timestamp_seconds). It should stay near the agents' "
                "collection interval; a rising line is a job whose data stopped (agents down, "
                "Kafka or consumer lag). Dashed lines at 60 s and 300 s.",
                queries(
                    (
                        "time() - max by (job_id) (minder_job_last_sample_timestamp_seconds)",
                        "{{job_id}}",
                    )
                ),
                unit="s",
                min_val=0,
                threshold_steps=((None, "green"), (60, "orange"), (300, "red")),
            ).data_links(to_job)
        )
        .with_panel(
            timeseries_panel(
                "Machines per job",
                "Machines in each job's detection window (minder_job_machines). A job losing "
                "machines while it runs means some agents stopped sending; a job disappearing "
                "means its window retired. Click a series to open the job's drill-down.",
                queries(("max by (job_id) (minder_job_machines)", "{{job_id}}")),
                unit="none",
                decimals=0,
                min_val=0,
            ).data_links(to_job)
        )
    )
