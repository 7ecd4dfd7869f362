"""The self-check launcher of a scheduler target (docs/selfcheck-schedulers.md).

The service builds its :class:`~minder.actions.base.NodeActuator` from the ``actions`` settings;
:func:`build_selfcheck_launcher` gives the launcher that runs checks on the same scheduler, with
the same connection (``scontrol`` and ``SLURM_CONF``; the Kubernetes API client), so that the
check's hold on a node and Minder's drain are read and written the same way. Each target's module
is imported only when it is used (the Kubernetes client is not needed to run checks on Slurm).
"""

from __future__ import annotations

import logging

from minder.actions.base import NodeActuator
from minder.actions.selfcheck import LauncherOptions, SelfCheckLauncher

logger = logging.getLogger(__name__)


def build_selfcheck_launcher(
    actuator: NodeActuator, options: LauncherOptions
) -> SelfCheckLauncher | None:
    """The launcher for ``actuator``'s scheduler, or None when that target cannot run checks.

    Parameters
    ----------
    actuator
        The service's actuator: a :class:`~minder.actions.slurm.SlurmActuator` or a
        :class:`~minder.actions.kubernetes.KubernetesActuator`; any other (a test double, a target
        without jobs) gives None.
    options
        ``MINDER_SELFCHECK__*`` settings of the launch (check user, image, namespace, rendezvous
        port, partition).

    Raises
    ------
    ValueError
        ``options`` that the target cannot use (a user or partition name that cannot be one, a
        namespace that is not a DNS label, a port out of range), naming the value.
    """
    name = getattr(actuator, "name", None)
    if name == "slurm":
        from minder.actions.slurm import SlurmActuator  # noqa: PLC0415
        from minder.actions.slurm_selfcheck import SlurmSelfCheckLauncher  # noqa: PLC0415

        if isinstance(actuator, SlurmActuator):
            return SlurmSelfCheckLauncher(actuator, options)
    elif name == "kubernetes":
        from minder.actions.kubernetes import KubernetesActuator  # noqa: PLC0415
        from minder.actions.kubernetes_selfcheck import (  # noqa: PLC0415
            KubernetesSelfCheckLauncher,
        )

        if isinstance(actuator, KubernetesActuator):
            return KubernetesSelfCheckLauncher(actuator, options)
    logger.info(
        "self-checks: the actions target %s cannot run checks; none will be launched",
        type(actuator).__name__,
    )
    return None
