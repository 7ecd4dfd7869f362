from __future__ import annotations

import pytest

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


ONSET = 1070
"""The dark ports' onset: the job (from 1000) worked as one for the window's 64 s before."""


def _no_traffic(alerts):
    """Alerts of the no-traffic rule, alone or in a domain alert."""
    return [
        a
        for a in alerts
        if a.evidence.get("rule") == "no_traffic"
        or "no_traffic" in a.evidence.get("member_rules", [])
    ]


def test_a_port_dark_both_ways_while_its_job_carries_traffic_is_named(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(s, "mlx5_1") if m == 5 and sec >= ONSET else s

    alerts = run_stream(machines=16, seconds=100, mutate=mutate)
    assert len(alerts) == 1
    a = alerts[0]
    assert (a.machine, a.kind, a.devices) == ("m005", AlertKind.RULE, ("mlx5_1",))
    assert a.evidence["rule"] == "no_traffic" and a.evidence["peers_carrying"] == 1.0
    assert a.first_ts == ONSET
    assert a.detected_ts <= ONSET + 5 + DetectorConfig().settle_s


def test_a_leaf_switch_whose_machines_are_their_own_group_is_one_domain_alert(
    run_stream,
) -> None:
    # 32 machines on 4 leaf switches, declared as 4 groups that coincide with the switches:
    # leaf-1's machines are all dark at once, so within their group nobody stands apart.
    def mutate(m, sec, s):
        _no_port_state(s)
        if 8 <= m < 16 and sec >= ONSET:
            _dark(s, "mlx5_0")
            _dark(s, "mlx5_1")
        return s

    alerts = run_stream(machines=32, seconds=100, mutate=mutate, domains=4, groups=4)
    assert [(a.machine, a.domain, a.kind) for a in alerts] == [("leaf-1", "leaf-1", AlertKind.RULE)]
    assert alerts[0].evidence["domain_members"] == [f"m{m:03d}" for m in range(8, 16)]
    assert alerts[0].evidence["member_rules"] == ["no_traffic"]


def test_a_pause_of_the_whole_job_names_no_dark_port(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(_dark(s, "mlx5_0"), "mlx5_1") if ONSET <= sec < ONSET + 20 else s

    assert run_stream(machines=16, seconds=100, mutate=mutate, domains=4) == []


def test_a_port_that_never_carried_traffic_is_not_named(run_stream) -> None:
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(s, "mlx5_1") if m == 5 else s

    assert _no_traffic(run_stream(machines=16, seconds=60, mutate=mutate)) == []


def test_a_rail_the_job_does_not_use_leaves_the_rule_working_on_the_others(run_stream) -> None:
    # Every machine has a third port, never used (a storage NIC): m005 loses mlx5_1.
    def mutate(m, sec, s):
        _no_port_state(s)
        s[("rdma_tx_bytes_per_second", "mlx5_2")] = 0.0
        return _dark(s, "mlx5_1") if m == 5 and sec >= ONSET else s

    alerts = _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate))
    assert [(a.machine, a.devices) for a in alerts] == [("m005", ("mlx5_1",))]


def test_machines_that_take_turns_never_worked_as_one_and_name_no_dark_port(run_stream) -> None:
    # A serving fleet: half the machines carry traffic at a time, taking turns every 10 s.
    def mutate(m, sec, s):
        _no_port_state(s)
        return _dark(_dark(s, "mlx5_0"), "mlx5_1") if (m + sec // 10) % 2 else s

    assert _no_traffic(run_stream(machines=16, seconds=80, mutate=mutate, domains=4)) == []


def test_a_stage_whose_ports_idle_for_seconds_at_a_time_is_no_lost_link(run_stream) -> None:
    # Two machines of a 16-machine pipeline idle their ports 8 s of every 30 s, waiting for
    # their stage's turn: they went dark before while the job worked, so it is their pattern.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m >= 14 and sec % 30 >= 22:
            _dark(_dark(s, "mlx5_0"), "mlx5_1")
        return s

    assert _no_traffic(run_stream(machines=16, seconds=120, mutate=mutate, domains=2)) == []


def test_an_idle_port_whose_state_reads_up_is_no_lost_link(run_stream) -> None:
    def mutate(m, sec, s):
        return _dark(s, "mlx5_1") if m == 5 and sec >= ONSET else s  # rdma_port_up stays 1

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate)) == []


def test_a_machine_whose_every_port_went_dark_alone_is_left_to_its_gpus(run_stream) -> None:
    # m005's process died: its GPUs idle and its ports carry nothing; no domain neighbour went
    # dark with it, so it is no switch and no one NIC: peer similarity names it by its GPUs.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m == 5 and sec >= ONSET:
            _dark(_dark(s, "mlx5_0"), "mlx5_1")
            for g in range(4):
                s[("gpu_util_ratio", f"gpu{g}")] = 0.0
                s[("gpu_tensor_active_ratio", f"gpu{g}")] = 0.0
                s[("gpu_power_watts", f"gpu{g}")] = 80.0
        return s

    alerts = run_stream(machines=16, seconds=120, mutate=mutate, domains=2)
    assert _no_traffic(alerts) == []
    assert [(a.machine, a.kind) for a in alerts] == [("m005", AlertKind.SIMILARITY)]


def test_more_than_half_of_the_machines_going_dark_at_once_is_no_link_fault(run_stream) -> None:
    # 9 of 16 machines stop using one of their two rails at once (5 mlx5_0, 4 mlx5_1), the
    # other carrying on (a job that moved its traffic): no link fault takes more than half of
    # a job, and each rail is still used by most machines.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m < 9 and sec >= ONSET:
            _dark(s, "mlx5_0" if m < 5 else "mlx5_1")
        return s

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate, domains=4)) == []


@pytest.mark.parametrize("every", [5, 15])
def test_ports_scraped_every_few_seconds_at_their_own_offsets_are_read(
    make_window, every: int
) -> None:
    """Throughputs scraped every 5 or 15 s, each machine at its own offset, beside per-second
    GPU data: each sample is held until the next, so the dark port is seen."""
    start, onset, seconds = 1000, 1200, 320

    def mutate(m, sec, s):
        _no_port_state(s)
        if (sec + m) % every:
            for key in [k for k in s if k[0] == "rdma_tx_bytes_per_second"]:
                del s[key]
        elif m == 5 and sec >= onset:
            _dark(s, "mlx5_1")
        return s

    detector = MinderDetector()
    window = JobWindow("job", horizon_s=detector.horizon_s)
    alerts = []
    for i, sec in enumerate(range(start, start + seconds)):
        make_window(machines=16, seconds=1, mutate=mutate, start=sec, seed=i, window=window)
        alerts.extend(detector.evaluate(window, sec))
    named = _no_traffic(alerts)
    assert [(a.machine, a.devices) for a in named] == [("m005", ("mlx5_1",))]
    assert onset <= named[0].first_ts <= onset + every


def test_a_port_dark_while_the_rest_of_the_job_barely_moves_traffic_is_not_named(
    run_stream,
) -> None:
    # From ONSET m005's mlx5_1 is dark and every other port drops to 50 MB/s (the job's
    # collectives stalled): nothing shows that a link, rather than the job, stopped.
    def mutate(m, sec, s):
        _no_port_state(s)
        if sec >= ONSET:
            for dev in ("mlx5_0", "mlx5_1"):
                s[("rdma_tx_bytes_per_second", dev)] = 5e7
            if m == 5:
                _dark(s, "mlx5_1")
        return s

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate, domains=4)) == []


def test_a_port_that_went_dark_and_came_back_while_the_job_worked_is_its_own_pattern(
    run_stream,
) -> None:
    # m005's mlx5_1 idled 6 s once, 30 s before it goes dark for good: within the window's
    # history the port went quiet while the job worked, so its going quiet is no lost link.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m == 5 and (ONSET - 30 <= sec < ONSET - 24 or sec >= ONSET):
            _dark(s, "mlx5_1")
        return s

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate)) == []


def test_a_job_three_of_whose_machines_idled_in_its_history_did_not_work_as_one(
    run_stream,
) -> None:
    # Three of 16 machines moved no traffic for the job's first 40 s (spares it held): within
    # the history before m005's port went dark, the job's machines did not all work alike, so
    # a dark port says nothing.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m >= 13 and sec < 1040:
            _dark(_dark(s, "mlx5_0"), "mlx5_1")
        return _dark(s, "mlx5_1") if m == 5 and sec >= ONSET else s

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate, domains=4)) == []


def test_a_port_that_only_ever_moved_a_trickle_is_not_named_when_it_stops(run_stream) -> None:
    # m005's mlx5_1 moved 50 MB/s (a management rail there), never the job's traffic.
    def mutate(m, sec, s):
        _no_port_state(s)
        if m == 5:
            s[("rdma_tx_bytes_per_second", "mlx5_1")] = 0.0 if sec >= ONSET else 5e7
        return s

    assert _no_traffic(run_stream(machines=16, seconds=100, mutate=mutate)) == []


def test_a_dark_port_waits_until_the_rest_of_the_job_carries_traffic_again(run_stream) -> None:
    # m005's mlx5_1 goes dark as every other port drops to 50 MB/s for 10 s (the job's
    # collectives stall); once the others carry traffic again for 5 s, it is named.
    def mutate(m, sec, s):
        _no_port_state(s)
        if ONSET <= sec < ONSET + 10:
            for dev in ("mlx5_0", "mlx5_1"):
                s[("rdma_tx_bytes_per_second", dev)] = 5e7
        return _dark(s, "mlx5_1") if m == 5 and sec >= ONSET else s

    named = _no_traffic(run_stream(machines=16, seconds=110, mutate=mutate))
    assert [(a.machine, a.devices) for a in named] == [("m005", ("mlx5_1",))]
    assert named[0].first_ts == ONSET
    assert named[0].detected_ts >= ONSET + 10 + 4
