from __future__ import annotations

import pytest

from minder.core.alert import Alert, AlertKind, AlertStatus, make_alert_id
from minder.core.errors import UnknownMetricError, ValidationError
from minder.core.metrics import METRICS, DeviceFamily, MetricKind, validate_sample


def test_every_name_carries_its_unit() -> None:
    suffixes = (
        "_ratio",
        "_bytes",
        "_seconds",
        "_watts",
        "_celsius",
        "_hertz",
        "_per_second",
        "_count",
        "_gen",
        "_width",
        "_up",
        "_reasons",
        "_number",
    )
    assert all(name.endswith(suffixes) for name in METRICS)
    assert len(METRICS) == 44


def test_straggler_metrics_are_per_rank_gauges() -> None:
    busy, number = METRICS["train_busy_seconds"], METRICS["train_step_number"]
    step = METRICS["train_step_seconds"]
    assert (busy.unit, busy.kind, busy.family) == (step.unit, step.kind, step.family)
    assert (number.unit, number.kind, number.family) == ("1", MetricKind.GAUGE, DeviceFamily.RANK)
    assert validate_sample("train_busy_seconds", "rank3", 0.42) is busy
    assert validate_sample("train_step_number", "rank0", 123456.0) is number
    with pytest.raises(ValidationError, match="expected 'rank0'"):
        validate_sample("train_busy_seconds", "gpu3", 0.42)
    with pytest.raises(ValidationError, match=r"got value -1\.0"):
        validate_sample("train_step_number", "rank0", -1.0)


def test_validator_names_close_matches() -> None:
    with pytest.raises(UnknownMetricError, match="did you mean 'gpu_power_watts'"):
        validate_sample("gpu_power_watt", "gpu0", 10.0)
    with pytest.raises(ValidationError, match=r"expected a finite number in \[0, 1\]"):
        validate_sample("cpu_util_ratio", "", 1.5)
    assert validate_sample("rdma_port_up", "mlx5_0", 1.0).unit == "1"


def test_alert_id_is_stable_and_status_follows_the_life_cycle() -> None:
    a = Alert("j", "n1", AlertKind.RULE, "gpu_xid_count", 1.0, 100.7, 101.0, devices=("gpu1",))
    b = Alert("j", "n1", AlertKind.RULE, "gpu_xid_count", 3.0, 100.2, 130.0)
    assert a.id == b.id == make_alert_id("j", "n1", AlertKind.RULE, "gpu_xid_count", 100)
    acked = a.with_status(AlertStatus.ACKNOWLEDGED)
    assert acked.with_status(AlertStatus.RESOLVED).status is AlertStatus.RESOLVED
    with pytest.raises(ValidationError, match="cannot go from 'resolved' to 'open'"):
        acked.with_status(AlertStatus.RESOLVED).with_status(AlertStatus.OPEN)
    assert Alert.from_dict(a.to_dict()) == a
    with pytest.raises(ValidationError, match="missing field 'kind'"):
        Alert.from_dict({"job": "j"})
