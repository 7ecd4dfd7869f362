"""The embedded broker dies with the process that started it, even a SIGKILL-ed one, and a
broker a dead Minder left behind is reaped at the next start on its port; a port held by
anything else (another program, a living Minder's broker) is never touched."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import minder.stream.broker as broker_module
from minder.core.errors import BrokerError
from minder.stream import EmbeddedBroker, free_port

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl"),
]

PARENT = Path(__file__).with_name("broker_parent.py")
REPO = Path(__file__).resolve().parents[3]


def _dead(pid: int) -> bool:
    """Gone, or a zombie (exited; its parent, or init, has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"Z"


def _wait_dead(pid: int, timeout_s: float) -> float:
    began = time.monotonic()
    while not _dead(pid):
        if time.monotonic() - began > timeout_s:
            pytest.fail(f"process {pid} still alive {timeout_s:g} s later")
        time.sleep(0.05)
    return time.monotonic() - began


def _accepts_tcp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _broker_parent(port: int, *options: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The helper process and its broker's pid; both killed at exit."""
    process = subprocess.Popen(
        [sys.executable, str(PARENT), str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    broker_pid = 0
    try:
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        if not line.startswith("ready "):
            process.kill()
            pytest.fail(f"the broker's parent did not start: {line!r} {process.stderr.read()}")
        broker_pid = int(line.split()[1])
        yield process, broker_pid
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if broker_pid:
            _kill(broker_pid)


def test_the_broker_dies_with_a_killed_parent_and_the_port_can_be_used_again() -> None:
    port = free_port()
    with _broker_parent(port) as (parent, broker_pid):
        time.sleep(1.0)  # its starting thread ended long ago: the broker lives on
        assert not _dead(broker_pid) and _accepts_tcp(port)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        took = _wait_dead(broker_pid, 5.0)
    assert took < 5.0
    with EmbeddedBroker(port=port, ready_timeout_s=20) as again:
        assert again.is_running and _accepts_tcp(port)


def test_a_broker_left_behind_by_a_dead_minder_is_reaped_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    with _broker_parent(port, "--no-pdeathsig", "--exit") as (parent, broker_pid):
        parent.wait(10)
        time.sleep(0.5)
        assert not _dead(broker_pid) and _accepts_tcp(port), "nothing was left behind"
        caplog.set_level(logging.WARNING, logger="minder.stream.broker")
        with EmbeddedBroker(port=port, ready_timeout_s=20) as broker:
            assert broker.is_running and broker.pid != broker_pid
            assert _dead(broker_pid)
        assert any(
            f"(pid {broker_pid})" in r.getMessage() and "left behind" in r.getMessage()
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]


def test_a_port_held_by_another_program_is_refused_naming_its_pid() -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        with pytest.raises(BrokerError) as refused:
            EmbeddedBroker(port=port).start()
        message = str(refused.value)
        assert "\n" not in message
        assert f"port 127.0.0.1:{port} is in use" in message and f"pid {holder.pid}" in message
        assert holder.poll() is None  # never killed
    finally:
        holder.kill()
        holder.wait(10)


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _closed_on_call(
    held: socket.socket, call: int, answer: list[int]
) -> Callable[[int], list[int]]:
    """A ``port_holders`` that answers ``answer`` and closes ``held`` at its ``call``-th call:
    the holder finishes exiting while the start waits."""
    calls = 0

    def holders(port: int) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == call:
            held.close()
        return answer

    return holders


def test_a_port_no_process_shows_a_holder_of_is_waited_on_and_then_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A multi-threaded process whose main thread is already a zombie still holds its sockets
    while its other threads exit, and no /proc/<pid>/fd shows them: the start waits for the port
    instead of failing (CI once saw exactly this right after a broker was SIGKILL-ed)."""
    held = _listener()
    port = held.getsockname()[1]
    monkeypatch.setattr("minder.stream.broker.port_holders", _closed_on_call(held, 3, []))
    with (
        caplog.at_level(logging.INFO, logger="minder.stream.broker"),
        EmbeddedBroker(port=port, ready_timeout_s=20) as broker,
    ):
        assert broker.is_running and _accepts_tcp(port)
    assert any(
        f"port 127.0.0.1:{port} was freed" in r.getMessage()
        and "no process one can see" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_a_port_whose_visible_holder_is_exiting_is_waited_on_and_then_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exiting process whose memory is already released (its command line and environment
    read empty) still shows its socket: it is waited on too, not refused as a stranger."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait_dead(zombie.pid, 10.0)  # exited, not reaped: a zombie
    try:
        held = _listener()
        port = held.getsockname()[1]
        monkeypatch.setattr(
            "minder.stream.broker.port_holders", _closed_on_call(held, 3, [zombie.pid])
        )
        with (
            caplog.at_level(logging.INFO, logger="minder.stream.broker"),
            EmbeddedBroker(port=port, ready_timeout_s=20) as broker,
        ):
            assert broker.is_running
        assert any(f"exiting process [{zombie.pid}]" in r.getMessage() for r in caplog.records), [
            r.getMessage() for r in caplog.records
        ]
    finally:
        zombie.wait(10)


def test_a_zombie_or_a_process_without_memory_is_exiting_and_a_living_one_is_not() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait_dead(zombie.pid, 10.0)
    try:
        assert broker_module._exiting(zombie.pid)
    finally:
        zombie.wait(10)
    assert broker_module._exiting(zombie.pid)  # reaped: gone
    assert not broker_module._exiting(os.getpid())


def test_a_port_held_by_a_process_no_one_can_see_is_refused_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder that neither shows itself nor lets go is refused once the grace has passed,
    and left alone."""
    monkeypatch.setattr("minder.stream.broker.port_holders", lambda port: [])
    monkeypatch.setattr(broker_module, "_EXITING_GRACE_S", 0.3)
    with _listener() as held:
        port = held.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(
            BrokerError, match=r"in use by another process \(pid unknown; still after 0.3 s\)"
        ):
            EmbeddedBroker(port=port).start()
        assert time.monotonic() - began >= broker_module._EXITING_GRACE_S  # it waited first
        assert _accepts_tcp(port)  # never touched


def test_a_port_that_cannot_be_bound_for_another_reason_is_named_at_once() -> None:
    """A privileged port (this user may not bind it) or an address that is not local is no
    holder to wait for: one line naming the address and why, at once."""
    began = time.monotonic()
    with pytest.raises(BrokerError, match=r"cannot listen on 192\.0\.2\.1:\d+ \(.*\): expected"):
        EmbeddedBroker(host="192.0.2.1", port=free_port()).start()
    assert time.monotonic() - began < 1.0  # no wait for a holder


def test_the_broker_of_a_living_minder_is_never_reaped() -> None:
    with EmbeddedBroker(ready_timeout_s=20) as living:
        with pytest.raises(BrokerError, match=rf"is in use by another process \(pid {living.pid}"):
            EmbeddedBroker(port=living.port).start()
        assert living.is_running and _accepts_tcp(living.port)


def _ready(api_port: int, process: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr is not None else ""
            pytest.fail(f"minder serve exited with {process.returncode}: {stderr}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    pytest.fail(f"minder serve not ready in {timeout_s:g} s")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_bytes()
                if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_serve_restarts_on_its_broker_port_after_a_sigkill(tmp_path: Path) -> None:
    from service_settings import cluster_keys

    broker_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env["MINDER_DATABASE__URL"] = f"sqlite:///{tmp_path / 'm.db'}"
    env["MINDER_AUTH__KEYS_FILE"] = str(cluster_keys())
    env["PYTHONPATH"] = str(REPO)

    def serve() -> tuple[subprocess.Popen[str], int]:
        api_port = free_port()
        command = [sys.executable, "-m", "minder.cli", "serve", "--embedded-broker"]
        command += ["--broker-port", str(broker_port), "--port", str(api_port)]
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        _ready(api_port, process, 90)
        return process, api_port

    first, _ = serve()
    brokers: list[int] = []
    try:
        brokers = [pid for pid in _children(first.pid) if "tansu" in _exe(pid)]
        assert len(brokers) == 1, _children(first.pid)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        _wait_dead(brokers[0], 5.0)
        second, _ = serve()
        try:
            second.send_signal(signal.SIGTERM)
            _, stderr = second.communicate(timeout=30)
            assert second.returncode == 0, stderr
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        for pid in brokers:
            _kill(pid)


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""
