"""The interface every scheduler target implements to run a self-check on a node Minder drained
(docs/selfcheck-schedulers.md).

The service (:mod:`minder.service.selfcheck`) decides when a drained node gets a check; a
:class:`SelfCheckLauncher` does the scheduler's part:

1. :meth:`~SelfCheckLauncher.ready` — may the node be checked now? Only a node that Minder took
   out for this alert (its own mark), and that runs no job any more, is checked.
2. :meth:`~SelfCheckLauncher.partners` — healthy idle nodes for the collective check, never nodes
   of a running job.
3. :meth:`~SelfCheckLauncher.launch` — run ``minder selfcheck run`` on the node and its partners,
   holding them out of the pool while it runs (Slurm: a ``MAINT`` reservation for the check's
   user; Kubernetes: a Job with ``nodeName`` and a toleration for Minder's taint).
4. :meth:`~SelfCheckLauncher.status` — the launched check's state on the scheduler (the verdict
   itself comes through the API, authenticated by the check's token).
5. :meth:`~SelfCheckLauncher.release` — by the verdict: return the node to scheduling (pass, and
   only Minder's own drain), or keep it out with Minder's mark (fail, inconclusive, timeout);
   remove whatever the launch created.
6. :meth:`~SelfCheckLauncher.cancel` — stop a check that ran past its timeout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from minder.actions.base import ActionError, ActionOutcome

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True, slots=True)
class CheckLaunch:
    """What to run, where.

    Attributes
    ----------
    check_id
        The service's id of the check (names the scheduler's job and reservation).
    alert_id
        The alert whose drain the check answers (Minder's mark on the node names it).
    node
        The suspect node (scheduler's name).
    partners
        Healthy nodes for the collective check (may be empty: the collective check is then
        skipped, saying so).
    command
        The argv run once on every node of the check (suspect and partners), e.g.
        ``["minder", "selfcheck", "run", "--report", ...]``; the launcher adds the rendezvous
        (Slurm's ``srun`` variables, or ``MINDER_SELFCHECK_RANK``/``..._WORLD``/``..._MASTER``).
    env
        Extra environment for the command. Holds the check's secret token: never log it, never
        put it on a command line.
    timeout_s
        Wall time the scheduler allows the check (the service also times it out on its own).
    """

    check_id: str
    alert_id: str
    node: str
    partners: tuple[str, ...]
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 600.0

    def check_run(self, target: str) -> None:
        """Refuse, in one line naming ``target``, a command that is empty or holds an empty or
        NUL-bearing part, a timeout that is not a positive number of seconds, or an environment
        name that is not a variable name (what every launcher must be able to pass on)."""
        if not self.command or not all(
            isinstance(part, str) and part and "\x00" not in part for part in self.command
        ):
            raise ActionError(
                f"{target}: the check's command must be a non-empty list of non-empty strings",
                transient=False,
            )
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ActionError(
                f"{target}: check timeout {self.timeout_s!r}: expected a positive number of "
                "seconds",
                transient=False,
            )
        for key in self.env:
            if not _ENV_NAME.fullmatch(key):
                raise ActionError(
                    f"{target}: environment name {repr(key)[:80]} is not a variable name",
                    transient=False,
                )


@dataclass(frozen=True, slots=True)
class LauncherOptions:
    """How a target launches checks (from ``MINDER_SELFCHECK__*``, docs/selfcheck.md).

    Attributes
    ----------
    check_user
        Slurm: the user the check job runs as and the reservation admits (None: the user Minder
        runs as).
    image
        Kubernetes: the container image of the check Job (Minder's own image by default).
    namespace
        Kubernetes: where check Jobs are created.
    master_port
        The TCP port of the collective check's rendezvous on the suspect node.
    partition
        Slurm: the partition of check jobs and partners (None: the node's own partitions).
    sbatch_args
        Slurm: extra ``sbatch`` options of the check job (``--exclusive`` by default), e.g.
        ``--gres=gpu:8`` where cgroup ``ConstrainDevices=yes`` restricts a job's devices to the
        ones it was allocated. Without a ``--gres`` here, a node whose ``scontrol show node``
        says ``Gres=gpu:N`` (or ``gpu:<type>:N``) gets ``--gres=gpu:N``.
    """

    check_user: str | None = None
    image: str = "minder:latest"
    namespace: str = "minder"
    master_port: int = 29590
    partition: str | None = None
    sbatch_args: tuple[str, ...] = ("--exclusive",)


class LaunchState(StrEnum):
    """A launched check on the scheduler."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """The command exited 0 on every node (its verdict comes through the API)."""
    FAILED = "failed"
    """The command exited non-zero or was killed: without a report, the check is inconclusive."""
    GONE = "gone"
    """The scheduler no longer knows it."""


@dataclass(frozen=True, slots=True)
class LaunchStatus:
    state: LaunchState
    detail: str = ""


class SelfCheckLauncher(Protocol):
    """Runs self-checks on one scheduler (Slurm, Kubernetes)."""

    name: str

    def ready(self, node: str, *, alert_id: str) -> str | None:
        """Why ``node`` cannot be checked now (None: it can).

        It can when Minder's own mark for ``alert_id`` holds it out (Slurm: ``DRAIN`` with
        Minder's reason; Kubernetes: Minder's taint) and no job runs on it any more (Slurm:
        ``DRAINED``, not ``DRAINING``).

        Raises
        ------
        ActionError
            The scheduler could not be asked.
        """
        ...

    def partners(self, node: str, count: int) -> tuple[str, ...]:
        """Up to ``count`` healthy idle nodes in ``node``'s partition (pool), never nodes of a
        running job, nor drained or reserved ones."""
        ...

    def launch(self, launch: CheckLaunch) -> str:
        """Start the check; return the scheduler's handle (stored as ``scheduler_ref``).

        Raises
        ------
        ActionError
            The scheduler refused or could not be reached.
        """
        ...

    def ref_for(self, check_id: str) -> str:
        """The ref of a check before (or without) its launch: :meth:`release`, :meth:`cancel`
        and :meth:`status` accept it, so that a check whose launch was interrupted (a crash, a
        database error after the scheduler call) can still be cleaned up.

        Raises
        ------
        ActionError
            (not transient) ``check_id`` cannot name a check on this scheduler.
        """
        ...

    def status(self, ref: str) -> LaunchStatus:
        """The launched check's state."""
        ...

    def release(
        self, ref: str, *, node: str, alert_id: str, passed: bool, reason: str
    ) -> ActionOutcome:
        """Finish a check by its verdict.

        ``passed``: return ``node`` to scheduling — only when Minder's own hold for ``alert_id``
        is what keeps it out — and remove what :meth:`launch` created. Otherwise keep it out
        with Minder's mark for ``alert_id`` (``reason`` says why: failed checks, inconclusive,
        timeout) and remove what :meth:`launch` created. Idempotent.
        """
        ...

    def cancel(self, ref: str) -> None:
        """Stop a launched check (timeout, or the alert was closed by a person)."""
        ...
