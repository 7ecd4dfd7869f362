"""Step-time probe: the training-side client and the agent-side source, over real sockets."""

from __future__ import annotations

import logging
import math
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import collectors.probe as probe
from collectors.base import Source
from collectors.probe import ProbeSource, StepProbe, parse_address, rank_from_env
from minder.core.errors import ValidationError
from minder.core.metrics import validate_sample


@pytest.fixture
def source() -> Iterator[ProbeSource]:
    src = ProbeSource("127.0.0.1:0")
    yield src
    src.close()


@pytest.fixture(autouse=True)
def fresh_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without a module-level probe and without launcher variables."""
    monkeypatch.setattr(probe._Default, "probe", None)
    for key in (probe.ADDRESS_ENV, *probe.RANK_ENV):
        monkeypatch.delenv(key, raising=False)


def means(src: ProbeSource) -> dict[str, float]:
    out = src.collect(time.time())
    for sample in out.samples:
        validate_sample(*sample)
    assert out.events == []
    return {
        device: value for metric, device, value in out.samples if metric == "train_step_seconds"
    }


def collected(src: ProbeSource) -> dict[str, dict[str, float]]:
    """metric -> device -> value of one collect (every sample validated)."""
    out = src.collect(time.time())
    got: dict[str, dict[str, float]] = {}
    for metric, device, value in out.samples:
        validate_sample(metric, device, value)
        got.setdefault(metric, {})[device] = value
    return got


def free_udp_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def send_raw(address: str, *datagrams: bytes) -> None:
    host, port = parse_address(address)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for datagram in datagrams:
            sock.sendto(datagram, (host, port))


# -- addresses and ranks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9477", ("127.0.0.1", 9477)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9477", ("::1", 9477)),
        (" 10.1.2.3:65535 ", ("10.1.2.3", 65535)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["127.0.0.1", ":9477", "host:", "host:port", "h:65536", "h:-1"])
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected 'host:port'"):
        parse_address(text)


def test_rank_from_env() -> None:
    assert rank_from_env({}) == 0
    assert rank_from_env({"RANK": "17", "SLURM_PROCID": "3"}) == 17
    assert rank_from_env({"SLURM_PROCID": "3"}) == 3
    assert rank_from_env({"RANK": "-1", "SLURM_PROCID": "3"}) == 3, "a bad RANK falls through"
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert rank_from_env({"RANK": "٣"}) == 0, "only ASCII digits"


def test_probe_defaults_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "9")
    monkeypatch.setenv(probe.ADDRESS_ENV, "127.0.0.1:1234")
    client = StepProbe()
    assert (client.rank, client.address) == (9, "127.0.0.1:1234")
    monkeypatch.delenv(probe.ADDRESS_ENV)
    assert StepProbe().address == probe.DEFAULT_ADDRESS


def test_explicit_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="probe address 'nowhere'"):
        StepProbe("nowhere", rank=0)
    with pytest.raises(ValueError, match="probe rank -1"):
        StepProbe("127.0.0.1:9477", rank=-1)


def test_bad_env_address_disables_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(probe.ADDRESS_ENV, "no-port-here")
    client = StepProbe()
    client.step(0.5)
    assert (client.sent, client.dropped) == (0, 1)


def test_unresolvable_host_disables_without_raising() -> None:
    client = StepProbe("host.invalid:9477", rank=0)  # RFC 6761: never resolves
    client.step(0.5)
    assert (client.sent, client.dropped) == (0, 1)


# -- client -> source ------------------------------------------------------------------------------


def test_source_exposes_its_bound_address(source: ProbeSource) -> None:
    assert isinstance(source, Source)
    assert source.name == "probe"
    assert source.address is not None
    host, port = parse_address(source.address)
    assert host == "127.0.0.1" and port > 0


def test_datagram_format(source: ProbeSource) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(2.0)
        host, port = listener.getsockname()
        client = StepProbe(f"{host}:{port}", rank=3)
        client.step(0.25)
        assert listener.recv(512) == b"minder2 3 0 0.25 -"  # no busy time: '-', not 0
        client.step(1.5, busy=1.25)
        assert listener.recv(512) == b"minder2 3 1 1.5 1.25"
        client.step(2.0, busy=0.0, number=41)
        assert listener.recv(512) == b"minder2 3 41 2.0 0.0"
        client.step(2.0)
        assert listener.recv(512) == b"minder2 3 42 2.0 -"


def test_mean_per_rank_over_many_steps(source: ProbeSource) -> None:
    assert source.address is not None
    fast = StepProbe(source.address, rank=0)
    slow = StepProbe(source.address, rank=12)
    fast_steps = [0.5 + 0.001 * i for i in range(200)]
    for seconds in fast_steps:
        fast.step(seconds)
    for seconds in (1.5, 1.7, 1.6):
        slow.step(seconds)
    assert (fast.sent, fast.dropped, slow.sent) == (200, 0, 3)
    got = means(source)
    assert got == {
        "rank0": pytest.approx(math.fsum(fast_steps) / 200),
        "rank12": pytest.approx(1.6),
    }


def test_silent_ranks_emit_nothing(source: ProbeSource) -> None:
    assert source.address is not None
    a, b = StepProbe(source.address, rank=1), StepProbe(source.address, rank=2)
    a.step(1.0)
    b.step(2.0)
    assert set(means(source)) == {"rank1", "rank2"}
    assert means(source) == {}, "an interval without steps emits nothing"
    b.step(4.0)
    b.step(6.0)
    assert means(source) == {"rank2": pytest.approx(5.0)}, "only this interval's steps"


def test_bad_datagrams_are_counted_and_logged_once(
    source: ProbeSource, caplog: pytest.LogCaptureFixture
) -> None:
    assert source.address is not None
    garbage = [
        b"hello",
        b"minder1 x 1.0",
        b"minder1 1 nan",
        b"minder1 1 inf",
        b"minder1 1 -1.0",
        b"minder1 1 1e39",  # beyond float32: the windows could not hold it
        b"minder1 1 0",  # a step takes time
        b"minder2 1 1.0",
        b"minder1 1 1.0 extra",
        b"minder2 1 5 1.0",  # busy missing ('-' when none)
        b"minder2 1 5 1.0 1.5",  # busy longer than the step
        b"minder2 1 5 1.0 -0.1",
        b"minder2 1 5 1.0 nan",
        b"minder2 1 5 0.0 -",
        b"minder2 1 -5 1.0 -",
        b"minder2 1 5.5 1.0 -",
        b"minder2 1 9007199254740993 1.0 -",  # step beyond 2**53
        b"minder2 1 5 1.0 - extra",
        b"minder3 1 5 1.0 -",
        b"minder1 99999999999 1.0",
        b"\xff\xfe\x00",
        b"",
    ]
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        send_raw(source.address, b"minder1 4 2.0", *garbage, b"minder1 4 3.0")
        assert means(source) == {"rank4": pytest.approx(2.5)}
        send_raw(source.address, b"junk")
        assert means(source) == {}
    assert dict(source.problems.counts) == {"bad_datagram": len(garbage) + 1}
    assert sum("(bad_datagram)" in r.getMessage() for r in caplog.records) == 1


def test_non_finite_and_negative_steps_are_ignored(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=5)
    for bad in (math.nan, math.inf, -math.inf, -0.5, 0, 0.0, "fast", None, 10**400):
        client.step(bad)  # type: ignore[arg-type]
    assert (client.ignored, client.sent, client.dropped) == (9, 0, 0)
    client.step(0.5)
    assert means(source) == {"rank5": 0.5}
    assert client.number == 9, "refused steps still happened: they are counted"


def test_client_without_listener_never_raises_and_is_fast() -> None:
    client = StepProbe(f"127.0.0.1:{free_udp_port()}", rank=0)
    n = 10_000
    start = time.perf_counter()
    for _ in range(n):
        client.step(0.123)
    per_step = (time.perf_counter() - start) / n
    assert client.sent + client.dropped == n
    if sys.platform == "linux":
        # Connected UDP: the ICMP "port unreachable" comes back as ECONNREFUSED on a later send.
        assert client.dropped > 0
    # Typically ~5 us; the bound is generous so a loaded CI machine does not flake.
    assert per_step < 1e-3, f"{per_step * 1e6:.1f} us per step"


def test_closed_client_counts_drops(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=0)
    client.close()
    client.step(1.0)
    assert client.dropped == 1
    assert means(source) == {}


def test_timer_reports_the_block(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=2)
    with client.timer():
        time.sleep(0.02)
    with pytest.raises(RuntimeError), client.timer():
        raise RuntimeError("a failed step is not a step time")
    got = means(source)
    assert client.sent == 1
    assert 0.02 <= got["rank2"] < 1.0


def test_module_level_step_uses_env(source: ProbeSource, monkeypatch: pytest.MonkeyPatch) -> None:
    assert source.address is not None
    monkeypatch.setenv(probe.ADDRESS_ENV, source.address)
    monkeypatch.setenv("RANK", "7")
    probe.step(0.5)
    probe.step(1.5)
    with probe.timer():
        pass
    assert probe.default_probe().sent == 3
    got = means(source)
    assert set(got) == {"rank7"}
    assert got["rank7"] == pytest.approx((0.5 + 1.5 + 0.0) / 3, abs=1e-3)  # the timer's ~0 s block


def test_configure_replaces_the_default(source: ProbeSource) -> None:
    assert source.address is not None
    first = probe.configure(source.address, rank=1)
    probe.step(1.0)
    second = probe.configure(source.address, rank=3)
    probe.step(3.0)
    assert probe.default_probe() is second
    first.step(1.0)
    assert first.dropped == 1, "the replaced probe was closed"
    assert means(source) == {"rank1": 1.0, "rank3": 3.0}


# -- source lifecycle ------------------------------------------------------------------------------


def test_bind_failure_is_reported_once(
    source: ProbeSource, caplog: pytest.LogCaptureFixture
) -> None:
    assert source.address is not None
    with caplog.at_level(logging.WARNING, logger="collectors.base"):
        clash = ProbeSource(source.address)  # the port is taken
        assert clash.address is None
        for now in range(3):
            assert clash.collect(float(now)).samples == []
        clash.close()
    assert dict(clash.problems.counts) == {"bind_failed": 1}
    assert sum("(bind_failed)" in r.getMessage() for r in caplog.records) == 1


def test_malformed_source_address_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="probe address '9477'"):
        ProbeSource("9477")


def test_closed_source_yields_nothing(source: ProbeSource) -> None:
    assert source.address is not None
    address = source.address
    source.close()
    assert source.address is None
    StepProbe(address, rank=0).step(1.0)
    assert source.collect(0.0).samples == []
    source.close()  # idempotent


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 support in this Python build")
    src = ProbeSource("[::1]:0")
    if src.address is None:
        pytest.skip("IPv6 loopback unavailable here (bind_failed)")
    try:
        assert src.address.startswith("[::1]:")
        StepProbe(src.address, rank=1).step(2.0)
        assert means(src) == {"rank1": 2.0}
    finally:
        src.close()


# -- the client stays standard-library only ---------------------------------------------------------


def test_import_pulls_in_nothing_but_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import collectors.probe; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names) - {'collectors'}), "
        "'collectors.base' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["[]", "False"], result.stdout


def test_client_file_works_alone(source: ProbeSource) -> None:
    """probe.py copied alone into a training image (no site-packages, no minder) still sends."""
    assert source.address is not None
    path = Path(probe.__file__).resolve()
    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('minder_probe', {str(path)!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        f"p = m.StepProbe({source.address!r}, rank=11); p.step(0.75); print(p.sent)"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.strip() == "1"
    deadline = time.monotonic() + 2.0
    got: dict[str, float] = {}
    while not got and time.monotonic() < deadline:
        got = means(source)
    assert got == {"rank11": 0.75}


def _steps(rank: int, seconds: float, n: int) -> list[bytes]:
    return [b"minder1 %d %r" % (rank, seconds)] * n


def test_drain_is_bounded_and_the_rest_is_read_next_interval() -> None:
    src = ProbeSource("127.0.0.1:0", max_drain=10)
    try:
        assert src.address is not None
        send_raw(src.address, *_steps(0, 1.0, 10), *_steps(0, 2.0, 10), *_steps(0, 3.0, 5))
        # Each interval reads at most 10, in order; nothing is dropped.
        assert means(src) == {"rank0": 1.0}
        assert means(src) == {"rank0": 2.0}
        assert means(src) == {"rank0": 3.0}
        assert means(src) == {}
        assert dict(src.problems.counts) == {"drain_limit": 2}  # not when the queue was empty
    finally:
        src.close()


def test_drain_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ProbeSource, "_CHECK_EVERY", 1)
    src = ProbeSource("127.0.0.1:0", max_drain_s=1e-9)
    try:
        assert src.address is not None
        send_raw(src.address, b"minder1 0 1.0", b"minder1 0 2.0", b"minder1 0 3.0")
        started = time.monotonic()
        assert [means(src) for _ in range(4)] == [
            {"rank0": 1.0},
            {"rank0": 2.0},
            {"rank0": 3.0},
            {},
        ]
        assert time.monotonic() - started < 1.0
        assert dict(src.problems.counts) == {"drain_limit": 2}
    finally:
        src.close()


def test_distinct_ranks_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    src = ProbeSource("127.0.0.1:0", max_ranks=4)
    try:
        assert src.address is not None
        send_raw(src.address, *(b"minder1 %d 1.0" % rank for rank in range(10)))
        assert set(means(src)) == {"rank0", "rank1", "rank2", "rank3"}
        assert dict(src.problems.counts) == {"too_many_ranks": 6}
        send_raw(src.address, b"minder1 9 1.0", b"minder1 2 5.0")
        assert means(src) == {"rank2": 5.0}  # a known rank still reports, a new one does not
        assert dict(src.problems.counts) == {"too_many_ranks": 7}
        # Ranks silent for RANK_EXPIRY_S free their places (a new job on the node).
        monkeypatch.setattr(src, "RANK_EXPIRY_S", 0.0)
        time.sleep(0.01)
        send_raw(src.address, b"minder1 9 2.0")
        assert means(src) == {"rank9": 2.0}
    finally:
        src.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_drain": 0}, "max_drain is 0"),
        ({"max_ranks": True}, "max_ranks is True"),
        ({"max_drain_s": 0.0}, "max_drain_s is 0.0"),
    ],
)
def test_bad_limits_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ProbeSource("127.0.0.1:0", **kwargs)  # type: ignore[arg-type]


# -- busy time and step numbers ---------------------------------------------------------------------


def test_busy_blocks_add_up_within_the_timed_step(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=4)
    with client.timer():
        with client.busy():
            time.sleep(0.02)
        time.sleep(0.03)  # a blocking collective: not busy
        with client.busy(), client.busy():  # nested: counted once
            time.sleep(0.01)
    got = collected(source)
    step, busy = got["train_step_seconds"]["rank4"], got["train_busy_seconds"]["rank4"]
    assert 0.03 <= busy < step
    assert step - busy >= 0.03
    assert got["train_step_number"] == {"rank4": 0.0}


def test_busy_is_absent_not_zero_when_no_step_reported_one(source: ProbeSource) -> None:
    assert source.address is not None
    with_busy, without = StepProbe(source.address, rank=1), StepProbe(source.address, rank=2)
    for seconds, busy in ((1.0, 0.25), (3.0, 0.75)):
        with_busy.step(seconds, busy=busy)
    with_busy.step(2.0)  # no busy: not part of the busy mean
    with_busy.step(2.0, busy=0.0)  # a measured 0 is part of it
    without.step(1.0)
    with without.timer():  # a timer without busy blocks reports none either
        pass
    got = collected(source)
    assert got["train_step_seconds"] == {"rank1": 2.0, "rank2": pytest.approx(0.5, abs=0.01)}
    assert got["train_busy_seconds"] == {"rank1": pytest.approx((0.25 + 0.75 + 0.0) / 3)}
    assert got["train_step_number"] == {"rank1": 3.0, "rank2": 1.0}


def test_step_numbers_count_on_from_the_last_one_set(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=0)
    assert client.number == -1
    for _ in range(3):
        client.step(0.5)
    assert collected(source)["train_step_number"] == {"rank0": 2.0}
    client.step(0.5, number=1000)  # resumed from a checkpoint
    client.step(0.5)
    assert collected(source)["train_step_number"] == {"rank0": 1001.0}
    with client.timer() as handle:
        handle.number = 5000
        handle.busy = 0.0
    got = collected(source)
    assert got["train_step_number"] == {"rank0": 5000.0}
    assert got["train_busy_seconds"] == {"rank0": 0.0}
    for bad in (-1, 1.5, True, "7", 2**53 + 1):
        client.step(0.5, number=bad)  # type: ignore[arg-type]
    assert (client.ignored, client.number) == (5, 5005), "a bad number: the step counts on"
    client.step(0.5, number=7.0)  # type: ignore[arg-type]  # an integral float is a number
    assert collected(source)["train_step_number"] == {"rank0": 7.0}


def test_bad_busy_times_are_ignored_and_counted(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=6)
    for busy in (1.5, -0.1, math.nan, math.inf, "x"):
        client.step(1.0, busy=busy)  # type: ignore[arg-type]
    assert (client.ignored, client.sent) == (5, 0)
    client.step(1.0, busy=1.0 + 1e-12)  # summed blocks a rounding error over: the step's time
    got = collected(source)
    assert got["train_busy_seconds"] == {"rank6": 1.0}
    assert source.problems.total == 0


def test_busy_blocks_outside_a_timer_go_to_the_next_step(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=3)
    with pytest.raises(RuntimeError), client.busy():
        time.sleep(0.01)
        raise RuntimeError("the time was spent all the same")
    client.step(1.0)
    client.step(1.0)  # the blocks went with the previous step
    got = collected(source)
    assert 0.01 <= got["train_busy_seconds"]["rank3"] < 0.5
    assert got["train_step_seconds"]["rank3"] == 1.0
    with client.busy():
        time.sleep(0.01)
    with client.timer():  # a timed step starts afresh: earlier blocks are not its own
        pass
    assert "train_busy_seconds" not in collected(source)


def test_version_one_datagrams_are_still_accepted(source: ProbeSource) -> None:
    assert source.address is not None
    send_raw(source.address, b"minder1 2 1.0", b"minder1 2 3.0", b"minder2 5 17 2.0 0.5")
    got = collected(source)
    assert got["train_step_seconds"] == {"rank2": 2.0, "rank5": 2.0}
    assert got["train_busy_seconds"] == {"rank5": 0.5}
    assert got["train_step_number"] == {"rank5": 17.0}, "minder1 carries no step number"
    # A rank mixing both: the step number of the last datagram that had one.
    send_raw(source.address, b"minder2 2 9 1.0 -", b"minder1 2 1.0")
    assert collected(source)["train_step_number"] == {"rank2": 9.0}


def test_module_level_busy_and_numbers(
    source: ProbeSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert source.address is not None
    monkeypatch.setenv(probe.ADDRESS_ENV, source.address)
    monkeypatch.setenv("RANK", "8")
    with probe.timer() as handle:
        with probe.busy():
            time.sleep(0.01)
        assert handle.busy is None and handle.number is None
    probe.step(1.0, busy=0.5, number=10)
    got = collected(source)
    assert got["train_step_number"] == {"rank8": 10.0}
    assert 0.01 <= 2 * got["train_busy_seconds"]["rank8"] - 0.5 < 0.5


# -- pauses ---------------------------------------------------------------------------------------


def test_pause_datagrams(source: ProbeSource) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(2.0)
        host, port = listener.getsockname()
        client = StepProbe(f"{host}:{port}", rank=3)
        with client.pause("checkpoint"):
            assert listener.recv(512) == b"minder2 3 pause 1 checkpoint"
            with client.pause("inner"):  # nested: said once
                pass
        assert listener.recv(512) == b"minder2 3 pause 0 checkpoint"
        with pytest.raises(RuntimeError), client.pause("eval/val set 1" + "x" * 40):
            raise RuntimeError("the loop's own error goes through")
        word = b"eval_val_set_1" + b"x" * 18  # 32 characters, others replaced
        assert listener.recv(512) == b"minder2 3 pause 1 " + word
        assert listener.recv(512) == b"minder2 3 pause 0 " + word
        with client.pause(""):
            pass
        assert listener.recv(512) == b"minder2 3 pause 1 pause"
        assert client.sent == 6


def test_paused_rank_reports_how_long_until_its_pause_ends(source: ProbeSource) -> None:
    assert source.address is not None
    client = StepProbe(source.address, rank=4)
    other = StepProbe(source.address, rank=5)
    client.step(1.0, number=7)
    other.step(1.0, number=7)
    pause = client.pause("checkpoint")
    pause.__enter__()
    got = collected(source)
    assert got["train_step_number"] == {"rank4": 7.0, "rank5": 7.0}
    first = got["train_paused_seconds"]["rank4"]
    assert set(got["train_paused_seconds"]) == {"rank4"} and first > 0
    time.sleep(0.02)
    got = collected(source)
    assert "train_step_seconds" not in got
    later = got["train_paused_seconds"]["rank4"]
    assert later >= 0.02 and later > first, "every collect while paused, how long so far"
    pause.__exit__(None, None, None)
    assert collected(source) == {"train_paused_seconds": {"rank4": 0.0}}, "0 once it ended"
    assert collected(source) == {}


def test_a_step_ends_a_pause_whose_end_was_lost(source: ProbeSource) -> None:
    assert source.address is not None
    send_raw(source.address, b"minder2 6 pause 1 checkpoint")
    assert collected(source)["train_paused_seconds"]["rank6"] > 0
    send_raw(source.address, b"minder2 6 8 1.0 -")
    got = collected(source)
    assert got["train_paused_seconds"] == {"rank6": 0.0}
    assert got["train_step_number"] == {"rank6": 8.0}
    assert "train_paused_seconds" not in collected(source)


@pytest.mark.parametrize(
    "datagram",
    [
        b"minder2 6 pause 2 checkpoint",
        b"minder2 6 pause 1",
        b"minder2 x pause 1 checkpoint",
        b"minder2 6 pause 1 " + b"r" * 33,
        b"minder1 6 pause 1 checkpoint",
    ],
)
def test_malformed_pause_datagrams_are_counted(source: ProbeSource, datagram: bytes) -> None:
    assert source.address is not None
    send_raw(source.address, datagram)
    assert collected(source) == {}
    assert source.problems.counts == {"bad_datagram": 1}


def test_module_level_pause_and_no_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(probe.ADDRESS_ENV, f"127.0.0.1:{free_udp_port()}")
    with probe.pause("checkpoint"):
        pass
    client = probe.default_probe()
    assert client.sent + client.dropped == 2  # never raises, whatever the kernel says
