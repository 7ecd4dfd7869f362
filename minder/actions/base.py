"""The interface every scheduler target implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from minder.core.errors import MinderError

MINDER_MARK = "minder"
"""Prefix of every mark Minder leaves on a node (Slurm reason, taint key, condition reason), so
that an undo touches only what Minder set."""


class ActionError(MinderError):
    """An action could not be carried out.

    Parameters
    ----------
    message
        What failed, naming the node and the target.
    transient
        True when retrying later may succeed (target unreachable, timeout, conflict); False when
        it will not (unknown node, permission denied, bad configuration).
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """What one apply or undo did.

    Attributes
    ----------
    target
        The actuator's name (``slurm``, ``kubernetes``).
    node
        The scheduler's name of the node.
    operation
        ``drain``/``resume`` (Slurm) or ``cordon``/``uncordon`` (Kubernetes).
    changed
        False when the node already was in the wanted state (applies are idempotent) or, on undo,
        when Minder's mark for this alert was not there (someone else drained it, or already
        returned it): nothing was touched.
    detail
        One line for the audit trail: what was found and what was done.
    """

    target: str
    node: str
    operation: str
    changed: bool
    detail: str


class NodeActuator(Protocol):
    """Takes a node out of scheduling for an alert, and returns it when the alert ends.

    Implementations are idempotent and touch only what Minder set: ``undo`` returns the node only
    when Minder's mark for ``alert_id`` is on it.
    """

    name: str

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        """Take ``node`` out of scheduling, marked as Minder's for ``alert_id``.

        ``reason`` is one line for humans (alert kind, metric, devices); the implementation adds
        Minder's mark and the alert id, and truncates to the target's limits.

        Raises
        ------
        ActionError
            The target refused or could not be reached (see ``transient``).
        """
        ...

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        """Return ``node`` to scheduling if, and only if, Minder took it out for ``alert_id``.

        Raises
        ------
        ActionError
            The target refused or could not be reached (see ``transient``).
        """
        ...


class SchedulerView(Protocol):
    """What the scheduler says runs where: the check between an alert and an action.

    A node agent's report names its job and machine, but only the scheduler knows where a job
    runs. Minder acts on an alert's machine only when the scheduler confirms that the node runs
    the alert's job (a forged or misrouted report naming a healthy node outside the job is not
    acted on), and the service's admission of new jobs asks the same question.
    """

    name: str

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The scheduler's names of the nodes that job ``job_id`` runs on, or ran on until it
        ended recently (a fault often kills its job before Minder acts; the scheduler still
        knows the ended job for a while: Slurm's ``MinJobAge``, a Kubernetes Job's pods).

        None when the scheduler knows no such job (unknown, pending, long gone, or an id in a
        form the scheduler does not use). One or two cheap reads of the scheduler.

        Raises
        ------
        ActionError
            The scheduler could not be asked (``transient``: unreachable, timeout) or its answer
            could not be read (not transient).
        """
        ...


def mark_for(alert_id: str) -> str:
    """The token that ties a node's state to one alert: ``minder:<alert id>``."""
    return f"{MINDER_MARK}:{alert_id}"
