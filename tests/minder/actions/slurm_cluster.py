"""A real one-host Slurm cluster for tests: ``munged``, ``slurmctld`` and one ``slurmd`` per node.

Everything lives in a temporary directory (``slurm.conf``, the MUNGE key and socket, state and
spool directories, logs); nothing under ``/etc`` is read or written: every Slurm command gets
``SLURM_CONF`` (and ``-f``), and Slurm finds MUNGE's socket through ``AuthInfo=socket=...``.

Each node is a real ``slurmd -N <node>`` listening on its own port of 127.0.0.1 (``NodeHostname``
is the node's name, ``NodeAddr=127.0.0.1``), so that a drained node resumes to ``IDLE`` as on a
real cluster. Debian's Slurm is built without ``--enable-multiple-slurmd``, which only matters
for nodes that share a ``NodeHostname``; distinct host names with one address work without it.

Usage::

    with SlurmCluster(nodes=["demo-n0023", "demo-n0024"]) as cluster:
        SlurmActuator(slurm_conf=cluster.conf_path).apply("demo-n0023", ...)
        flags, reason = cluster.node_state("demo-n0023")

``skip_reason()`` says why no cluster can run here (missing binaries, not root), for a
``pytest.skip``. The daemons need root: ``SlurmUser=root``, and ``slurmd`` runs as root.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from server_process import stop_process

logger = logging.getLogger(__name__)

DEFAULT_NODES = ("demo-n0023", "demo-n0024", "demo-n0025")
ONE_HOST_COLLECTIVE = ("env", "MINDER_SELFCHECK_COLLECTIVE_THRESHOLD=50")
"""The prefix of a ``minder selfcheck run`` command whose collective runs on this one-host
cluster. Its "nodes" share two cores with the daemons, the API and the test, and the suspect
hosts the rendezvous store: a healthy suspect has read over 2x its partners there (CI), and once
8.8x and 13.4x in its two pairs. The loop tests test the loop; the collective's judgement is
tested on its own at the product default of 2 (tests/collectors/selfcheck/test_collective.py,
4-8 processes)."""
BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "srun", "squeue", "scancel")
"""The daemons, and the clients the tests run (``sbatch`` and ``squeue`` for jobs, ``srun`` in a
self-check's batch script, ``scancel``)."""
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")
_NODE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")
_STATE = re.compile(r"^\s+State=(\S+)", re.MULTILINE)
_REASON = re.compile(r"^\s+Reason=(.*?)(?: \[[^\[\]]*@[^\[\]]*\])?$", re.MULTILINE)
_STATE_SUFFIXES = "*~#!%$@^-"
_JOB_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"})


class SlurmClusterError(RuntimeError):
    """The cluster could not be started, or a command against it failed."""


def find_binary(name: str) -> str | None:
    """``name`` on ``PATH``, else in the usual ``sbin`` directories (not on a user's ``PATH``)."""
    found = shutil.which(name)
    if found:
        return found
    for directory in _SBIN:
        candidate = Path(directory, name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def skip_reason() -> str | None:
    """Why a cluster cannot run on this machine, or None when it can."""
    missing = [name for name in BINARIES if find_binary(name) is None]
    if missing:
        return (
            f"Slurm/MUNGE binaries missing: {', '.join(missing)} "
            "(install them with .ci/install-slurm.sh)"
        )
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (SlurmUser=root, slurmd runs as root)"
    return None


def parse_state(output: str) -> tuple[frozenset[str], str]:
    """State words and reason of the first node in ``scontrol show node`` output.

    ``IDLE+DRAIN`` gives ``{"IDLE", "DRAIN"}``, ``DOWN*`` gives ``{"DOWN", "NOT_RESPONDING"}``;
    the reason comes without scontrol's ``[user@time]`` stamp (``""`` when none).
    """
    state = _STATE.search(output)
    if state is None:
        raise SlurmClusterError(f"no State= in scontrol output: {output[:300]!r}")
    flags: set[str] = set()
    for word in state.group(1).split("+"):
        if "*" in word:
            flags.add("NOT_RESPONDING")
        if name := word.rstrip(_STATE_SUFFIXES).upper():
            flags.add(name)
    reason = _REASON.search(output)
    return frozenset(flags), reason.group(1) if reason else ""


def query_node_state(
    node: str, *, slurm_conf: str | os.PathLike[str], scontrol: str | None = None
) -> tuple[frozenset[str], str]:
    """``(state words, reason)`` of ``node`` on the cluster of ``slurm_conf``, read with
    ``scontrol show node`` (independently of :mod:`minder.actions.slurm`)."""
    binary = scontrol or find_binary("scontrol") or "scontrol"
    env = {**os.environ, "SLURM_CONF": os.fspath(slurm_conf)}
    completed = subprocess.run(
        [binary, "show", "node", node],
        capture_output=True,
        text=True,
        errors="replace",
        env=env,
        timeout=30,
        check=False,
    )
    if completed.returncode != 0:
        raise SlurmClusterError(
            f"scontrol show node {node} exited with {completed.returncode}: "
            f"{(completed.stdout + completed.stderr).strip()[:300]}"
        )
    return parse_state(completed.stdout)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free right now (held open together, then released)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in reversed(processes):
        # a daemon and what it forked (slurmctld's slurmscriptd): its whole process group
        stop_process(process, group=True)
    processes.clear()


class SlurmCluster:
    """A one-host Slurm cluster, started on ``__enter__`` and torn down on ``__exit__``.

    Parameters
    ----------
    nodes
        Node names (letters, digits, ``-``, ``_``); each gets its own ``slurmd``.
    cluster_name
        Slurm's ``ClusterName``.
    message_timeout_s
        Slurm's ``MessageTimeout``: how long a client keeps trying an unreachable controller
        (a low value keeps "controller down" tests short).
    start_timeout_s
        How long to wait for the controller to answer and every node to be ``IDLE``.
    keep_dir
        Leave the temporary directory (logs, conf) behind on exit, for debugging.
    """

    def __init__(
        self,
        nodes: Iterable[str] = DEFAULT_NODES,
        *,
        cluster_name: str = "minder-test",
        message_timeout_s: int = 3,
        start_timeout_s: float = 60.0,
        keep_dir: bool = False,
    ) -> None:
        self.nodes: tuple[str, ...] = tuple(nodes)
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        for node in self.nodes:
            if not _NODE_NAME.fullmatch(node):
                raise ValueError(f"node name {node!r} must match {_NODE_NAME.pattern}")
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"duplicate node names in {self.nodes}")
        self.cluster_name = cluster_name
        self.message_timeout_s = message_timeout_s
        self.start_timeout_s = start_timeout_s
        self.keep_dir = keep_dir
        self.start_seconds: float | None = None
        """How long the last ``start()`` took, until every node was ``IDLE``."""
        self._dir: Path | None = None
        self._processes: list[subprocess.Popen[bytes]] = []
        self._controller: subprocess.Popen[bytes] | None = None
        self._ports: dict[str, int] = {}
        self._binaries: dict[str, str] = {}
        self._finalizer: weakref.finalize[[list[subprocess.Popen[bytes]]], SlurmCluster] | None
        self._finalizer = None

    # -- paths and environment -----------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The temporary directory holding the conf, key, state, spool and logs."""
        if self._dir is None:
            raise SlurmClusterError("the cluster is not started")
        return self._dir

    @property
    def conf_path(self) -> Path:
        """The cluster's ``slurm.conf`` (give it to ``SlurmActuator(slurm_conf=...)``)."""
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Extra environment for Slurm clients: ``{"SLURM_CONF": ...}``."""
        return {"SLURM_CONF": str(self.conf_path)}

    @property
    def scontrol_path(self) -> str:
        """The ``scontrol`` binary this cluster uses."""
        return self._binaries.get("scontrol") or find_binary("scontrol") or "scontrol"

    @property
    def controller_port(self) -> int:
        """``SlurmctldPort``."""
        return self._ports["slurmctld"]

    # -- start and stop ------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the configuration, start the daemons and wait until every node is ``IDLE``."""
        reason = skip_reason()
        if reason:
            raise SlurmClusterError(reason)
        if self._dir is not None:
            raise SlurmClusterError("the cluster is already started")
        began = time.monotonic()
        self._binaries = {name: find_binary(name) or name for name in BINARIES}
        self._dir = Path(tempfile.mkdtemp(prefix="minder-slurm-"))
        # munged wants every directory above its socket searchable by all.
        self._dir.chmod(0o755)
        for sub in ("state", "spool", "log"):
            (self._dir / sub).mkdir(mode=0o755)
        ports = _free_ports(1 + len(self.nodes))
        self._ports = {"slurmctld": ports[0], **dict(zip(self.nodes, ports[1:], strict=True))}
        self._finalizer = weakref.finalize(self, _stop_all, self._processes)
        try:
            self._write_munge_key()
            self.write_conf(self.conf_path)
            self._start_munged()
            self.start_controller()
            for node in self.nodes:
                self._spawn(
                    f"slurmd-{node}",
                    [self._binaries["slurmd"], "-D", "-N", node, "-f", str(self.conf_path)],
                )
            for node in self.nodes:
                self.wait_for_state(node, lambda flags: flags == {"IDLE"}, self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        logger.info(
            "slurm test cluster up in %.1f s: %s, conf %s",
            self.start_seconds,
            ", ".join(self.nodes),
            self.conf_path,
        )

    def stop(self) -> None:
        """Stop every daemon and remove the temporary directory (unless ``keep_dir``)."""
        _stop_all(self._processes)
        self._controller = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._dir is not None:
            if self.keep_dir:
                logger.info("slurm test cluster files kept in %s", self._dir)
            else:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def stop_controller(self) -> None:
        """Stop ``slurmctld`` (clients then get "Unable to contact slurm controller")."""
        if self._controller is not None:
            stop_process(self._controller, group=True)
            self._processes.remove(self._controller)
            self._controller = None

    def start_controller(self, timeout_s: float | None = None) -> None:
        """Start ``slurmctld`` (again: it recovers node states from its state directory) and
        wait until it answers ``scontrol ping``."""
        if self._controller is not None and self._controller.poll() is None:
            return
        if self._controller is not None:
            self._processes.remove(self._controller)
        self._controller = self._spawn(
            "slurmctld", [self._binaries["slurmctld"], "-D", "-i", "-f", str(self.conf_path)]
        )
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while True:
            ping = self.scontrol("ping", check=False)
            if ping.returncode == 0 and "is UP" in ping.stdout:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"slurmctld did not answer within {timeout_s or self.start_timeout_s:g} s: "
                    f"{ping.stdout.strip()}\n{self.log_tail()}"
                )
            time.sleep(0.2)

    # -- configuration -------------------------------------------------------------------------

    def conf_text(self, overrides: Mapping[str, str] | None = None) -> str:
        """The ``slurm.conf`` text, with global ``Key=Value`` settings replaced or added."""
        directory = self.directory
        settings: dict[str, str] = {
            "ClusterName": self.cluster_name,
            "SlurmctldHost": "localhost",
            "SlurmctldPort": str(self._ports["slurmctld"]),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={directory / 'munge.socket'}",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/builtin",
            "SwitchType": "switch/none",
            "MpiDefault": "none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "ReturnToService": "2",
            "MessageTimeout": str(self.message_timeout_s),
            "MailProg": "/bin/true",
            "StateSaveLocation": str(directory / "state"),
            "SlurmdSpoolDir": str(directory / "spool" / "%n"),
            "SlurmctldPidFile": str(directory / "slurmctld.pid"),
            "SlurmdPidFile": str(directory / "slurmd-%n.pid"),
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
        }
        settings.update(overrides or {})
        lines = [
            f"# written by {__name__} for a test cluster",
            *(f"{k}={v}" for k, v in settings.items()),
        ]
        lines += [
            f"NodeName={node} NodeHostname={node} NodeAddr=127.0.0.1 Port={self._ports[node]} "
            "CPUs=1 RealMemory=100 State=UNKNOWN"
            for node in self.nodes
        ]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def write_conf(self, path: str | os.PathLike[str], **overrides: str) -> Path:
        """Write the cluster's ``slurm.conf`` to ``path`` with ``overrides`` (for a variant such
        as ``SlurmctldPort=<a dead port>``); a relative path lands in the cluster's directory."""
        target = self.directory / path
        target.write_text(self.conf_text(overrides), encoding="utf-8")
        return target

    def _write_munge_key(self) -> None:
        key = self.directory / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(128))

    # -- daemons -------------------------------------------------------------------------------

    def _spawn(self, name: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        log: IO[bytes]
        with open(self.directory / "log" / f"{name}.log", "ab") as log:
            process = subprocess.Popen(  # a fixed argument list, no shell
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: stop() ends what it forks
            )
        self._processes.append(process)
        return process

    def _start_munged(self) -> None:
        directory = self.directory
        socket_path = directory / "munge.socket"
        self._spawn(
            "munged",
            [
                self._binaries["munged"],
                "--foreground",
                f"--socket={socket_path}",
                f"--key-file={directory / 'munge.key'}",
                f"--pid-file={directory / 'munged.pid'}",
                f"--seed-file={directory / 'munged.seed'}",
                f"--log-file={directory / 'log' / 'munged-file.log'}",
                "--num-threads=2",
            ],
        )
        deadline = time.monotonic() + 15.0
        while not socket_path.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"munged made no socket in 15 s\n{self.log_tail()}")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        for process in self._processes:
            if process.poll() is not None:
                args = process.args
                command = args[0] if isinstance(args, list) and args else args
                raise SlurmClusterError(
                    f"{Path(str(command)).name} exited with {process.returncode}\n{self.log_tail()}"
                )

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of each daemon's log, for failure messages."""
        if self._dir is None:
            return ""
        parts = []
        for log in sorted((self._dir / "log").glob("*.log")):
            text = log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"== {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- clients -------------------------------------------------------------------------------

    def scontrol(
        self, *args: str, check: bool = True, timeout_s: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``scontrol`` against this cluster (as root: an operator's command)."""
        completed = subprocess.run(
            [self.scontrol_path, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            env={**os.environ, **self.env},
            timeout=timeout_s,
            check=False,
        )
        if check and completed.returncode != 0:
            raise SlurmClusterError(
                f"scontrol {' '.join(args)} exited with {completed.returncode}: "
                f"{(completed.stdout + completed.stderr).strip()[:500]}"
            )
        return completed

    def show_node(self, node: str) -> str:
        """The raw ``scontrol show node <node>`` output."""
        return self.scontrol("show", "node", node).stdout

    def node_state(self, node: str) -> tuple[frozenset[str], str]:
        """``(state words, reason)`` of ``node``: ``({"IDLE", "DRAIN"}, "minder:... gpu_xid")``."""
        return parse_state(self.show_node(node))

    def wait_for_state(
        self,
        node: str,
        predicate: Callable[[frozenset[str]], bool],
        timeout_s: float = 30.0,
    ) -> tuple[frozenset[str], str]:
        """Poll ``node`` until its state words satisfy ``predicate``; return its state."""
        deadline = time.monotonic() + timeout_s
        while True:
            flags, reason = self.node_state(node)
            if predicate(flags):
                return flags, reason
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"node {node} still {'+'.join(sorted(flags))} (reason {reason!r}) "
                    f"after {timeout_s:g} s\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def wait_idle(self, node: str, timeout_s: float = 30.0) -> tuple[frozenset[str], str]:
        """Wait until ``node`` is plain ``IDLE`` (no drain, responding)."""
        return self.wait_for_state(node, lambda flags: flags == {"IDLE"}, timeout_s)

    def drain(self, node: str, reason: str) -> None:
        """Drain ``node`` as an operator would."""
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def _client(self, name: str, *args: str, timeout_s: float = 30.0) -> str:
        completed = self.client(name, *args, timeout_s=timeout_s, check=True)
        return completed.stdout

    def client(
        self,
        name: str,
        *args: str,
        user: int | None = None,
        stdin_text: str | None = None,
        check: bool = True,
        timeout_s: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the Slurm client ``name`` (``sbatch``, ``squeue``, ``scancel``...) against this
        cluster, in its directory; as the user of uid ``user`` (its primary group, no
        supplementary groups, through ``setpriv``) instead of root when given."""
        binary = find_binary(name)
        if binary is None:
            raise SlurmClusterError(f"{name} is not installed")
        command = [binary, *args]
        if user is not None:
            setpriv = find_binary("setpriv")
            if setpriv is None:
                raise SlurmClusterError("setpriv is not installed (util-linux)")
            gid = pwd.getpwuid(user).pw_gid
            command = [setpriv, f"--reuid={user}", f"--regid={gid}", "--clear-groups", *command]
        completed = subprocess.run(
            command,
            stdin=subprocess.DEVNULL if stdin_text is None else None,
            input=stdin_text,
            capture_output=True,
            text=True,
            errors="replace",
            env={**os.environ, **self.env},
            cwd=self.directory,
            timeout=timeout_s,
            check=False,
        )
        if check and completed.returncode != 0:
            raise SlurmClusterError(
                f"{name} {' '.join(args)} exited with {completed.returncode}: "
                f"{(completed.stdout + completed.stderr).strip()[:500]}"
            )
        return completed

    def submit(
        self, *args: str, user: int | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``sbatch --parsable --chdir=/tmp --output=/dev/null <args>`` (as ``user`` when given);
        the job id is the first field of ``stdout`` (see :meth:`job_id_of`)."""
        return self.client(
            "sbatch",
            "--parsable",
            "--chdir=/tmp",
            "--output=/dev/null",
            *args,
            user=user,
            check=check,
        )

    @staticmethod
    def job_id_of(submitted: subprocess.CompletedProcess[str]) -> str:
        """The job id ``sbatch --parsable`` printed (``<id>`` or ``<id>;<cluster>``)."""
        return submitted.stdout.strip().split(";")[0]

    def show_job(self, job_id: str, *, details: bool = False) -> str:
        """The raw ``scontrol show job [-d] <id>`` output (``""`` once Slurm forgot the job)."""
        args = ("-d", "show", "job", job_id) if details else ("show", "job", job_id)
        shown = self.scontrol(*args, check=False)
        return shown.stdout if shown.returncode == 0 else ""

    def job_state(self, job_id: str) -> str | None:
        """The job's ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``...), None when unknown."""
        state = re.search(r"^\s+JobState=(\S+)", self.show_job(job_id), re.MULTILINE)
        return state.group(1) if state else None

    def job_field(self, job_id: str, field: str) -> str | None:
        """The value of ``field`` (``NodeList``, ``Reservation``, ``ExitCode``, ``UserId``...)
        where it starts a word in ``scontrol show job``, None when absent."""
        found = re.search(rf"(?:^|\s){re.escape(field)}=(\S*)", self.show_job(job_id), re.MULTILINE)
        return found.group(1) if found else None

    def wait_job(self, job_id: str, states: Iterable[str], timeout_s: float = 60.0) -> str:
        """Poll job ``job_id`` until its state is one of ``states``; return it."""
        wanted = frozenset(states)
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.job_state(job_id)
            if state in wanted:
                assert state is not None
                return state
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"job {job_id} still {state or 'unknown'} after {timeout_s:g} s, expected "
                    f"{'/'.join(sorted(wanted))}\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def batch_script(self, job_id: str) -> str:
        """The batch script Slurm stored for job ``job_id`` (``scontrol write batch_script``)."""
        return self.scontrol("write", "batch_script", job_id, "-").stdout

    def reservations(self) -> str:
        """The raw ``scontrol show reservation`` output."""
        return self.scontrol("show", "reservation", check=False).stdout

    def create_reservation(self, name: str, nodes: Sequence[str], *fields: str) -> None:
        """Create reservation ``name`` of ``nodes`` now, for root, as an operator would
        (``fields`` such as ``Flags=MAINT`` added)."""
        self.scontrol(
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={','.join(nodes)}",
            "Users=root",
            "StartTime=now",
            "Duration=UNLIMITED",
            *fields,
        )

    def delete_reservation(self, name: str) -> None:
        """Delete reservation ``name`` if it exists."""
        self.scontrol("delete", f"ReservationName={name}", check=False)

    def submit_sleep(
        self, node: str | Sequence[str], seconds: int = 60, timeout_s: float = 30.0
    ) -> str:
        """Run a ``sleep`` batch job on ``node`` (or on every one of several nodes) and wait until
        it runs; return its job id."""
        nodes = [node] if isinstance(node, str) else list(node)
        job_id = (
            self._client(
                "sbatch",
                "--parsable",
                f"--nodelist={','.join(nodes)}",
                f"--nodes={len(nodes)}",
                "--output=/dev/null",
                f"--wrap=sleep {seconds}",
            )
            .strip()
            .split(";")[0]
        )
        deadline = time.monotonic() + timeout_s
        while True:
            state = self._client("squeue", "--noheader", f"--jobs={job_id}", "--format=%T").strip()
            if state == "RUNNING":
                return job_id
            if time.monotonic() > deadline:
                raise SlurmClusterError(
                    f"job {job_id} on {node} still {state or 'gone'} after {timeout_s:g} s\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.2)

    def cancel_jobs(self, node: str) -> None:
        """Cancel every job on ``node``."""
        self._client("scancel", f"--nodelist={node}")

    def cancel_job(self, job_id: str, timeout_s: float = 30.0) -> None:
        """Cancel job ``job_id`` and wait until it has ended (``CANCELLED``, or forgotten)."""
        self._client("scancel", job_id)
        deadline = time.monotonic() + timeout_s
        while True:
            shown = self.scontrol("show", "job", job_id, check=False)
            state = re.search(r"^\s+JobState=(\S+)", shown.stdout, re.MULTILINE)
            if shown.returncode != 0 or (state and state.group(1) not in _JOB_ACTIVE):
                return
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"job {job_id} still active {timeout_s:g} s after scancel")
            time.sleep(0.2)

    def reset(self, node: str, timeout_s: float = 30.0) -> None:
        """Return ``node`` to plain ``IDLE`` whatever was done to it (between tests): cancel its
        jobs, resume it."""
        flags, _ = self.node_state(node)
        if flags & {"ALLOCATED", "MIXED", "COMPLETING"}:
            self.cancel_jobs(node)
        if flags != {"IDLE"} and flags & {"DRAIN", "DOWN", "FAIL"}:
            self.scontrol("update", f"NodeName={node}", "State=RESUME")
        self.wait_idle(node, timeout_s)
