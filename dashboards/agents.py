"""``minder-agents``: the node agents: who reports, how long collection takes, spool and sending."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.panels import (
    new_dashboard,
    queries,
    row,
    stat_panel,
    textbox_variable,
    timeseries_panel,
)

UID = "minder-agents"
TITLE = "Minder / Agent fleet"

PER_SECOND = "$__rate_interval"
FILL = "minder_agent_spool_bytes / minder_agent_spool_max_bytes"
SPOOL_STEPS = ((None, "green"), (0.5, "orange"), (0.8, "red"))
AGE_STEPS = ((None, "green"), (60, "orange"), (300, "red"))


def build() -> dashboard.Dashboard:
    """The agent fleet dashboard."""
    return (
        new_dashboard(
            UID,
            TITLE,
            "Minder's node agents: how many report, collection time and errors per source, "
            "the on-disk spool, and batches sent, failed and dropped.",
        )
        .with_variable(
            textbox_variable(
                "agent_job",
                "Agent scrape job",
                "minder-agent",
                "Prometheus scrape job (job label) of the node agents' /metrics",
            )
        )
        .with_row(row("Agents"))
        .with_panel(
            stat_panel(
                "Agents reporting",
                "Node agents Prometheus currently scrapes (count of minder_agent_info). It "
                "should equal the machines of all running jobs; compare with 'Machines "
                "watched' of the fleet dashboard.",
                queries(("count(minder_agent_info)", "agents")),
                unit="none",
                span=6,
                decimals=0,
            )
        )
        .with_panel(
            stat_panel(
                "Agent targets down",
                "Agent scrape targets of the 'Agent scrape job' variable that Prometheus "
                "cannot scrape (up == 0): the agent process or its machine is down "
                "(MinderAgentDown). Red from 1.",
                queries(('count(up{job="$agent_job"} == 0) or vector(0)', "down")),
                unit="none",
                span=6,
                decimals=0,
                threshold_steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            stat_panel(
                "Stalest agent",
                "Seconds since the agent with the oldest last batch collected (time() - "
                "minder_agent_last_collection_timestamp_seconds, worst machine). Near the "
                "collection interval is healthy; orange past 60 s, red past 300 s: that "
                "agent's collection loop hangs.",
                queries(
                    ("max(time() - minder_agent_last_collection_timestamp_seconds)", "stalest")
                ),
                unit="s",
                span=6,
                threshold_steps=AGE_STEPS,
            )
        )
        .with_panel(
            stat_panel(
                "Fullest spool",
                "Fill of the fullest agent spool (unsent bytes / spool limit). Batches pile "
                "up in the spool while Kafka cannot be reached; at 100 % the oldest are "
                "dropped. Red past 80 % (MinderAgentSpoolFilling).",
                queries((f"max({FILL})", "fill")),
                unit="percentunit",
                span=6,
                threshold_steps=SPOOL_STEPS,
            )
        )
        .with_panel(
            timeseries_panel(
                "Agents reporting per job",
                "Agents per Minder job (count of minder_agent_info by job_id). A job's line "
                "dropping while it runs names the job that lost machines.",
                queries(("count by (job_id) (minder_agent_info)", "{{job_id}}")),
                unit="none",
                decimals=0,
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Time since last collection (10 stalest)",
                "Seconds since each agent's last batch, for the ten stalest machines. A "
                "sawtooth up to the collection interval is normal; a line that keeps rising "
                "is an agent that stopped collecting but is still scraped.",
                queries(
                    (
                        "topk(10, time() - max by (job_id, machine) "
                        "(minder_agent_last_collection_timestamp_seconds))",
                        "{{job_id}}/{{machine}}",
                    )
                ),
                unit="s",
                min_val=0,
                threshold_steps=AGE_STEPS,
            )
        )
        .with_row(row("Collection"))
        .with_panel(
            timeseries_panel(
                "Collect time per source (slowest machine)",
                "Duration of each source's last collection (NVML/DCGM, RDMA, host ...), the "
                "slowest machine per source. A source approaching the collection interval "
                "delays every batch of that agent.",
                queries(("max by (source) (minder_agent_collect_seconds)", "{{source}}")),
                unit="s",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Slowest collections (10 machines)",
                "The ten machines whose slowest source takes longest to collect. One machine "
                "far above the others often has a sick driver or device itself.",
                queries(
                    (
                        "topk(10, max by (job_id, machine) (minder_agent_collect_seconds))",
                        "{{job_id}}/{{machine}}",
                    )
                ),
                unit="s",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Source errors",
                "Problems per second by source and reason, all agents (the sources' own "
                "reasons, exception, invalid_sample, duplicate). A source that errors on every "
                "collection delivers no metrics, so its faults go undetected.",
                queries(
                    (
                        "sum by (source, reason) "
                        f"(rate(minder_agent_source_errors_total[{PER_SECOND}]))",
                        "{{source}}: {{reason}}",
                    )
                ),
                unit="cps",
                min_val=0,
                span=24,
            )
        )
        .with_row(row("Sending and spool"))
        .with_panel(
            timeseries_panel(
                "Batches sent per job",
                "Batches the Kafka broker acknowledged per second, per job. It should equal the "
                "job's agents divided by the collection interval.",
                queries(
                    (
                        f"sum by (job_id) (rate(minder_agent_batches_sent_total[{PER_SECOND}]))",
                        "{{job_id}}",
                    )
                ),
                unit="cps",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Send errors and drops per job",
                "Failed delivery attempts (retried from the spool) and batches dropped from a "
                "full spool, per second and job. Send errors alone mean Kafka is unreachable "
                "for a while; drops mean data is lost (MinderAgentDroppingBatches).",
                queries(
                    (
                        f"sum by (job_id) (rate(minder_agent_send_errors_total[{PER_SECOND}]))",
                        "send errors {{job_id}}",
                    ),
                    (
                        f"sum by (job_id) (rate(minder_agent_dropped_oldest_total[{PER_SECOND}]))",
                        "dropped {{job_id}}",
                    ),
                ),
                unit="cps",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Spool size (10 largest)",
                "Bytes of unsent batches in the spool of the ten agents with the most. Zero is "
                "normal; it grows while Kafka cannot be reached and drains afterwards.",
                queries(
                    (
                        "topk(10, max by (job_id, machine) (minder_agent_spool_bytes))",
                        "{{job_id}}/{{machine}}",
                    )
                ),
                unit="bytes",
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Spool fill (10 fullest)",
                "Unsent bytes as a share of each agent's spool limit, ten fullest agents. At "
                "100 % the oldest batches are dropped; dashed lines at 50 % and 80 %.",
                queries((f"topk(10, max by (job_id, machine) ({FILL}))", "{{job_id}}/{{machine}}")),
                unit="percentunit",
                min_val=0,
                max_val=1,
                threshold_steps=SPOOL_STEPS,
            )
        )
    )
