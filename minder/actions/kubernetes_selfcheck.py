"""Kubernetes self-check launcher: one ``batch/v1`` Job per node of the check, pinned with
``spec.nodeName`` and tolerating Minder's taint (docs/selfcheck-schedulers.md).

The node stays cordoned and tainted (``minder.io/fault=<alert>:NoSchedule``) by
:class:`~minder.actions.kubernetes.KubernetesActuator` for the whole check: a pod with
``spec.nodeName`` set bypasses the scheduler, so neither the cordon nor the ``NoSchedule`` taint
stops it (the kubelet admits it, checking only ``NoExecute`` taints), while every other pod stays
off the node. The check's pods also carry a toleration for Minder's taint of this alert, so that
they would be admitted if the taint's effect ever became ``NoExecute``.

Objects, all in ``options.namespace`` and labelled ``app.kubernetes.io/managed-by=minder``,
``minder/selfcheck=<check id>``:

- a ``Secret`` ``minder-selfcheck-<check id>`` holding the check's token (key ``token``), created
  right after the suspect's Job and owned by it (``ownerReferences``: the garbage collector
  deletes it with that Job, also after ``ttlSecondsAfterFinished``); only the suspect's pod
  reads it, through ``valueFrom.secretKeyRef``, so it is never in a Job's spec and no partner
  sees it;
- one Job per node, ``minder-selfcheck-<check id>-<rank>`` (rank 0 is the suspect, then the
  partners): one Job per node rather than one indexed Job, because each pod is pinned to its own
  node with ``spec.nodeName``, which an indexed Job's single template cannot vary. Each has
  ``backoffLimit: 0`` and ``restartPolicy: Never`` (a crash is a failed check, not a retry),
  ``activeDeadlineSeconds`` (the check's timeout), ``ttlSecondsAfterFinished``, and a pod with
  ``hostNetwork: true`` (``dnsPolicy: ClusterFirstWithHostNet``): the collective check's
  rendezvous listens on the suspect node's ``InternalIP`` at ``options.master_port``
  (``MINDER_SELFCHECK_MASTER``), which the partners reach without a Service, and which tests the
  node's own network. A node that advertises ``nvidia.com/gpu`` gets a pod that asks for all of
  them (the kubelet admits a ``nodeName`` pod only if its resources fit), and
  ``MINDER_SELFCHECK_EXPECTED_GPUS`` is its ``status.capacity`` (an unhealthy GPU included), so
  that ``gpu.matmul`` fails when it sees fewer.

``release`` deletes the Jobs (``propagationPolicy: Background``: the garbage collector removes
their pods) and the Secret, and by the verdict either returns the node through
:meth:`KubernetesActuator.undo <minder.actions.kubernetes.KubernetesActuator.undo>` (Minder's own
taint, cordon and mark only) or keeps it out, its ``MinderFault`` condition saying why.

RBAC: :data:`RBAC_RULES` (cluster scope) and :data:`NAMESPACE_RBAC_RULES` (a Role in the checks'
namespace).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from minder.actions.base import ActionError, ActionOutcome, mark_for
from minder.actions.kubernetes import (
    ANNOTATION_ALERT,
    TAINT_EFFECT,
    TAINT_KEY,
    KubernetesActuator,
    check_node_name,
    is_minder_taint,
    one_line,
    server_message,
    taint_value,
)
from minder.actions.selfcheck import CheckLaunch, LauncherOptions, LaunchState, LaunchStatus

log = logging.getLogger(__name__)

NAME_PREFIX = "minder-selfcheck-"
"""Prefix of the check's Jobs and Secret (``minder-selfcheck-<check id>[-<rank>]``)."""
LABEL_CHECK = "minder/selfcheck"
LABEL_RANK = "minder/selfcheck-rank"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_CHECK_ALERT = "minder.io/selfcheck-alert"
TOKEN_ENV = "MINDER_SELFCHECK_TOKEN"
"""The environment variable of the check's token: read from the Secret, never inline, and only
by the suspect's Job (rank 0, which posts the report)."""
EXPECTED_GPUS_ENV = "MINDER_SELFCHECK_EXPECTED_GPUS"
"""The node's GPU count (``status.capacity``), which ``gpu.matmul`` compares with what it sees."""
SECRET_KEY = "token"
GPU_RESOURCE = "nvidia.com/gpu"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
DEFAULT_TTL_S = 3600
"""``ttlSecondsAfterFinished`` of the Jobs: the cluster deletes a finished check's Jobs an hour
after they end even when Minder never releases them (it died)."""

RBAC_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]
"""The ClusterRole rules of the launcher (with the actuator's: it returns or keeps nodes)."""
NAMESPACE_RBAC_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "list", "delete"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]},
]
"""The Role rules of the launcher in ``options.namespace``."""

_CHECK_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
"""A check id that makes DNS-1123 names: ``minder-selfcheck-<id>-<rank>`` fits in 63."""
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_REF = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/([a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?)")
_TERMINAL_PHASES = "status.phase!=Succeeded,status.phase!=Failed"
_TRANSIENT_CODES = frozenset({408, 425, 429})
_HARD_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_MAX_RANKS = 999


def _labels(check_id: str, rank: int | None = None) -> dict[str, str]:
    labels = {LABEL_MANAGED_BY: "minder", LABEL_CHECK: check_id}
    if rank is not None:
        labels[LABEL_RANK] = str(rank)
    return labels


def _owner_kinds(pod: dict[str, Any]) -> set[str]:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return {str(o.get("kind")) for o in owners if isinstance(o, dict) and o.get("controller")}


def is_workload(pod: dict[str, Any]) -> bool:
    """The pod is a workload's (a job's, a deployment's...), not a node daemon: neither owned by
    a DaemonSet nor a static pod's mirror."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return "DaemonSet" not in _owner_kinds(pod) and MIRROR_ANNOTATION not in annotations


def node_ready(node: dict[str, Any]) -> bool:
    """The node's ``Ready`` condition is ``True``."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def internal_ip(node: dict[str, Any]) -> str | None:
    """The node's first ``InternalIP`` address."""
    for address in (node.get("status") or {}).get("addresses") or []:
        if isinstance(address, dict) and address.get("type") == "InternalIP":
            value = address.get("address")
            return str(value) if value else None
    return None


def parse_ref(ref: str) -> tuple[str, str]:
    """``(namespace, check id)`` of a launch's ``scheduler_ref`` (``<namespace>/<check id>``).

    Raises
    ------
    ActionError
        (not transient) not a ref this launcher made.
    """
    match = _REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise ActionError(
            f"kubernetes: scheduler ref {one_line(repr(ref), 80)} is not '<namespace>/<check id>'",
            transient=False,
        )
    return match.group(1), match.group(3)


class KubernetesSelfCheckLauncher:
    """Runs self-checks as Kubernetes Jobs pinned to the nodes (see the module docstring).

    Parameters
    ----------
    actuator
        The Kubernetes actuator: its API client and credentials, its taint and mark, and its
        ``undo``/``apply`` to return or keep the node.
    options
        ``image`` of the check's container, ``namespace`` of its Jobs and Secret,
        ``master_port`` of the rendezvous on the suspect node.
    ttl_s
        ``ttlSecondsAfterFinished`` of the Jobs.
    """

    name = "kubernetes"

    def __init__(
        self,
        actuator: KubernetesActuator,
        options: LauncherOptions | None = None,
        *,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> None:
        self.actuator = actuator
        self.options = options or LauncherOptions()
        if not _NAMESPACE.fullmatch(self.options.namespace):
            raise ValueError(
                f"namespace {self.options.namespace[:80]!r} is not a namespace name "
                "(an RFC 1123 label)"
            )
        if not self.options.image or any(c.isspace() for c in self.options.image):
            raise ValueError(f"image {self.options.image[:80]!r}: expected an image reference")
        if not 0 < self.options.master_port < 65536:
            raise ValueError(f"master_port {self.options.master_port}: expected 1-65535")
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._core = k8s_client.CoreV1Api(actuator.api_client)
        self._batch = k8s_client.BatchV1Api(actuator.api_client)
        self._timeout = actuator.request_timeout_s

    # -- the protocol -----------------------------------------------------------------------

    def ready(self, node: str, *, alert_id: str) -> str | None:
        """Why ``node`` cannot be checked now, or None: it must carry Minder's mark and taint
        for ``alert_id``, be ``Ready``, and run no workload pod (DaemonSet and mirror pods do
        not count)."""
        check_node_name(node)
        found = self.actuator.read_node(node)
        why = self._not_marked(found, alert_id)
        if why is not None:
            return why
        if not node_ready(found):
            return f"node {node} is not Ready: it cannot run a check"
        busy = self._workload_pods(node).get(node, [])
        if busy:
            names = ", ".join(busy[:3]) + (f" and {len(busy) - 3} more" if len(busy) > 3 else "")
            return f"node {node} still runs pods ({names}): wait until they end"
        return None

    def partners(self, node: str, count: int) -> tuple[str, ...]:
        """Up to ``count`` idle nodes, by name: ``Ready``, schedulable, without a ``NoSchedule``
        or ``NoExecute`` taint or Minder's mark, running no workload pod (only DaemonSet and
        mirror pods), and of the suspect's instance type (label
        ``node.kubernetes.io/instance-type``) when it has one."""
        check_node_name(node)
        if count <= 0:
            return ()
        nodes = {n["metadata"]["name"]: n for n in self._list_nodes()}
        suspect = nodes.get(node)
        if suspect is None:
            raise ActionError(f"kubernetes: node {node} not found", transient=False)
        kind = ((suspect.get("metadata") or {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL)
        busy = self._workload_pods()
        chosen = [
            name
            for name, other in sorted(nodes.items())
            if name != node
            and self._idle(other)
            and name not in busy
            and (
                kind is None
                or (other["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL) == kind
            )
        ]
        return tuple(chosen[:count])

    def launch(self, launch: CheckLaunch) -> str:
        """Create the check's Secret and one Job per node; return ``<namespace>/<check id>``.

        Raises
        ------
        ActionError
            A bad check or a node Minder does not hold for the alert (not transient), the node
            still running pods or a partner no longer idle (transient), or the API server
            refused (see ``transient``). What was created before the failure is deleted.
        """
        self._check_launch(launch)
        namespace = self.options.namespace
        nodes = {n["metadata"]["name"]: n for n in self._list_nodes()}
        suspect = nodes.get(launch.node)
        if suspect is None:
            raise ActionError(f"kubernetes: node {launch.node} not found", transient=False)
        why = self._not_marked(suspect, launch.alert_id)
        if why is not None:  # someone else's hold never becomes Minder's
            raise ActionError(f"kubernetes: cannot check {launch.node}: {why}", transient=False)
        busy = self._workload_pods()
        if launch.node in busy:  # its pods do end
            raise ActionError(
                f"kubernetes: cannot check {launch.node}: it still runs pods "
                f"({', '.join(busy[launch.node][:3])})",
                transient=True,
            )
        for partner in launch.partners:
            other = nodes.get(partner)
            if other is None or not self._idle(other) or partner in busy:
                raise ActionError(
                    f"kubernetes: partner {partner} of the check of {launch.node} is no longer "
                    "idle",
                    transient=True,
                )
        address = internal_ip(suspect)
        if address is None:
            raise ActionError(
                f"kubernetes: node {launch.node} has no InternalIP address for the rendezvous",
                transient=False,
            )
        members = [launch.node, *launch.partners]
        token = launch.env.get(TOKEN_ENV)
        secret_name = f"{NAME_PREFIX}{launch.check_id}"
        created: list[str] = []
        secret_made = False
        try:
            for rank, member in enumerate(members):
                # Only the suspect (rank 0) posts the report: only its Job reads the token.
                secret = secret_name if token is not None and rank == 0 else None
                body = self._job(launch, rank, member, nodes[member], address, secret)
                answer = self._create_job(namespace, body)
                created.append(body["metadata"]["name"])
                if secret is not None and token is not None:
                    # After the suspect's Job, so that the Secret is owned by it (collected with
                    # it); its pod waits for the Secret (CreateContainerConfigError, retried).
                    owner = self._owner_reference(body["metadata"]["name"], answer)
                    self._create_secret(namespace, secret_name, launch, token, owner)
                    secret_made = True
        except BaseException as exc:
            log.warning(
                "kubernetes: launch of self-check %s on %s failed (%s); deleting what it made",
                launch.check_id,
                launch.node,
                one_line(str(exc)),
            )
            self._delete_jobs(namespace, created, quiet=True)
            if secret_made:
                self._delete_secret(namespace, secret_name, quiet=True)
            raise
        log.info(
            "kubernetes: self-check %s of node %s (alert %s) runs as Jobs %s in %s",
            launch.check_id,
            launch.node,
            launch.alert_id,
            ", ".join(created),
            namespace,
        )
        return f"{namespace}/{launch.check_id}"

    def ref_for(self, check_id: str) -> str:
        """``<namespace>/<check id>``: the ref :meth:`launch` returns, known before it (the
        check's objects are named and labelled by the check id)."""
        if not isinstance(check_id, str) or not _CHECK_ID.fullmatch(check_id):
            raise ActionError(
                f"kubernetes: check id {one_line(repr(check_id), 80)} must be 1-40 of "
                "a-z, 0-9 and '-' (it names Jobs: DNS-1123 labels)",
                transient=False,
            )
        return f"{self.options.namespace}/{check_id}"

    def status(self, ref: str) -> LaunchStatus:
        """The Jobs' state: ``Failed`` if any Job failed, ``Succeeded`` when every one is
        ``Complete``, ``Running`` when some pod runs (ready) or has ended, else ``Pending``;
        ``Gone`` when no Job of the check is left."""
        namespace, check_id = parse_ref(ref)
        jobs = self._list_jobs(namespace, check_id)
        if not jobs:
            return LaunchStatus(LaunchState.GONE, f"no Job of check {check_id} in {namespace}")
        failed, complete, started = [], [], False
        for job in jobs:
            name = job["metadata"]["name"]
            node = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "nodeName", "?"
            )
            status = job.get("status") or {}
            conditions = {
                c.get("type"): c
                for c in status.get("conditions") or []
                if isinstance(c, dict) and c.get("status") == "True"
            }
            bad = conditions.get("Failed") or conditions.get("FailureTarget")
            if bad is not None:
                reason = one_line(f"{bad.get('reason', '')} {bad.get('message', '')}", 120)
                failed.append(f"{name} on {node} failed: {reason}")
            elif "Complete" in conditions:
                complete.append(name)
            if int(status.get("ready") or 0) > 0 or int(status.get("succeeded") or 0) > 0:
                started = True
        if failed:
            return LaunchStatus(LaunchState.FAILED, "; ".join(failed))
        if len(complete) == len(jobs):
            return LaunchStatus(LaunchState.SUCCEEDED, f"{len(jobs)} Jobs complete")
        if started or complete:
            return LaunchStatus(
                LaunchState.RUNNING, f"{len(complete)} of {len(jobs)} Jobs complete, others run"
            )
        return LaunchStatus(LaunchState.PENDING, f"{len(jobs)} Jobs created, no pod ready yet")

    def release(
        self, ref: str, *, node: str, alert_id: str, passed: bool, reason: str
    ) -> ActionOutcome:
        """Delete the check's Jobs and Secret, then return the node (pass: Minder's taint,
        cordon and mark removed by the actuator's undo, and only Minder's) or keep it out
        (Minder's taint stays; its ``MinderFault`` condition says ``selfcheck <reason>``).
        Idempotent."""
        namespace, check_id = parse_ref(ref)
        check_node_name(node)
        steps: list[str] = []
        notes: list[str] = []
        if not passed:
            kept = self.actuator.apply(node, alert_id=alert_id, reason=_keep_reason(reason))
            (steps if kept.changed else notes).append(f"kept out: {kept.detail}")
        removed = self._remove(namespace, check_id)
        (steps if removed else notes).append(
            f"deleted {', '.join(removed)}" if removed else "the check's Jobs and Secret were gone"
        )
        if passed:
            returned = self.actuator.undo(node, alert_id=alert_id)
            (steps if returned.changed else notes).append(returned.detail)
        operation = "uncordon" if passed else "cordon"
        if steps:
            detail = ("returned: " if passed else "kept out of scheduling: ") + "; ".join(
                steps + notes
            )
            log.info("kubernetes: self-check %s on node %s released: %s", ref, node, detail)
        else:
            detail = "nothing to do (already released): " + "; ".join(notes)
        return ActionOutcome(self.name, node, operation, bool(steps), one_line(detail, 400))

    def cancel(self, ref: str) -> None:
        """Delete the check's Jobs (their pods with them) and Secret."""
        namespace, check_id = parse_ref(ref)
        removed = self._remove(namespace, check_id)
        if removed:
            log.info("kubernetes: cancelled self-check %s: deleted %s", ref, ", ".join(removed))

    # -- the pieces -------------------------------------------------------------------------

    def _not_marked(self, node: dict[str, Any], alert_id: str) -> str | None:
        meta = node.get("metadata") or {}
        name = meta.get("name", "?")
        owner = (meta.get("annotations") or {}).get(ANNOTATION_ALERT)
        if owner != alert_id:
            found = mark_for(one_line(owner, 64)) if owner is not None else "no Minder mark"
            return (
                f"node {name} is not held by Minder for {mark_for(alert_id)} (found {found}): "
                "Minder checks only nodes it took out"
            )
        value = taint_value(alert_id)
        taints = (node.get("spec") or {}).get("taints") or []
        if not any(is_minder_taint(t) and t.get("value") == value for t in taints):
            return f"node {name} lacks Minder's taint {TAINT_KEY}={value}:{TAINT_EFFECT}"
        return None

    @staticmethod
    def _idle(node: dict[str, Any]) -> bool:
        spec = node.get("spec") or {}
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        hard = [
            t
            for t in spec.get("taints") or []
            if isinstance(t, dict) and t.get("effect") in _HARD_EFFECTS
        ]
        return (
            node_ready(node)
            and not spec.get("unschedulable")
            and not hard
            and ANNOTATION_ALERT not in annotations
        )

    def _check_launch(self, launch: CheckLaunch) -> None:
        if not _CHECK_ID.fullmatch(launch.check_id):
            raise ActionError(
                f"kubernetes: check id {one_line(repr(launch.check_id), 80)} must be 1-40 of "
                "a-z, 0-9 and '-' (it names Jobs: DNS-1123 labels)",
                transient=False,
            )
        if not isinstance(launch.alert_id, str) or not launch.alert_id:
            raise ActionError("kubernetes: the check has no alert id", transient=False)
        members = [launch.node, *launch.partners]
        for member in members:
            check_node_name(member)
        if len(set(members)) != len(members) or len(members) > _MAX_RANKS:
            raise ActionError(
                f"kubernetes: the nodes {one_line(','.join(members), 120)!r} of the check repeat "
                f"a node or are more than {_MAX_RANKS}",
                transient=False,
            )
        launch.check_run("kubernetes")

    def _job(
        self,
        launch: CheckLaunch,
        rank: int,
        member: str,
        node: dict[str, Any],
        address: str,
        secret_name: str | None,
    ) -> dict[str, Any]:
        """The Job of ``member`` (``rank`` 0 is the suspect); its container reads
        ``MINDER_SELFCHECK_TOKEN`` from Secret ``secret_name`` when given (the suspect's only).
        ``MINDER_SELFCHECK_EXPECTED_GPUS`` is the node's ``status.capacity`` of
        ``nvidia.com/gpu`` (not ``allocatable``: a GPU the device plugin marked unhealthy
        counts)."""
        members = [launch.node, *launch.partners]
        literal = {k: v for k, v in launch.env.items() if k != TOKEN_ENV}
        literal.update(
            {
                "MINDER_SELFCHECK_NODES": ",".join(members),
                "MINDER_SELFCHECK_SUSPECT": launch.node,
                "MINDER_SELFCHECK_NODE": member,
                "MINDER_SELFCHECK_RANK": str(rank),
                "MINDER_SELFCHECK_WORLD": str(len(members)),
                "MINDER_SELFCHECK_MASTER": f"{address}:{self.options.master_port}",
                "MINDER_SELFCHECK_CHECK_ID": launch.check_id,
                "MINDER_SELFCHECK_TIMEOUT_S": f"{launch.timeout_s:g}",
            }
        )
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
        if capacity is not None and str(capacity).isdigit():
            literal[EXPECTED_GPUS_ENV] = str(int(str(capacity)))
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(literal.items())]
        if secret_name is not None:
            env.append(
                {
                    "name": TOKEN_ENV,
                    "valueFrom": {"secretKeyRef": {"name": secret_name, "key": SECRET_KEY}},
                }
            )
        container: dict[str, Any] = {
            "name": "selfcheck",
            "image": self.options.image,
            "command": list(launch.command),
            "env": env,
        }
        gpus = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
        if gpus and str(gpus) != "0":
            container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
        labels = _labels(launch.check_id, rank)
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{NAME_PREFIX}{launch.check_id}-{rank}",
                "namespace": self.options.namespace,
                "labels": labels,
                "annotations": {ANNOTATION_CHECK_ALERT: launch.alert_id},
            },
            "spec": {
                "backoffLimit": 0,
                "completions": 1,
                "parallelism": 1,
                "activeDeadlineSeconds": max(1, math.ceil(launch.timeout_s)),
                "ttlSecondsAfterFinished": self.ttl_s,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeName": member,
                        "restartPolicy": "Never",
                        "hostNetwork": True,
                        "dnsPolicy": "ClusterFirstWithHostNet",
                        "automountServiceAccountToken": False,
                        "terminationGracePeriodSeconds": 10,
                        "tolerations": [
                            {
                                "key": TAINT_KEY,
                                "operator": "Equal",
                                "value": taint_value(launch.alert_id),
                                "effect": TAINT_EFFECT,
                            }
                        ],
                        "containers": [container],
                    },
                },
            },
        }

    # -- the API ----------------------------------------------------------------------------

    @staticmethod
    def _owner_reference(name: str, created: dict[str, Any] | None) -> dict[str, Any]:
        """The ownerReference of the Job ``name`` the API server answered its create with."""
        uid = ((created or {}).get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise ActionError(
                f"kubernetes: the API server answered the create of Job {name} without a uid",
                transient=True,
            )
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": name,
            "uid": uid,
            "blockOwnerDeletion": False,
        }

    def _create_secret(
        self,
        namespace: str,
        name: str,
        launch: CheckLaunch,
        token: str,
        owner: dict[str, Any],
    ) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": _labels(launch.check_id),
                "annotations": {ANNOTATION_CHECK_ALERT: launch.alert_id},
                "ownerReferences": [owner],
            },
            "type": "Opaque",
            "data": {SECRET_KEY: base64.b64encode(token.encode()).decode()},
        }
        self._call(
            f"secret {namespace}/{name}",
            "create",
            "secrets",
            "",
            lambda: self._core.create_namespaced_secret(
                namespace, body, _preload_content=False, _request_timeout=self._timeout
            ),
        )

    def _create_job(self, namespace: str, body: Any) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        return self._call(
            f"job {namespace}/{name}",
            "create",
            "jobs",
            "batch",
            lambda: self._batch.create_namespaced_job(
                namespace, body, _preload_content=False, _request_timeout=self._timeout
            ),
        )

    def _list_nodes(self) -> list[dict[str, Any]]:
        answer = self._call(
            "nodes",
            "list",
            "nodes",
            "",
            lambda: self._core.list_node(_preload_content=False, _request_timeout=self._timeout),
        )
        return _items(answer, "nodes")

    def _workload_pods(self, node: str | None = None) -> dict[str, list[str]]:
        """``{node: [namespace/pod...]}`` of the workload pods that are not over (one list of
        every namespace's pods that are neither ``Succeeded`` nor ``Failed``; only ``node``'s,
        by a ``spec.nodeName`` field selector, when one is given)."""
        selector = _TERMINAL_PHASES if node is None else f"spec.nodeName={node},{_TERMINAL_PHASES}"
        answer = self._call(
            "of every node" if node is None else f"of node {node}",
            "list",
            "pods",
            "",
            lambda: self._core.list_pod_for_all_namespaces(
                field_selector=selector,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        busy: dict[str, list[str]] = {}
        for pod in _items(answer, "pods"):
            node = (pod.get("spec") or {}).get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if node and phase not in ("Succeeded", "Failed") and is_workload(pod):
                meta = pod.get("metadata") or {}
                busy.setdefault(str(node), []).append(f"{meta.get('namespace')}/{meta.get('name')}")
        return busy

    def _list_jobs(self, namespace: str, check_id: str) -> list[dict[str, Any]]:
        selector = f"{LABEL_CHECK}={check_id}"
        answer = self._call(
            f"jobs {selector} in {namespace}",
            "list",
            "jobs",
            "batch",
            lambda: self._batch.list_namespaced_job(
                namespace,
                label_selector=selector,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )
        return [
            job
            for job in _items(answer, "jobs")
            if (job.get("metadata") or {}).get("labels", {}).get(LABEL_CHECK) == check_id
        ]

    def _remove(self, namespace: str, check_id: str) -> list[str]:
        """Delete the check's Jobs and Secret; the names of what was deleted."""
        names = [job["metadata"]["name"] for job in self._list_jobs(namespace, check_id)]
        removed = [f"Job {name}" for name in self._delete_jobs(namespace, names)]
        if self._delete_secret(namespace, f"{NAME_PREFIX}{check_id}"):
            removed.append(f"Secret {NAME_PREFIX}{check_id}")
        return removed

    def _delete_jobs(
        self, namespace: str, names: Iterable[str], *, quiet: bool = False
    ) -> list[str]:
        deleted = []
        for name in names:
            try:
                answer = self._call(
                    f"job {namespace}/{name}",
                    "delete",
                    "jobs",
                    "batch",
                    functools.partial(
                        self._batch.delete_namespaced_job,
                        name,
                        namespace,
                        propagation_policy="Background",
                        _preload_content=False,
                        _request_timeout=self._timeout,
                    ),
                    missing_ok=True,
                )
            except ActionError as exc:
                if not quiet:
                    raise
                log.error("kubernetes: cannot delete Job %s/%s: %s", namespace, name, exc)
                continue
            if answer is not None:
                deleted.append(name)
        return deleted

    def _delete_secret(self, namespace: str, name: str, *, quiet: bool = False) -> bool:
        try:
            answer = self._call(
                f"secret {namespace}/{name}",
                "delete",
                "secrets",
                "",
                lambda: self._core.delete_namespaced_secret(
                    name, namespace, _preload_content=False, _request_timeout=self._timeout
                ),
                missing_ok=True,
            )
        except ActionError as exc:
            if not quiet:
                raise
            log.error("kubernetes: cannot delete Secret %s/%s: %s", namespace, name, exc)
            return False
        return answer is not None

    def _call(
        self,
        what: str,
        verb: str,
        resource: str,
        group: str,
        request: Callable[[], object],
        *,
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        """Run one request: its JSON answer, None for a 404 when ``missing_ok``, else an
        :class:`ActionError` naming ``verb resource what``."""
        response: Any = None
        try:
            response = request()
            data = response.data
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            raise _api_error(what, verb, resource, group, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActionError(
                f"kubernetes: cannot {verb} {what}: API server unreachable or too slow "
                f"({one_line(f'{type(exc).__name__}: {exc}')})",
                transient=True,
            ) from exc
        finally:
            release = getattr(response, "release_conn", None)
            if callable(release):
                release()
        try:
            answer = json.loads(data)
        except ValueError as exc:
            raise ActionError(
                f"kubernetes: cannot {verb} {what}: the answer is not JSON", transient=True
            ) from exc
        if not isinstance(answer, dict):
            raise ActionError(
                f"kubernetes: cannot {verb} {what}: the answer is not an object", transient=True
            )
        return answer


def _items(answer: dict[str, Any] | None, what: str) -> list[dict[str, Any]]:
    items = (answer or {}).get("items")
    if not isinstance(items, list):
        raise ActionError(f"kubernetes: the list of {what} is not a list", transient=True)
    return [
        item for item in items if isinstance(item, dict) and isinstance(item.get("metadata"), dict)
    ]


def _keep_reason(reason: str) -> str:
    text = " ".join(reason.split())
    return text if text.lower().startswith("selfcheck") else f"selfcheck {text}".strip()


def _api_error(what: str, verb: str, resource: str, group: str, exc: ApiException) -> ActionError:
    code = int(exc.status or 0)
    said = server_message(exc)
    if code in (401, 403):
        name = "401 Unauthorized" if code == 401 else "403 Forbidden"
        return ActionError(
            f"kubernetes: cannot {verb} {what}: {name}, RBAC must allow verb {verb!r} on "
            f"resource {resource!r} (API group {group!r}): {said}",
            transient=False,
        )
    if code in _TRANSIENT_CODES or code >= 500 or code == 0:
        return ActionError(
            f"kubernetes: cannot {verb} {what}: {code or 'no answer'} from the API server: {said}",
            transient=code != 0 or "certificate" not in said.lower(),
        )
    return ActionError(
        f"kubernetes: cannot {verb} {what}: {code} the API server refused the request: {said}",
        transient=False,
    )
