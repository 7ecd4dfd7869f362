"""``minder-whatif``: straggler slowdown and waste per job from the what-if analyses."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.panels import (
    bargauge_panel,
    new_dashboard,
    queries,
    query,
    row,
    table_panel,
    timeseries_panel,
)

UID = "minder-whatif"
TITLE = "Minder / What-if"

STRAGGLING_S = 1.10
"""S from which the verdict names a cause instead of ``none`` (docs/whatif-method.md §3.6)."""


def build() -> dashboard.Dashboard:
    """The what-if analysis dashboard."""
    return (
        new_dashboard(
            UID,
            TITLE,
            "Results of the what-if straggler analyses: slowdown S, wasted GPU time and the "
            "verdict of each job's latest report, and the reports' outcomes.",
        )
        .with_row(row("Latest report per job"))
        .with_panel(
            timeseries_panel(
                "Slowdown S per job",
                "S = T_orig / T_ideal of each job's latest what-if report: how much longer a "
                "step takes than it would with every op at its ideal duration. 1.0 is no "
                "straggling; from 1.10 (dashed) the verdict names a cause. The line steps when "
                "a new report of the job completes.",
                queries(("max by (job_id) (minder_whatif_slowdown)", "{{job_id}}")),
                unit="none",
                decimals=3,
                min_val=1,
                threshold_steps=((None, "green"), (STRAGGLING_S, "red")),
            )
        )
        .with_panel(
            timeseries_panel(
                "Waste per job",
                "Share of the job's GPU time lost to stragglers, 1 - 1/S, of its latest report. "
                "Multiply by the job's GPU count and run time for GPU-hours lost; 9 % "
                "corresponds to S = 1.10.",
                queries(("max by (job_id) (minder_whatif_waste_ratio)", "{{job_id}}")),
                unit="percentunit",
                min_val=0,
                threshold_steps=((None, "green"), (1 - 1 / STRAGGLING_S, "red")),
            )
        )
        .with_panel(
            table_panel(
                "Latest verdict per job",
                "The root cause named by each job's latest report: none (S < 1.10), worker "
                "(a few slow workers: check those machines), communication, stage (pipeline "
                "partitioning), sequence_length, undetermined, or unreliable (the trace does "
                "not explain the step time).",
                [
                    query(
                        "max by (job_id, verdict) (minder_whatif_verdict_info == 1)",
                        instant=True,
                        as_table=True,
                    )
                ],
                rename={"job_id": "Job", "verdict": "Verdict"},
            )
        )
        .with_panel(
            bargauge_panel(
                "Highest waste now",
                "The ten jobs whose latest report wastes the largest share of GPU time; red "
                "past the waste of S = 1.10.",
                [
                    query(
                        "topk(10, max by (job_id) (minder_whatif_waste_ratio))",
                        "{{job_id}}",
                        instant=True,
                    )
                ],
                unit="percentunit",
                threshold_steps=((None, "green"), (1 - 1 / STRAGGLING_S, "red")),
                min_val=0,
                max_val=1,
            )
        )
        .with_row(row("Reports"))
        .with_panel(
            timeseries_panel(
                "Reports by status",
                "What-if reports that reached each status (pending, running, done, failed) "
                "per time step. A steady 'failed' line means uploads or analyses fail: check "
                "the API's what-if endpoints and the service log.",
                queries(
                    (
                        "sum by (status) (increase(minder_whatif_reports_total[$__rate_interval]))",
                        "{{status}}",
                    )
                ),
                unit="none",
                min_val=0,
                span=24,
            )
        )
    )
