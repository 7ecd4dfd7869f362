"""Slurm self-check launcher: run ``minder selfcheck run`` on a node Minder drained, holding
the node out of the pool with a ``MAINT`` reservation while the check runs
(docs/selfcheck-schedulers.md).

A drained node runs no new job, not even a check. So the launch holds the node out another way
before it resumes it:

1. ``scontrol create reservation ReservationName=minder-selfcheck-<check id> Flags=MAINT
   Nodes=<suspect,partners> Users=<check user> StartTime=now Duration=UNLIMITED``. Without
   ``IGNORE_JOBS``: Slurm refuses the reservation ("Requested nodes are busy") when a job runs on
   one of the nodes, so a job that started on a partner since :meth:`partners` read it makes the
   launch fail (transient) instead of sharing the node. ``Duration=UNLIMITED`` (Slurm 22.05
   stores a year): if Minder dies mid-check, the nodes stay out rather than return unchecked.
2. ``scontrol update NodeName=<suspect> State=RESUME`` (only with Minder's mark for the alert,
   through :meth:`SlurmActuator.undo <minder.actions.slurm.SlurmActuator.undo>`): the node is idle
   but inside the reservation, where only the check user's jobs that name it may run.
3. ``sbatch --reservation=... --nodelist=<suspect,partners> --nodes=N --ntasks-per-node=1
   --no-requeue --time=<minutes> --job-name=minder-selfcheck-<check id> --comment=<Minder's mark,
   the check and the drain it replaces> --export=<names>``, with the batch script on standard
   input: it ``srun``\\ s the command once per node. The check's token and the rendezvous
   (``MINDER_SELFCHECK_*``) are in sbatch's environment and exported *by name*, so that neither
   the command line, ``scontrol show job`` nor the stored batch script holds them, and nothing
   else of Minder's environment reaches the nodes; the task of every node but the suspect unsets
   the token before the command runs. ``LauncherOptions.sbatch_args`` (``--exclusive`` by
   default) are added, and ``--gres=gpu:N`` with ``MINDER_SELFCHECK_EXPECTED_GPUS=N`` when the
   suspect's ``Gres=`` has N GPUs (unless ``sbatch_args`` has a ``--gres``).

A check whose job id was never stored (an interrupted launch) has the ref
:meth:`~SlurmSelfCheckLauncher.ref_for` (``:minder-selfcheck-<check id>``): its job is found by
name (``squeue``), and release works as with a full ref.

:meth:`~SlurmSelfCheckLauncher.release` ends the job (``scancel``; Slurm refuses to delete a
reservation in use), then by the verdict either drains the node again with Minder's mark *before*
deleting the reservation (so it is never schedulable in between), or deletes the reservation and
leaves the node idle — unless someone else drained it meanwhile, whose drain is kept.

Every Slurm command goes through :meth:`SlurmActuator.run_program
<minder.actions.slurm.SlurmActuator.run_program>` (fixed argument lists, no shell, the
actuator's ``SLURM_CONF`` and timeout), and its errors are classified as the actuator's are.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from minder.actions.base import ActionError, ActionOutcome, mark_for
from minder.actions.selfcheck import CheckLaunch, LauncherOptions, LaunchState, LaunchStatus
from minder.actions.slurm import (
    NodeState,
    SlurmActuator,
    carries_mark,
    check_alert_id,
    check_node_name,
    classify_error,
    excerpt,
    minder_mark_of,
    parse_show_node,
)

logger = logging.getLogger(__name__)

NAME_PREFIX = "minder-selfcheck-"
"""Prefix of the reservation and the job name of a check (``minder-selfcheck-<check id>``)."""

BUSY_FLAGS = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
"""State words of a node that still runs (or ends) a job."""
UNUSABLE_FLAGS = frozenset(
    [
        "DOWN",
        "NOT_RESPONDING",
        "FAIL",
        "FAILING",
        "FUTURE",
        "UNKNOWN",
        "INVAL",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "POWERING_UP",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
    ]
)
"""State words of a node that cannot run a check now (down, not responding, powered off...)."""
RESERVED_FLAGS = frozenset({"MAINT", "MAINTENANCE", "RESERVED"})
"""State words of a node inside an active reservation (Slurm 22.05 shows
``IDLE+MAINTENANCE+RESERVED`` a few seconds after a ``MAINT`` reservation starts)."""

JOB_STATES: Mapping[str, LaunchState] = {
    "PENDING": LaunchState.PENDING,
    "CONFIGURING": LaunchState.PENDING,
    "REQUEUED": LaunchState.PENDING,
    "REQUEUE_HOLD": LaunchState.PENDING,
    "REQUEUE_FED": LaunchState.PENDING,
    "RESV_DEL_HOLD": LaunchState.PENDING,
    "RUNNING": LaunchState.RUNNING,
    "COMPLETING": LaunchState.RUNNING,
    "SUSPENDED": LaunchState.RUNNING,
    "STOPPED": LaunchState.RUNNING,
    "SIGNALING": LaunchState.RUNNING,
    "STAGE_OUT": LaunchState.RUNNING,
    "RESIZING": LaunchState.RUNNING,
    "COMPLETED": LaunchState.SUCCEEDED,
    "FAILED": LaunchState.FAILED,
    "CANCELLED": LaunchState.FAILED,
    "TIMEOUT": LaunchState.FAILED,
    "NODE_FAIL": LaunchState.FAILED,
    "OUT_OF_MEMORY": LaunchState.FAILED,
    "BOOT_FAIL": LaunchState.FAILED,
    "DEADLINE": LaunchState.FAILED,
    "PREEMPTED": LaunchState.FAILED,
    "SPECIAL_EXIT": LaunchState.FAILED,
}
"""``JobState`` (``scontrol show job``, ``sacct``) to :class:`LaunchState`. A state not listed is
taken as still running (the service times the check out on its own)."""

ENDED_JOB_STATES = frozenset(
    state
    for state, launch in JOB_STATES.items()
    if launch in {LaunchState.SUCCEEDED, LaunchState.FAILED}
)

_CHECK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_REF = re.compile(
    r"([1-9][0-9]{0,9})?:(" + re.escape(NAME_PREFIX) + r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63})"
)
_GRES_GPU = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?:([0-9]{1,4})(?:\(|,|$)")
"""One GPU entry of a node's ``Gres=`` (``gpu:8``, ``gpu:a100:4(S:0-1)``)."""
TOKEN_ENV = "MINDER_SELFCHECK_TOKEN"
"""The check's token: exported to the suspect's task only (the batch script unsets it on the
partners)."""
EXPECTED_GPUS_ENV = "MINDER_SELFCHECK_EXPECTED_GPUS"
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?", re.IGNORECASE)
_FREE_TEXT = ("OS=", "Reason=", "Comment=", "Extra=")
_NO_SUCH_JOB = "invalid job id specified"
_NO_SUCH_RESERVATION = "requested reservation is invalid"
_RESERVATION_IN_USE = "reservation is in use"
_JOB_DONE = "already completing or completed"
_COMMENT_CHARS = 250
_OWN_SBATCH_OPTIONS = (
    "--export",
    "--job-name",
    "--reservation",
    "--nodelist",
    "--nodes",
    "--ntasks",
    "--chdir",
    "--output",
    "--uid",
    "--gid",
    "--parsable",
    "--comment",
)
"""``sbatch`` options the launcher sets itself: refused in ``LauncherOptions.sbatch_args``."""
_SUBMIT_TRANSIENT = ("temporarily", "try again", "timed out", "unable to contact", "busy")


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node of ``scontrol show node``: its state, address and partitions."""

    name: str
    state: NodeState
    address: str
    partitions: tuple[str, ...]
    gpus: int | None = None
    """The GPUs of the node's ``Gres=`` (None: no GPU there)."""

    @property
    def idle(self) -> bool:
        """Plain ``IDLE``: no job, not drained, down, reserved or powered off."""
        return self.state.flags == {"IDLE"}


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job of ``scontrol show job`` (or ``sacct``): its state, exit code and reason."""

    job_id: str
    state: str
    exit_code: str = ""
    reason: str = ""

    @property
    def active(self) -> bool:
        """Pending, running or ending: the job still holds (or may hold) its reservation."""
        return self.state not in ENDED_JOB_STATES

    def __str__(self) -> str:
        text = f"job {self.job_id} {self.state}"
        if self.exit_code and not self.active:
            text += f" exit {self.exit_code}"
        if self.reason and self.reason != "None":
            text += f" ({excerpt(self.reason, 80)})"
        return text


def parse_nodes(output: str) -> dict[str, SlurmNode]:
    """Every node record of ``scontrol show node`` (all nodes, multi-line format).

    ``NodeAddr=`` and ``Partitions=`` are read only where they start a line (never inside the
    free text of ``OS=``, ``Reason=``, ``Comment=`` or ``Extra=``).

    Raises
    ------
    ValueError
        A record without a readable ``NodeName=`` or ``State=``.
    """
    nodes: dict[str, SlurmNode] = {}
    for record in re.split(r"\n\s*\n", output):
        lines = [line for line in record.splitlines() if line.strip()]
        if not lines:
            continue
        first = lines[0].strip()
        if not first.startswith("NodeName="):
            raise ValueError(
                f"a node record starts with {excerpt(first, 60)!r}, expected NodeName="
            )
        name = first.split(None, 1)[0].removeprefix("NodeName=")
        state = parse_show_node(record, name)
        address, partitions, gres = "", "", ""
        for line in lines[1:]:
            stripped = line.strip()
            if stripped.startswith(_FREE_TEXT):
                continue
            key, _, value = stripped.split(None, 1)[0].partition("=")
            if key == "NodeAddr":
                address = value
            elif key == "Partitions":
                partitions = value
            elif key == "Gres":
                gres = value
        nodes[name] = SlurmNode(
            name=name,
            state=state,
            address=address,
            partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
            gpus=gres_gpus(gres),
        )
    return nodes


def gres_gpus(gres: str) -> int | None:
    """The number of GPUs in a node's ``Gres=`` value (``gpu:8``, ``gpu:a100:4(S:0-1)``, several
    types summed); None without a GPU entry (``(null)``, ``""``, other resources only)."""
    counts = [int(found.group(1)) for found in _GRES_GPU.finditer(gres)]
    return sum(counts) if counts else None


def parse_reservations(output: str) -> dict[str, str]:
    """``{reservation name: Nodes= host list}`` of ``scontrol show reservation`` (``""`` for a
    reservation of no nodes); ``{}`` for "No reservations in the system".

    Raises
    ------
    ValueError
        A record that does not start with ``ReservationName=``.
    """
    reservations: dict[str, str] = {}
    for record in re.split(r"\n\s*\n", output):
        lines = [line.strip() for line in record.splitlines() if line.strip()]
        if not lines or lines[0].startswith("No reservations"):
            continue
        if not lines[0].startswith("ReservationName="):
            raise ValueError(
                f"a reservation record starts with {excerpt(lines[0], 60)!r}, "
                "expected ReservationName="
            )
        name = lines[0].split(None, 1)[0].removeprefix("ReservationName=")
        nodes = ""
        for line in lines[1:]:
            key, _, value = line.split(None, 1)[0].partition("=")
            if key == "Nodes":
                nodes = "" if value == "(null)" else value
        reservations[name] = nodes
    return reservations


def parse_job(output: str, job_id: str) -> SlurmJob:
    """The state, exit code and reason of job ``job_id`` in ``scontrol show job <id>``.

    Only lines that start with ``JobState=`` or hold ``ExitCode=`` among Slurm's own fields are
    read (never the job's name, comment or command, which its owner chose).

    Raises
    ------
    ValueError
        No record of ``job_id``, or one without a single ``JobState=``.
    """
    for record in re.split(r"\n[ \t]*\n", output):
        lines = [line.strip() for line in record.splitlines() if line.strip()]
        if not lines or lines[0].split(None, 1)[0] != f"JobId={job_id}":
            continue
        states = [line for line in lines if line.startswith("JobState=")]
        if len(states) != 1:
            raise ValueError(f"the record of job {job_id} has {len(states)} JobState= lines")
        fields = dict(token.partition("=")[::2] for token in states[0].split())
        exit_code = ""
        for line in lines:
            if line.startswith("Requeue="):
                words = dict(token.partition("=")[::2] for token in line.split())
                exit_code = words.get("ExitCode", "")
        return SlurmJob(
            job_id=job_id,
            state=fields.get("JobState", "").upper(),
            exit_code=exit_code,
            reason=fields.get("Reason", ""),
        )
    raise ValueError(f"no record of job {job_id} in the output of scontrol show job")


def parse_ref(ref: str) -> tuple[str, str]:
    """``(job id, reservation)`` of a launch's ``scheduler_ref`` (``<job id>:<reservation>``);
    the job id is ``""`` in the ref of :meth:`SlurmSelfCheckLauncher.ref_for`
    (``:<reservation>``), whose job is found by its name.

    Raises
    ------
    ActionError
        (not transient) not a ref this launcher made.
    """
    match = _REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise ActionError(
            f"slurm: scheduler ref {excerpt(repr(ref), 80)} is not '[<job id>]:{NAME_PREFIX}<id>'",
            transient=False,
        )
    return match.group(1) or "", match.group(2)


def batch_script(command: tuple[str, ...] | list[str], srun: str = "srun") -> str:
    """The batch script of a check: one ``srun`` task per node, each with its rank, the world
    size and its node name in ``MINDER_SELFCHECK_RANK``/``_WORLD``/``_NODE`` (from Slurm's
    ``SLURM_PROCID``, ``SLURM_NTASKS`` and ``SLURMD_NODENAME``); ``--kill-on-bad-exit`` ends the
    other nodes' tasks when one fails, so that no partner waits for a dead rank. The task of
    every node but the suspect (``MINDER_SELFCHECK_SUSPECT``) unsets ``MINDER_SELFCHECK_TOKEN``
    before the command runs: only the suspect posts the report."""
    argv = " ".join(shlex.quote(part) for part in command)
    return (
        "#!/bin/sh\n"
        "# A Minder self-check (docs/selfcheck-schedulers.md): the same command once per node.\n"
        f'exec {shlex.quote(srun)} --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" '
        '--ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 -- /bin/sh -c '
        '\'export MINDER_SELFCHECK_RANK="$SLURM_PROCID" MINDER_SELFCHECK_WORLD="$SLURM_NTASKS" '
        'MINDER_SELFCHECK_NODE="$SLURMD_NODENAME"; '
        f'[ "$SLURMD_NODENAME" = "$MINDER_SELFCHECK_SUSPECT" ] || unset {TOKEN_ENV}; '
        'exec "$@"\' minder-selfcheck '
        f"{argv}\n"
    )


def _sibling(scontrol: str, name: str) -> str:
    """``name`` next to ``scontrol`` when that is a path, else ``name`` (looked up on PATH)."""
    directory = Path(scontrol).parent
    return str(directory / name) if str(directory) not in ("", ".") else name


def _keep_reason(reason: str) -> str:
    text = " ".join(reason.split())
    return text if text.lower().startswith("selfcheck") else f"selfcheck {text}".strip()


class SlurmSelfCheckLauncher:
    """Runs self-checks on Slurm with a ``MAINT`` reservation (see the module docstring).

    Parameters
    ----------
    actuator
        The Slurm actuator (its ``scontrol``, ``SLURM_CONF``, timeout, drain reason and mark).
    options
        ``check_user`` (the reservation's user and the job's; another user than Minder's needs
        Minder to run as root: ``sbatch --uid/--gid``), ``partition`` and ``master_port``.
    sbatch, scancel, sacct, squeue, srun
        The Slurm clients; by default the ones next to the actuator's ``scontrol`` when that is
        a path, else found on ``PATH`` (``srun`` on the nodes).
    work_dir
        The job's working directory on the nodes, where its output
        (``minder-selfcheck-<check id>-<job id>.out``) goes; the check user must be able to
        write there.
    end_wait_s
        How long :meth:`release` waits for a cancelled job to end and its reservation to become
        free before it gives up (transient: a retry finishes).
    clock, sleep
        Time source and sleep for those waits.
    """

    name = "slurm"

    def __init__(
        self,
        actuator: SlurmActuator,
        options: LauncherOptions | None = None,
        *,
        sbatch: str | None = None,
        scancel: str | None = None,
        sacct: str | None = None,
        squeue: str | None = None,
        srun: str = "srun",
        work_dir: str = "/tmp",
        end_wait_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.actuator = actuator
        self.options = options or LauncherOptions()
        if self.options.check_user is not None and not _USER.fullmatch(self.options.check_user):
            raise ValueError(
                f"check_user {self.options.check_user[:40]!r} is not a user name "
                "(letters, digits, '_', '.', '-')"
            )
        if not 0 < self.options.master_port < 65536:
            raise ValueError(f"master_port {self.options.master_port}: expected 1-65535")
        if self.options.partition is not None and not re.fullmatch(
            r"[A-Za-z0-9_.-]{1,64}", self.options.partition
        ):
            raise ValueError(f"partition {self.options.partition[:40]!r} is not a partition name")
        for option in self.options.sbatch_args:
            if not option.startswith("-") or "\x00" in option or "\n" in option:
                raise ValueError(f"sbatch_args: {option[:60]!r} is not an sbatch option")
            if option.split("=", 1)[0] in _OWN_SBATCH_OPTIONS:
                raise ValueError(f"sbatch_args: {option[:60]!r} is set by the launcher itself")
        if not os.path.isabs(work_dir):
            raise ValueError(f"work_dir {work_dir[:80]!r}: expected an absolute path")
        if end_wait_s < 0:
            raise ValueError(f"end_wait_s must be >= 0, got {end_wait_s}")
        self.sbatch = sbatch or _sibling(actuator.scontrol, "sbatch")
        self.scancel = scancel or _sibling(actuator.scontrol, "scancel")
        self.sacct = sacct or _sibling(actuator.scontrol, "sacct")
        self.squeue = squeue or _sibling(actuator.scontrol, "squeue")
        self.srun = srun
        self.work_dir = work_dir
        self.end_wait_s = end_wait_s
        self._clock = clock
        self._sleep = sleep

    # -- the protocol -----------------------------------------------------------------------

    def ready(self, node: str, *, alert_id: str) -> str | None:
        """Why ``node`` cannot be checked now, or None: it must be ``DRAINED`` (no job left) with
        Minder's mark for ``alert_id``, responding, and in no reservation."""
        check_alert_id(alert_id)
        return self._not_ready(self.actuator.node_state(node), alert_id)

    def partners(self, node: str, count: int) -> tuple[str, ...]:
        """Up to ``count`` plain ``IDLE`` nodes (no job, not drained, down, powered off or
        reserved) sharing a partition with ``node`` (``options.partition`` when set) and named
        in no reservation, by name. One ``scontrol show node`` and one ``scontrol show
        reservation``."""
        check_node_name(node)
        if count <= 0:
            return ()
        nodes = self._nodes()
        suspect = nodes.get(node)
        if suspect is None:
            raise ActionError(
                f"slurm: unknown node {node!r} (not in scontrol show node)", transient=False
            )
        pools = {self.options.partition} if self.options.partition else set(suspect.partitions)
        reserved = self._reserved_nodes()
        chosen = [
            other.name
            for other in sorted(nodes.values(), key=lambda n: n.name)
            if other.name != node
            and other.idle
            and pools.intersection(other.partitions)
            and other.name not in reserved
        ]
        return tuple(chosen[:count])

    def launch(self, launch: CheckLaunch) -> str:
        """Reserve the suspect and its partners, resume the suspect inside the reservation and
        submit the check job; return ``<job id>:<reservation>``.

        Raises
        ------
        ActionError
            A bad check (ids, command, environment names), a node Minder does not hold for the
            alert (not transient); the node still ending its job or a partner no longer idle
            (transient); or Slurm refused (see ``transient``). What was done before the failure
            is undone: the suspect drained again with Minder's mark, the reservation deleted.
        """
        self._check_launch(launch)
        node = launch.node
        reservation = NAME_PREFIX + launch.check_id
        nodes = self._nodes()
        suspect = nodes.get(node)
        if suspect is None:
            raise ActionError(
                f"slurm: unknown node {node!r} (not in scontrol show node)", transient=False
            )
        why = self._not_ready(suspect.state, launch.alert_id)
        if why is not None:
            # Someone else's hold never becomes Minder's; a job still ending does end.
            ours = carries_mark(suspect.state.reason, launch.alert_id)
            raise ActionError(f"slurm: cannot check node {node}: {why}", transient=ours)
        for partner in launch.partners:
            found = nodes.get(partner)
            if found is None or not found.idle:
                state = str(found.state) if found else "unknown"
                raise ActionError(
                    f"slurm: partner {partner} of the check of {node} is no longer idle ({state})",
                    transient=True,
                )
        if not suspect.address:
            raise ActionError(f"slurm: node {node} has no NodeAddr", transient=False)
        partition = self._partition(suspect, [nodes[p] for p in launch.partners])
        user, uid_args = self._check_user()
        all_nodes = [node, *launch.partners]
        drained_reason = suspect.state.reason

        self._create_reservation(reservation, all_nodes, user)
        try:
            resumed = self.actuator.undo(node, alert_id=launch.alert_id)
            if not resumed.changed:
                raise ActionError(
                    f"slurm: cannot check node {node}: Minder's drain was not there to lift "
                    f"({resumed.detail})",
                    transient=True,
                )
            job_id = self._submit(launch, reservation, partition, uid_args, suspect, drained_reason)
        except BaseException as exc:
            self._undo_launch(node, launch.alert_id, drained_reason, reservation, exc)
            raise
        logger.info(
            "slurm: self-check %s of node %s (alert %s) runs as job %s in reservation %s with "
            "partners %s",
            launch.check_id,
            node,
            launch.alert_id,
            job_id,
            reservation,
            ",".join(launch.partners) or "none",
        )
        return f"{job_id}:{reservation}"

    def ref_for(self, check_id: str) -> str:
        """``:minder-selfcheck-<check id>``: the ref of a check whose job id is not known (its
        launch was interrupted). :meth:`status`, :meth:`release` and :meth:`cancel` find its job
        by name (``squeue --name``, in the check's reservation)."""
        if not isinstance(check_id, str) or not _CHECK_ID.fullmatch(check_id):
            raise ActionError(
                f"slurm: check id {excerpt(repr(check_id), 80)} is not a plain token "
                "(letters, digits, '.', '_', '-'; at most 64 characters)",
                transient=False,
            )
        return f":{NAME_PREFIX}{check_id}"

    def status(self, ref: str) -> LaunchStatus:
        """The check job's state: ``scontrol show job``, then ``sacct`` for a job the controller
        forgot (when accounting exists), else :attr:`LaunchState.GONE`. For a ref without a job
        id (:meth:`ref_for`), the newest job of the check's name in its reservation
        (:attr:`LaunchState.GONE` when there is none)."""
        job_id, reservation = parse_ref(ref)
        if not job_id:
            found = self._jobs_named(reservation)
            if not found:
                return LaunchStatus(
                    LaunchState.GONE, f"no job named {reservation} is known to Slurm"
                )
            job_id = found[-1]
        job = self._job(job_id)
        if job is None:
            job = self._accounted_job(job_id)
        if job is None:
            return LaunchStatus(LaunchState.GONE, f"job {job_id} is unknown to Slurm")
        state = JOB_STATES.get(job.state)
        if state is None:
            logger.warning(
                "slurm: job %s is in a state Minder does not know: %s",
                job_id,
                excerpt(job.state, 40),
            )
            state = LaunchState.RUNNING
        return LaunchStatus(state, f"{job} in reservation {reservation}")

    def release(
        self, ref: str, *, node: str, alert_id: str, passed: bool, reason: str
    ) -> ActionOutcome:
        """End the check job, then by the verdict return the node (delete the reservation;
        lift Minder's drain for ``alert_id`` if one is on it) or keep it out (drain it with
        Minder's mark and ``selfcheck <reason>`` *first*, then delete the reservation).

        A ref without a job id (:meth:`ref_for`, a launch that was interrupted) ends every job
        of the check's name in its reservation (``squeue``), if any.

        Idempotent: a second release finds the job ended, the reservation gone and the node as
        wanted, and says so with ``changed=False``. A node someone else drained meanwhile keeps
        their drain and reason.

        Raises
        ------
        ActionError
            Slurm refused or could not be reached, or the job would not end within
            ``end_wait_s`` (transient: retry the release).
        """
        job_id, reservation = parse_ref(ref)
        check_node_name(node)
        check_alert_id(alert_id)
        steps: list[str] = []
        notes: list[str] = []
        if not passed:
            kept = self.actuator.apply(node, alert_id=alert_id, reason=_keep_reason(reason))
            (steps if kept.changed else notes).append(kept.detail)
        for job in [job_id] if job_id else self._jobs_named(reservation):
            ended = self._end_job(job)
            (steps if ended.startswith("cancelled") else notes).append(ended)
        if not job_id:
            notes.append(f"job ids of {reservation} looked up by name")
        held_by_other = False
        if passed:
            current = self.actuator.node_state(node)
            if carries_mark(current.reason, alert_id):
                resumed = self.actuator.undo(node, alert_id=alert_id)
                (steps if resumed.changed else notes).append(resumed.detail)
            elif current.drained or (current.out_of_service and current.reason):
                held_by_other = True
                other = minder_mark_of(current.reason)
                who = f"Minder for another alert ({other})" if other else "someone else"
                notes.append(f"left out of service: drained by {who} meanwhile ({current})")
        if self._delete_reservation(reservation):
            steps.append(f"deleted reservation {reservation}")
        else:
            notes.append(f"reservation {reservation} already deleted")
        # On a pass, ``changed`` says the node went back to service by this release: not when
        # someone else's drain still holds it, nor when an earlier release already returned it.
        changed = bool(steps) and not (passed and held_by_other)
        operation = "resume" if passed else "drain"
        verdict = "returned to service" if passed else "kept out of service"
        if held_by_other:
            verdict = "not returned (held by another drain)"
        if steps:
            detail = f"{verdict}: " + "; ".join(steps + notes)
        else:
            detail = "nothing to do (already released): " + "; ".join(notes)
        if steps:
            logger.info("slurm: self-check %s on node %s released: %s", ref, node, detail)
        return ActionOutcome(self.name, node, operation, changed, excerpt(detail, 400))

    def cancel(self, ref: str) -> None:
        """``scancel`` the check job (a job already ended or forgotten is not an error); with a
        ref without a job id, every job of the check's name in its reservation. The reservation
        stays until :meth:`release`."""
        job_id, reservation = parse_ref(ref)
        for job in [job_id] if job_id else self._jobs_named(reservation):
            self._scancel(job)

    # -- steps ------------------------------------------------------------------------------

    def _not_ready(self, state: NodeState, alert_id: str) -> str | None:
        if not carries_mark(state.reason, alert_id):
            if state.out_of_service and state.reason:
                other = minder_mark_of(state.reason)
                who = f"Minder for another alert ({other})" if other else "someone else"
                return (
                    f"drained by {who}, not by Minder for {mark_for(alert_id)} ({state}): "
                    "Minder checks only nodes it took out"
                )
            return f"not drained by Minder for {mark_for(alert_id)} ({state})"
        if not state.drained:
            return f"not drained ({state})"
        if busy := state.flags & (BUSY_FLAGS | {"DRAINING"}):
            return f"still runs a job ({'+'.join(sorted(busy))}, {state}): wait until it is DRAINED"
        if down := state.flags & UNUSABLE_FLAGS:
            return f"cannot run a check ({'+'.join(sorted(down))}, {state})"
        if reserved := state.flags & RESERVED_FLAGS:
            return f"in a reservation ({'+'.join(sorted(reserved))}, {state})"
        return None

    def _check_launch(self, launch: CheckLaunch) -> None:
        if not _CHECK_ID.fullmatch(launch.check_id):
            raise ActionError(
                f"slurm: check id {excerpt(repr(launch.check_id), 80)} is not a plain token "
                "(letters, digits, '.', '_', '-'; at most 64 characters)",
                transient=False,
            )
        check_alert_id(launch.alert_id)
        check_node_name(launch.node)
        for partner in launch.partners:
            check_node_name(partner)
        if launch.node in launch.partners or len(set(launch.partners)) != len(launch.partners):
            raise ActionError(
                f"slurm: the partners {excerpt(','.join(launch.partners), 120)!r} of the check "
                f"of {launch.node} repeat a node",
                transient=False,
            )
        launch.check_run("slurm")

    def _partition(self, suspect: SlurmNode, partners: list[SlurmNode]) -> str:
        if self.options.partition:
            return self.options.partition
        for partition in suspect.partitions:
            if all(partition in partner.partitions for partner in partners):
                return partition
        raise ActionError(
            f"slurm: node {suspect.name} and its partners share no partition "
            f"({','.join(suspect.partitions) or 'none'})",
            transient=False,
        )

    def _check_user(self) -> tuple[str, list[str]]:
        """The check user and the ``sbatch`` options that make the job run as them."""
        me = pwd.getpwuid(os.geteuid()).pw_name
        user = self.options.check_user or me
        if user == me:
            return user, []
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ActionError(
                f"slurm: check user {user!r} is unknown on Minder's host", transient=False
            ) from None
        return user, [f"--uid={entry.pw_uid}", f"--gid={entry.pw_gid}"]

    def _create_reservation(self, reservation: str, nodes: list[str], user: str) -> None:
        args = [
            "create",
            "reservation",
            f"ReservationName={reservation}",
            "Flags=MAINT",
            f"Nodes={','.join(nodes)}",
            f"Users={user}",
            "StartTime=now",
            "Duration=UNLIMITED",
        ]
        subject = f"reservation {reservation!r}"
        completed = self.actuator.run_program(
            self.actuator.scontrol, subject, "create", args, label="scontrol"
        )
        if completed.returncode != 0:
            output = (completed.stdout or "") + (completed.stderr or "")
            error = classify_error(subject, "create", completed.returncode, output)
            if "busy" in output.lower():  # a job started on a node since it was read
                raise ActionError(f"{error} (a node of the check runs a job)", transient=True)
            raise error
        logger.info(
            "slurm: created reservation %s (MAINT) of %s for %s", reservation, ",".join(nodes), user
        )

    def _submit(
        self,
        launch: CheckLaunch,
        reservation: str,
        partition: str,
        uid_args: list[str],
        suspect: SlurmNode,
        drained_reason: str,
    ) -> str:
        nodes = [launch.node, *launch.partners]
        environment = dict(launch.env)
        environment.update(
            {
                "MINDER_SELFCHECK_NODES": ",".join(nodes),
                "MINDER_SELFCHECK_SUSPECT": launch.node,
                "MINDER_SELFCHECK_MASTER": f"{suspect.address}:{self.options.master_port}",
                "MINDER_SELFCHECK_CHECK_ID": launch.check_id,
                "MINDER_SELFCHECK_TIMEOUT_S": f"{launch.timeout_s:g}",
            }
        )
        extra = list(self.options.sbatch_args)
        if suspect.gpus:
            environment[EXPECTED_GPUS_ENV] = str(suspect.gpus)
            if not any(option.split("=", 1)[0] == "--gres" for option in extra):
                extra.append(f"--gres=gpu:{suspect.gpus}")
        minutes = max(1, math.ceil(launch.timeout_s / 60.0))
        comment = excerpt(
            f"{mark_for(launch.alert_id)} selfcheck {launch.check_id} holds {launch.node} in "
            f"reservation {reservation} instead of the drain: {drained_reason}",
            _COMMENT_CHARS,
        ).replace('"', "'")
        args = [
            "--parsable",
            f"--job-name={NAME_PREFIX}{launch.check_id}",
            f"--reservation={reservation}",
            f"--partition={partition}",
            f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1",
            f"--time={minutes}",
            "--no-requeue",
            f"--comment={comment}",
            f"--chdir={self.work_dir}",
            f"--output={self.work_dir}/%x-%j.out",
            f"--export={','.join(sorted(environment))}",
            *extra,
            *uid_args,
        ]
        subject = f"the self-check job of node {launch.node!r}"
        completed = self.actuator.run_program(
            self.sbatch,
            subject,
            "submit",
            args,
            stdin_text=batch_script(launch.command, self.srun),
            extra_env=environment,
        )
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            error = classify_error(
                subject, "submit", completed.returncode, output, program="sbatch"
            )
            lowered = output.lower()
            if (
                error.transient
                and "submission failed" in lowered
                and not any(word in lowered for word in _SUBMIT_TRANSIENT)
            ):
                # The controller answered and refused the job (invalid partition, access denied
                # to the reservation, a node configuration it cannot give): a retry will not do.
                raise ActionError(str(error), transient=False)
            raise error
        first = (completed.stdout or "").strip().splitlines()[:1]
        job_id = first[0].split(";", 1)[0].strip() if first else ""
        if not job_id.isdigit():
            raise ActionError(
                f"slurm: cannot submit {subject}: sbatch said {excerpt(output)!r}, not a job id",
                transient=False,
            )
        return job_id

    def _undo_launch(
        self,
        node: str,
        alert_id: str,
        drained_reason: str,
        reservation: str,
        cause: BaseException,
    ) -> None:
        """Put back what a failed launch changed: Minder's drain first, then the reservation."""
        mark = mark_for(alert_id)
        reason = drained_reason.removeprefix(mark).strip() or "selfcheck launch failed"
        try:
            self.actuator.apply(node, alert_id=alert_id, reason=reason)
        except ActionError as exc:
            logger.error(
                "slurm: launch of a check on %s failed (%s) and the drain could not be "
                "put back: %s; reservation %s kept, holding the node out",
                node,
                excerpt(str(cause)),
                exc,
                reservation,
            )
            return
        try:
            self._delete_reservation(reservation)
        except ActionError as exc:
            logger.error(
                "slurm: launch of a check on %s failed (%s); its reservation %s could "
                "not be deleted: %s",
                node,
                excerpt(str(cause)),
                reservation,
                exc,
            )

    def _end_job(self, job_id: str) -> str:
        """Cancel job ``job_id`` if it is still active and wait until it has ended."""
        job = self._job(job_id)
        if job is None:
            return f"job {job_id} already ended"
        if not job.active:
            return f"{job} already ended"
        was = job.state
        self._scancel(job_id)
        deadline = self._clock() + self.end_wait_s
        while True:
            job = self._job(job_id)
            if job is None or not job.active:
                return f"cancelled job {job_id} (was {was})"
            if self._clock() >= deadline:
                raise ActionError(
                    f"slurm: job {job_id} still {job.state} {self.end_wait_s:g} s after scancel; "
                    "retry the release",
                    transient=True,
                )
            self._sleep(0.2)

    def _delete_reservation(self, reservation: str) -> bool:
        """Delete ``reservation``; False when it was already gone. Waits up to ``end_wait_s``
        while Slurm says it is in use (its job is still ending)."""
        subject = f"reservation {reservation!r}"
        deadline = self._clock() + self.end_wait_s
        while True:
            completed = self.actuator.run_program(
                self.actuator.scontrol,
                subject,
                "delete",
                ["delete", f"ReservationName={reservation}"],
                label="scontrol",
            )
            if completed.returncode == 0:
                logger.info("slurm: deleted reservation %s", reservation)
                return True
            output = (completed.stdout or "") + (completed.stderr or "")
            lowered = output.lower()
            if _NO_SUCH_RESERVATION in lowered or "not found" in lowered:
                return False
            if _RESERVATION_IN_USE in lowered and self._clock() < deadline:
                self._sleep(0.2)
                continue
            error = classify_error(subject, "delete", completed.returncode, output)
            if _RESERVATION_IN_USE in lowered:
                raise ActionError(f"{error}; retry the release", transient=True)
            raise error

    def _scancel(self, job_id: str) -> None:
        subject = f"job {job_id!r}"
        completed = self.actuator.run_program(self.scancel, subject, "cancel", [job_id])
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            lowered = output.lower()
            if _NO_SUCH_JOB in lowered or _JOB_DONE in lowered:
                return
            raise classify_error(subject, "cancel", completed.returncode, output, program="scancel")
        logger.info("slurm: cancelled self-check job %s", job_id)

    # -- reading ----------------------------------------------------------------------------

    def _nodes(self) -> dict[str, SlurmNode]:
        subject = "every node"
        completed = self.actuator.run_program(
            self.actuator.scontrol, subject, "read", ["show", "node"], label="scontrol"
        )
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            raise classify_error(subject, "read", completed.returncode, output)
        try:
            return parse_nodes(completed.stdout or "")
        except ValueError as exc:
            raise ActionError(
                f"slurm: cannot read the nodes: {excerpt(str(exc))}", transient=False
            ) from None

    def _reserved_nodes(self) -> frozenset[str]:
        subject = "the reservations"
        completed = self.actuator.run_program(
            self.actuator.scontrol, subject, "read", ["show", "reservation"], label="scontrol"
        )
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            if "no reservations" in output.lower():
                return frozenset()
            raise classify_error(subject, "read", completed.returncode, output)
        try:
            reservations = parse_reservations(completed.stdout or "")
        except ValueError as exc:
            raise ActionError(
                f"slurm: cannot read the reservations: {excerpt(str(exc))}", transient=False
            ) from None
        reserved: set[str] = set()
        for hostlist in reservations.values():
            reserved |= self.actuator.expand_hostlist(hostlist)
        return frozenset(reserved)

    def _job(self, job_id: str) -> SlurmJob | None:
        subject = f"job {job_id!r}"
        completed = self.actuator.run_program(
            self.actuator.scontrol, subject, "read", ["show", "job", job_id], label="scontrol"
        )
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            if _NO_SUCH_JOB in output.lower():
                return None
            raise classify_error(subject, "read", completed.returncode, output)
        try:
            return parse_job(completed.stdout or "", job_id)
        except ValueError as exc:
            raise ActionError(
                f"slurm: cannot read job {job_id}: {excerpt(str(exc))}", transient=False
            ) from None

    def _jobs_named(self, reservation: str) -> list[str]:
        """Ids (oldest first) of the jobs Slurm still knows named ``reservation`` (a check's job
        is named as its reservation) that run, ran or wait in that reservation."""
        subject = f"jobs named {reservation!r}"
        completed = self.actuator.run_program(
            self.squeue,
            subject,
            "read",
            ["--noheader", "--states=all", f"--name={reservation}", "--format=%i|%v"],
        )
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            raise classify_error(subject, "read", completed.returncode, output, program="squeue")
        found: list[str] = []
        for line in (completed.stdout or "").splitlines():
            job_id, _, where = line.strip().partition("|")
            if job_id.isdigit() and where == reservation and job_id not in found:
                found.append(job_id)
        return sorted(found, key=int)

    def _accounted_job(self, job_id: str) -> SlurmJob | None:
        """Job ``job_id`` in Slurm's accounting (``sacct``), or None without accounting."""
        subject = f"job {job_id!r}"
        try:
            completed = self.actuator.run_program(
                self.sacct,
                subject,
                "read",
                [
                    "--noheader",
                    "--parsable2",
                    "--allocations",
                    f"--jobs={job_id}",
                    "--format=JobID,State,ExitCode",
                ],
            )
        except ActionError as exc:
            logger.debug("slurm: sacct unavailable for job %s: %s", job_id, exc)
            return None
        if completed.returncode != 0:
            logger.debug(
                "slurm: sacct knows no job %s: %s",
                job_id,
                excerpt((completed.stdout or "") + (completed.stderr or "")),
            )
            return None
        for line in (completed.stdout or "").splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[0] == job_id:
                state = parts[1].split(None, 1)[0].upper() if parts[1].strip() else ""
                return SlurmJob(job_id, state, parts[2], "from accounting")
        return None
