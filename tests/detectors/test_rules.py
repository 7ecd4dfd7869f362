from __future__ import annotations

from detectors.config import DetectorConfig
from detectors.engine import MinderDetector
from detectors.window import JobWindow
from minder.core.alert import AlertKind
from minder.core.records import Event, EventKind, NodeBatch


def _set(s, metric, dev, value):
    s[(metric, dev)] = value
    return s


def test_xid_count_fires_at_once(run_stream) -> None:
    alerts = run_stream(
        machines=8,
        seconds=40,
        mutate=lambda m, sec, s: (
            _set(s, "gpu_xid_count", "gpu2", 1.0) if (m, sec) == (3, 1020) else s
        ),
    )
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.machine, a.kind, a.metric, a.devices) == (
        "m003",
        AlertKind.RULE,
        "gpu_xid_count",
        ("gpu2",),
    )
    assert a.detected_ts == a.first_ts == 1020
    assert a.evidence["rule"] == "xid"


def test_uncorrectable_ecc_fires_and_later_similarity_is_not_a_second_alert(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 1 and sec == 1020:
            s[("gpu_ecc_dbe_count", "gpu0")] = 2.0
        if m == 1 and sec > 1020:  # the process died: this machine's GPUs go idle
            for g in range(4):
                s[("gpu_util_ratio", f"gpu{g}")] = 0.0
                s[("gpu_power_watts", f"gpu{g}")] = 70.0
        return s

    alerts = run_stream(machines=12, seconds=100, mutate=mutate)
    assert [(a.machine, a.metric) for a in alerts] == [("m001", "gpu_ecc_dbe_count")]


def test_xid_events_fire_with_their_code_except_application_xids(make_window) -> None:
    detector = MinderDetector()
    window: JobWindow = make_window(machines=8, seconds=5)
    window.add_batch(
        NodeBatch("job", "m002", 1004.5, events=[Event(EventKind.XID, "gpu1", 1004.2, code=13)])
    )
    window.add_batch(
        NodeBatch("job", "m006", 1004.5, events=[Event(EventKind.XID, "gpu3", 1004.3, code=79)])
    )
    alerts = detector.evaluate(window, 1004)
    assert [(a.machine, a.devices, a.evidence["code"]) for a in alerts] == [("m006", ("gpu3",), 79)]


def test_gpu_that_stops_reporting_is_lost(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 4 and sec >= 1030:
            for key in [k for k in s if k[1] == "gpu3"]:
                del s[key]
        return s

    alerts = run_stream(machines=10, seconds=60, mutate=mutate)
    assert [(a.machine, a.metric, a.devices) for a in alerts] == [("m004", "gpu_lost", ("gpu3",))]
    assert alerts[0].first_ts == 1030
    # absent for lost_device_s seconds: 1030, 1031, 1032
    assert alerts[0].detected_ts == 1030 + DetectorConfig().lost_device_s - 1


def test_nic_port_down_is_one_alert(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 7 and sec >= 1030:
            s[("rdma_port_up", "mlx5_1")] = 0.0
            s[("rdma_tx_bytes_per_second", "mlx5_1")] = 0.0
            if sec == 1030:
                s[("rdma_link_downed_count", "mlx5_1")] = 1.0
        return s

    alerts = run_stream(machines=16, seconds=80, mutate=mutate, domains=2)
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.machine, a.kind, a.devices) == ("m007", AlertKind.RULE, ("mlx5_1",))
    assert a.first_ts == 1030 and a.detected_ts <= 1030 + DetectorConfig().settle_s


def test_pcie_width_below_peers_fires_after_persisting(run_stream) -> None:
    def mutate(m, sec, s):
        if m == 2 and sec >= 1020:
            s[("gpu_pcie_link_width", "gpu1")] = 8.0
        return s

    alerts = run_stream(machines=8, seconds=40, mutate=mutate)
    assert [(a.machine, a.metric, a.devices) for a in alerts] == [
        ("m002", "gpu_pcie_link_width", ("gpu1",))
    ]
    assert alerts[0].evidence["value"] == 8.0 and alerts[0].evidence["peers"] == 16.0


def test_nvlink_errors_need_repetition(run_stream) -> None:
    def single(m, sec, s):
        if m == 2 and sec == 1020:
            s[("gpu_nvlink_error_count", "gpu1")] = 4.0
        return s

    assert run_stream(machines=8, seconds=40, mutate=single) == []

    def repeated(m, sec, s):
        if m == 2 and sec >= 1020 and sec % 2 == 0:
            s[("gpu_nvlink_error_count", "gpu1")] = 1.0
        return s

    alerts = run_stream(machines=8, seconds=40, mutate=repeated)
    assert [(a.machine, a.metric) for a in alerts] == [("m002", "gpu_nvlink_error_count")]


def test_silent_machine_is_named(run_stream) -> None:
    cfg = DetectorConfig()
    alerts = run_stream(
        machines=16,
        seconds=60,
        domains=4,
        mutate=lambda m, sec, s: None if (m == 9 and sec >= 1025) else s,
    )
    assert [(a.machine, a.kind) for a in alerts] == [("m009", AlertKind.SILENCE)]
    assert alerts[0].first_ts == 1025
    assert alerts[0].detected_ts == 1025 + cfg.silence_s - 1 + cfg.at_interval(1).silence_settle_s


def test_whole_job_going_quiet_blames_nobody(run_stream) -> None:
    assert (
        run_stream(
            machines=8, seconds=60, mutate=lambda m, sec, s: None if sec >= 1030 and m > 0 else s
        )
        == []
    )


def test_switch_outage_is_one_domain_alert(run_stream) -> None:
    # 32 machines on 4 leaf switches; leaf-1 (m008..m015) reboots.
    alerts = run_stream(
        machines=32,
        seconds=70,
        domains=4,
        mutate=lambda m, sec, s: None if (8 <= m < 16 and 1030 <= sec < 1050) else s,
    )
    assert len(alerts) == 1
    a = alerts[0]
    assert a.machine == "leaf-1" and a.domain == "leaf-1" and a.kind is AlertKind.SILENCE
    assert a.evidence["domain_members"] == [f"m{m:03d}" for m in range(8, 16)]


def test_an_application_xid_is_not_alerted_through_its_count(make_window) -> None:
    detector = MinderDetector()
    window: JobWindow = make_window(machines=8, seconds=5)
    window.add_batch(
        NodeBatch(
            "job",
            "m002",
            1005.5,
            samples=[("gpu_xid_count", "gpu1", 1.0)],
            events=[Event(EventKind.XID, "gpu1", 1005.2, code=13)],
        )
    )
    make_window(machines=8, seconds=1, start=1005, window=window, seed=9)
    assert detector.evaluate(window, 1005) == []


def _no_port_state(s):
    """The agent collects no port state (no sysfs port counters): only throughputs."""
    for key in [k for k in s if k[0] in ("rdma_port_up", "rdma_link_downed_count")]:
        del s[key]
    return s


def _dark(s, dev):
    s[("rdma_tx_bytes_per_second", dev)] = 0.0
    s[("rdma_rx_bytes_per_second", dev)] = 0.0
    return s


def test_a_port_dark_both_ways_while_its_job_carries_traffic_is_named(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(s, "mlx5_1") if m == 5 and sec >= 1030 else s

    alerts = run_stream(machines=16, seconds=60, mutate=mutate)
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.machine, a.kind, a.devices) == ("m005", AlertKind.RULE, ("mlx5_1",))
    assert a.evidence["rule"] == "no_traffic" and a.evidence["peers_carrying"] == 1.0
    assert a.first_ts == 1030
    assert a.detected_ts <= 1030 + 5 + DetectorConfig().settle_s


def test_a_leaf_switch_whose_machines_are_their_own_group_is_one_domain_alert(
    run_stream,
) -> None:
    # 32 machines on 4 leaf switches, declared as 4 groups that coincide with the switches:
    # leaf-1's machines are all dark at once, so within their group nobody stands apart.
    def mutate(m, sec, s):
        _no_port_state(s)
        if 8 <= m < 16 and sec >= 1030:
            _dark(s, "mlx5_0")
            _dark(s, "mlx5_1")
        return s

    alerts = run_stream(machines=32, seconds=60, mutate=mutate, domains=4, groups=4)
    assert [(a.machine, a.domain, a.kind) for a in alerts] == [("leaf-1", "leaf-1", AlertKind.RULE)]
    assert alerts[0].evidence["domain_members"] == [f"m{m:03d}" for m in range(8, 16)]


def test_a_pause_of_the_whole_job_names_no_dark_port(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(_dark(s, "mlx5_0"), "mlx5_1") if 1030 <= sec < 1050 else s

    alerts = run_stream(machines=16, seconds=60, mutate=mutate)
    assert [a for a in alerts if a.evidence.get("rule") == "no_traffic"] == []


def test_a_port_that_never_carried_traffic_is_not_named(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(s, "mlx5_1") if m == 5 else s

    alerts = run_stream(machines=16, seconds=60, mutate=mutate)
    assert [a for a in alerts if a.evidence.get("rule") == "no_traffic"] == []


def test_machines_that_take_turns_never_worked_as_one_and_name_no_dark_port(run_stream) -> None:
    # A serving fleet: half the machines carry traffic at a time, taking turns every 10 s.
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(_dark(s, "mlx5_0"), "mlx5_1") if (m + sec // 10) % 2 else s

    alerts = run_stream(machines=16, seconds=80, mutate=mutate)
    assert [a for a in alerts if a.evidence.get("rule") == "no_traffic"] == []
