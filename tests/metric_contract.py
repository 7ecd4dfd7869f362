"""The Prometheus metrics Minder exports, spelled out (docs/metrics.md).

Dashboards and alerting rules may use no other ``minder_*`` series, so a renamed metric fails
their tests; histograms are listed by their ``_bucket``/``_sum``/``_count`` series, the names a
query uses. ``tests/deploy`` checks this list against the real exporters' ``/metrics``.
"""

from __future__ import annotations

SERVICE_METRICS = {
    "minder_messages_consumed_total",
    "minder_batches_consumed_total",
    "minder_samples_consumed_total",
    "minder_batches_rejected_total",
    "minder_rejected_total",
    "minder_decode_failures_total",
    "minder_dead_letters_total",
    "minder_processing_lag_seconds",
    "minder_consumer_lag_messages",
    "minder_consumer_offset",
    "minder_machine_score",
    "minder_alerts_total",
    "minder_open_alerts",
    "minder_alert_deliveries_total",
    "minder_jobs",
    "minder_stalled_jobs",
    "minder_machines",
    "minder_job_machines",
    "minder_job_sampling_interval_seconds",
    "minder_membership_changes_total",
    "minder_job_live_slowdown",
    "minder_job_peer_coherence",
    "minder_rank_lateness_seconds",
    # a polled metrics source, when configured (minder.service.prometheus_source.SourceMetrics)
    "minder_source_batches_total",
    "minder_source_errors_total",
    "minder_source_skipped_seconds_total",
    "minder_source_last_timestamp_seconds",
    "minder_job_last_sample_timestamp_seconds",
    "minder_job_last_evaluation_timestamp_seconds",
    "minder_evaluation_seconds_bucket",
    "minder_evaluation_seconds_sum",
    "minder_evaluation_seconds_count",
    "minder_state_writes_total",
    "minder_state_write_seconds_bucket",
    "minder_state_write_seconds_sum",
    "minder_state_write_seconds_count",
    "minder_state_machines_written_total",
    "minder_state_captures_superseded_total",
    "minder_layout_store_total",
    "minder_whatif_slowdown",
    "minder_whatif_waste_ratio",
    "minder_whatif_verdict_info",
    "minder_whatif_reports_total",
    "minder_build_info",
    "minder_assigned_partitions",
    "minder_handler_failures_total",
    "minder_deadletter_failures_total",
    "minder_messages_skipped_total",
    "minder_alerts_suppressed_total",
    # the outbox (minder.delivery.worker.DeliveryMetrics)
    "minder_outbox_deliveries_total",
    "minder_outbox_pending",
    "minder_outbox_oldest_pending_age_seconds",
    "minder_outbox_expired",
    # scheduler actions, when configured (minder.actions.executor.ActionMetrics)
    "minder_actions_total",
    "minder_actions_breaker_tripped",
}
AGENT_METRICS = {
    "minder_agent_info",
    "minder_agent_collections_total",
    "minder_agent_last_collection_timestamp_seconds",
    "minder_agent_source_errors_total",
    "minder_agent_collect_seconds",
    "minder_agent_batches_sent_total",
    "minder_agent_dropped_oldest_total",
    "minder_agent_send_errors_total",
    "minder_agent_spool_bytes",
    "minder_agent_spool_max_bytes",
}
