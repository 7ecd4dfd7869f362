"""``minder-job``: one job's machines, their scores, its ranks' slowdown and lateness, and one
machine against its peers."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import dashboard as dm

from dashboards.panels import (
    PrometheusAnnotation,
    bargauge_panel,
    custom_variable,
    fill_between,
    heatmap_panel,
    new_dashboard,
    queries,
    query,
    query_variable,
    row,
    series_style,
    stat_panel,
    table_panel,
    timeseries_panel,
    value_text,
)
from minder.core.metrics import METRICS, MetricKind

UID = "minder-job"
TITLE = "Minder / Job drill-down"

SCORE_THRESHOLD = 6.0
"""Default detection threshold (``detection.threshold`` of the service settings)."""

AGENT_METRICS = [
    name for name, spec in METRICS.items() if spec.kind is not MetricKind.COUNT and not spec.derived
]
"""Canonical metrics the agents export as ``minder_node_<metric>`` gauges (levels and rates).

The ``_count`` metrics are counters (``..._total``) that need ``rate()``; they are left out.
"""

MACHINE_SERIES_PER_JOB = 4_096
"""The default bound of ``minder_machine_score_all`` and ``minder_rank_lateness_seconds`` per
job (``MINDER_DETECTION__MACHINE_SERIES_PER_JOB``)."""

SLOWDOWN_WARN, SLOWDOWN_BAD = 1.05, 1.10
SLOWDOWN_STEPS = ((None, "green"), (SLOWDOWN_WARN, "orange"), (SLOWDOWN_BAD, "red"))
"""The live-S panels' colours: the persistent straggler rule's excess, then the what-if's."""
"""Live S: 5 % is the persistent straggler rule's excess; from 1.10 the what-if verdict names a
cause (9 % of the job's GPU time lost)."""

JOB = 'job_id="$job_id"'
LIVE_S = f"max(minder_job_live_slowdown{{{JOB}}})"
"""The job's live slowdown S, in the Stragglers row's stat and over time."""
MACHINE = 'job_id="$job_id", machine="$machine"'
PEERS = 'job_id="$job_id", machine!="$machine"'


def _peer_quantile(q: float) -> str:
    return f"quantile({q}, avg by (machine) (minder_node_${{metric}}{{{PEERS}}}))"


def build() -> dashboard.Dashboard:
    """The job drill-down dashboard."""
    threshold_steps = ((None, "green"), (SCORE_THRESHOLD, "red"))
    return (
        new_dashboard(
            UID,
            TITLE,
            "One job: its machines' anomaly scores over time, and one machine's metrics "
            "against the median and 10-90 % band of its peers.",
        )
        .with_variable(
            query_variable(
                "job_id",
                "Job",
                "label_values(minder_job_machines, job_id)",
                "Jobs with a live detection window",
            )
        )
        .with_variable(
            query_variable(
                "machine",
                "Machine",
                f"label_values(minder_machine_score_all{{{JOB}}}, machine)",
                "Every machine of the job, a silent one too (up to 4,096 per job, "
                "MINDER_DETECTION__MACHINE_SERIES_PER_JOB; the highest scores beyond)",
            )
        )
        .with_variable(
            custom_variable(
                "metric",
                "Metric",
                AGENT_METRICS,
                "Agent metric compared with the peers (series minder_node_<metric>)",
            )
        )
        .annotation(
            PrometheusAnnotation(
                "Open alerts (job)",
                f"max by (kind) (minder_open_alerts{{{JOB}}}) > 0",
                title_format="{{kind}} alert open in the job",
                tag_keys="kind",
                text_format="open alerts of this kind: {{value}}",
            )
        )
        .with_row(row("Job $job_id"))
        .with_panel(
            stat_panel(
                "Machines",
                "Machines in the job's detection window. Fewer than the job's allocation means "
                "some agents do not report.",
                queries((f"max(minder_job_machines{{{JOB}}})", "machines")),
                unit="none",
                span=6,
                decimals=0,
            )
        )
        .with_panel(
            stat_panel(
                "Open alerts",
                "Alerts of this job that are open or acknowledged, all kinds. Red from 1: see "
                "the alert regions drawn on the time series below and the Minder API for the "
                "machines named.",
                queries((f"sum(max by (kind) (minder_open_alerts{{{JOB}}}))", "open")),
                unit="none",
                span=6,
                decimals=0,
                threshold_steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            stat_panel(
                "Data age",
                "Seconds since the job's newest sample reached the service. Stays near the "
                "agents' interval while data flows; red past 300 s (no data from the job).",
                queries(
                    (f"time() - max(minder_job_last_sample_timestamp_seconds{{{JOB}}})", "age")
                ),
                unit="s",
                span=6,
                threshold_steps=((None, "green"), (60, "orange"), (300, "red")),
            )
        )
        .with_panel(
            stat_panel(
                "Evaluation age",
                "Seconds since the detector last evaluated this job. Red past 120 s while data "
                "is fresh means detection stalled for this job (MinderDetectionStalled).",
                queries(
                    (
                        f"time() - max(minder_job_last_evaluation_timestamp_seconds{{{JOB}}})",
                        "age",
                    )
                ),
                unit="s",
                span=6,
                threshold_steps=((None, "green"), (60, "orange"), (120, "red")),
            )
        )
        .with_panel(
            heatmap_panel(
                "Machine scores",
                "One row per machine of the job (minder_machine_score_all: every machine up "
                "to 4,096 per job, the highest scores beyond; "
                "MINDER_DETECTION__MACHINE_SERIES_PER_JOB lowers the bound), one cell per time "
                "step; the colour is the machine's score "
                "(highest robust peer z-score over all metrics at each evaluation, 0 for a "
                "machine without one: silent or new). Healthy machines stay pale; a machine that "
                "turns dark and stays dark for the continuity time (score above the detection "
                "threshold, 6 by default) is what Minder alerts on. A whole column turning dark "
                "is a job-wide event, not one faulty machine.",
                query(f"max by (machine) (minder_machine_score_all{{{JOB}}})", "{{machine}}"),
                unit="none",
                height=12,
                color_max=2 * SCORE_THRESHOLD,
            )
        )
        .with_panel(
            bargauge_panel(
                "Highest scores now",
                "The ten machines of the job with the highest score at the end of the time "
                "range (from minder_machine_score, the top 20 of each job). Red bars are above "
                "the detection threshold (6 by default).",
                [
                    query(
                        f"topk(10, max by (machine) (minder_machine_score{{{JOB}}}))",
                        "{{machine}}",
                        instant=True,
                    )
                ],
                unit="none",
                threshold_steps=threshold_steps,
                min_val=0,
            )
        )
        .with_panel(
            timeseries_panel(
                "Open alerts by kind",
                "Open or acknowledged alerts of this job per kind (rule, similarity, "
                "straggler, silence) over time; the same periods are drawn as red regions on "
                "the other time series of this dashboard.",
                queries((f"max by (kind) (minder_open_alerts{{{JOB}}})", "{{kind}}")),
                unit="none",
                decimals=0,
                min_val=0,
                stacked=True,
                fill_opacity=30,
            )
        )
        .with_row(row("Stragglers: live slowdown and rank lateness"))
        .with_panel(
            stat_panel(
                "Live slowdown S",
                "The job's live slowdown S from its ranks' step and busy times: observed step "
                "time over the balanced step time (1 = no straggler; minder_job_live_slowdown). "
                "Orange from 1.05 (the persistent straggler rule's excess), red from 1.10 (the "
                "what-if verdict names a cause: 9 % of the job's GPU time lost). No data: the "
                "job reports no step times (train_step_seconds, train_busy_seconds).",
                queries((LIVE_S, "S")),
                unit="none",
                span=4,
                height=8,
                decimals=3,
                threshold_steps=SLOWDOWN_STEPS,
            )
        )
        .with_panel(
            timeseries_panel(
                "Live slowdown S over time",
                "The job's live S over time (dashed: 1.05 and 1.10). A step up that stays is a "
                "straggler slowing the whole job: the lateness heatmap below names its ranks. "
                "Everyone slower together (a checkpoint, an evaluation phase) leaves S at 1.",
                queries((LIVE_S, "S")),
                unit="none",
                span=10,
                min_val=1,
                decimals=3,
                threshold_steps=SLOWDOWN_STEPS,
            )
        )
        .with_panel(
            timeseries_panel(
                "Straggler alerts",
                "Open or acknowledged straggler alerts of this job over time "
                "(minder_open_alerts, kind straggler): a rank, or a pipeline stage, slower than "
                "its peers for long enough (persistent, transient or intermittent). The alerts "
                "name the machine and rank, with the rank's lateness and S, in the Minder API; "
                "straggler alerts notify only, the scheduler actions do not act on them.",
                queries(
                    (
                        f'max(minder_open_alerts{{{JOB}, kind="straggler"}})',
                        "open straggler alerts",
                    )
                ),
                unit="none",
                span=10,
                min_val=0,
                decimals=0,
                fill_opacity=30,
                threshold_steps=((None, "green"), (1, "red")),
            )
        )
        .with_panel(
            heatmap_panel(
                "Rank lateness",
                "One row per rank (machine and device), one cell per time step; the colour is "
                "how long the rank's peers waited for it per step (train_lateness_seconds: its "
                "peer group's median collective time less its own; "
                "minder_rank_lateness_seconds). Every rank of the job up to 4,096 (the latest "
                "beyond), in synchronous jobs with step and collective times. One dark row is a "
                "straggling rank; a dark band of rows is a slow machine, stage or switch; "
                "MegaScale's per-rank view.",
                query(
                    f"max by (machine, device) (minder_rank_lateness_seconds{{{JOB}}})",
                    "{{machine}} {{device}}",
                ),
                unit="s",
                span=16,
                height=10,
            )
        )
        .with_panel(
            bargauge_panel(
                "Latest ranks now",
                "The ten ranks the job waited for longest per step at the end of the time "
                "range (seconds of their peers' wait per step).",
                [
                    query(
                        "topk(10, max by (machine, device) "
                        f"(minder_rank_lateness_seconds{{{JOB}}}))",
                        "{{machine}} {{device}}",
                        instant=True,
                    )
                ],
                unit="s",
                span=8,
                height=10,
                min_val=0,
            )
        )
        .with_row(row("Hang"))
        .with_panel(
            stat_panel(
                "Hung",
                "HUNG while the job's latest hang analysis says every rank waits in a "
                "collective that some rank never joined (from the ranks' flight-recorder "
                "dumps; without dumps, while the job-level hang alert is open). The table "
                "beside it names the ranks the hang waits on; GET /api/v1/jobs/<job>/hang "
                "gives the whole analysis.",
                queries((f"max(minder_job_hang{{{JOB}}})", "hung")),
                unit="none",
                span=6,
                height=6,
                decimals=0,
                threshold_steps=((None, "green"), (1, "red")),
                mappings=[value_text({"0": ("no", "green"), "1": ("HUNG", "red")})],
            )
        )
        .with_panel(
            table_panel(
                "Hang culprits",
                "The ranks the job's hang waits on (its latest analysis, while hung; the first "
                "32 by rank): the machine each runs on, its process group, and why it is "
                "named: not_joined (it never entered the collective the rest of its group "
                "waits in), no_dump (the group waits for it and it wrote no dump: killed, or "
                "stuck holding the GIL), mismatch (it entered it with another op, size or "
                "dtype), stopped_first (no flight recorder: its steps stopped first). Each "
                "culprit's machine has a hang alert of its own, which the scheduler actions "
                "act on.",
                [
                    query(
                        f"max by (rank, machine, group, reason) (minder_hang_culprit{{{JOB}}})",
                        instant=True,
                        as_table=True,
                    )
                ],
                rename={"rank": "Rank", "machine": "Machine", "group": "Group", "reason": "Why"},
                span=18,
                height=6,
            )
        )
        .with_row(row("Machine $machine"))
        .with_panel(
            timeseries_panel(
                "Score of $machine",
                "The selected machine's score against the job's median score. The dashed "
                "line is the detection threshold (6 by default); a score that stays above it "
                "for the continuity time raises a similarity alert.",
                queries(
                    (f"max(minder_machine_score_all{{{MACHINE}}})", "$machine"),
                    (
                        f"quantile(0.5, max by (machine) (minder_machine_score_all{{{JOB}}}))",
                        "job median",
                    ),
                ),
                unit="none",
                span=24,
                min_val=0,
                threshold_steps=threshold_steps,
            )
            .override_by_query("A", series_style("red", 2))
            .override_by_query("B", series_style("blue", 1, dashed=True))
        )
        .with_panel(
            timeseries_panel(
                "$metric: $machine against its peers",
                "The selected agent metric of the selected machine (averaged over its "
                "devices, red) against the other machines of the job: their median (dashed) "
                "and the band from their 10th to 90th percentile (shaded). A machine outside "
                "the band while the band is narrow is the outlier Minder looks for; a wide "
                "band means the job's machines disagree anyway. The unit is the suffix of the "
                "metric's name (ratio, watts, celsius, bytes_per_second ...).",
                queries(
                    (f"avg by (machine) (minder_node_${{metric}}{{{MACHINE}}})", "{{machine}}"),
                    (_peer_quantile(0.5), "peer median"),
                    (_peer_quantile(0.9), "peer p90"),
                    (_peer_quantile(0.1), "peer p10"),
                ),
                unit="short",
                span=24,
                height=10,
                legend_calcs=("lastNotNull", "mean"),
            )
            .override_by_query("A", series_style("red", 2))
            .override_by_query("B", series_style("blue", 1, dashed=True))
            .override_by_name("peer p90", fill_between("peer p10"))
            .override_by_name(
                "peer p10",
                [
                    dm.DynamicConfigValue(id_val="custom.lineWidth", value=0),
                    dm.DynamicConfigValue(
                        id_val="color", value={"mode": "fixed", "fixedColor": "blue"}
                    ),
                ],
            )
        )
        .with_panel(
            timeseries_panel(
                "$metric per device of $machine",
                "The selected metric on each device (GPU, NIC) of the selected machine; host "
                "metrics have one series with an empty device. One device apart from the "
                "others points at that GPU or NIC rather than the whole machine.",
                queries((f"max by (device) (minder_node_${{metric}}{{{MACHINE}}})", "{{device}}")),
                unit="short",
                span=24,
                legend_calcs=("lastNotNull", "mean"),
            )
        )
    )
