"""Take a faulty node out of Kubernetes scheduling, NVSentinel-style: cordon, taint, condition.

``apply`` changes the Node in four ways, and records what it changed so that ``undo`` returns
exactly that:

- **cordon**: ``spec.unschedulable: true``, as ``kubectl cordon`` does;
- **taint**: ``minder.io/fault=<alert id>:NoSchedule`` (the id made a valid label value).
  ``NoSchedule`` keeps new pods off and leaves running pods alone;
- **condition**: ``MinderFault=True`` with reason ``MinderAlert`` and the message
  ``minder:<alert id> <reason>``, written through the ``nodes/status`` subresource, so that
  ``kubectl describe node`` says why;
- **annotations**: ``minder.io/alert: <alert id>`` (Minder's mark), and ``minder.io/cordoned:
  "true"`` only when the node was schedulable before Minder cordoned it.

``undo`` acts only when ``minder.io/alert`` names the alert. It removes Minder's taint (other
taints stay, even ones with the same effect), uncordons only when ``minder.io/cordoned`` says
Minder cordoned the node (a node that an operator cordoned stays cordoned), sets the condition to
``False`` with reason ``MinderAlertEnded`` instead of deleting it, and removes the annotations.
Both are idempotent: a second call finds nothing to do and reports ``changed=False``. A node that
Minder already took out for another alert is left as it is by ``apply``: the mark, and so the
``undo``, stay with the first alert.

Draining is not done here. Nothing is evicted, and there is no ``NoExecute`` taint: taking the
workload off the node is left to the operator's remediation, as NVSentinel leaves it to its
separate drain module.

Concurrency: the writes to ``metadata`` and ``spec`` are JSON merge patches (RFC 7386: the
``taints`` list is replaced whole) that carry the ``metadata.resourceVersion`` that was read.
If someone else wrote the node in between, the API server answers 409 ``Conflict``. The
actuator then reads the node again, recomputes the patch and retries, a bounded number of times
with jittered back-off (``tenacity``). A JSON patch ``test`` of the resourceVersion would not do:
the API server answers a failed ``test`` with 422 ``Invalid``, the same code as other invalid
patches. The condition is a strategic merge patch of ``nodes/status``, where ``conditions``
merge by ``type``, so it cannot overwrite the kubelet's conditions and needs no precondition.

Before a cordon, the executor asks :meth:`KubernetesActuator.job_nodes` where the alert's job
runs: the pods that carry the job label (``job_label``, ``job-name`` by default: the label
Kubernetes puts on a ``batch/v1`` Job's pods, and the one ``MINDER_JOB`` is read from through the
downward API) with the job id as value, in phase ``Running``, ``Succeeded`` or ``Failed`` (a
field selector), and their
``spec.nodeName``. A job id that is not a label value names no pods.

RBAC (a ClusterRole): :data:`RBAC_RULES`, i.e. ``get`` and ``patch`` on ``nodes``, ``patch`` on
``nodes/status`` and ``list`` on ``pods`` in the core group.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from minder.actions.base import ActionError, ActionOutcome, mark_for

log = logging.getLogger(__name__)

TAINT_KEY = "minder.io/fault"
TAINT_EFFECT = "NoSchedule"
CONDITION_TYPE = "MinderFault"
CONDITION_REASON = "MinderAlert"
CONDITION_REASON_ENDED = "MinderAlertEnded"
ANNOTATION_ALERT = "minder.io/alert"
ANNOTATION_CORDONED = "minder.io/cordoned"
FIELD_MANAGER = "minder"
DEFAULT_JOB_LABEL = "job-name"
"""The pod label whose value is Minder's job id (set on a Job's pods by the Job controller)."""

CONDITION_MESSAGE_MAX = 1024
"""Characters of the condition's message (``kubectl describe`` stays readable)."""
ERROR_TEXT_MAX = 200
"""Characters of untrusted text (the API server's message) quoted in an :class:`ActionError`."""

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

RBAC_RULES: list[dict[str, list[str]]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]
"""The ClusterRole rules the actuator needs, and no more."""

_NODE_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_TRANSIENT_CODES = frozenset({408, 425, 429})
_LABEL_VALUE_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_KEY_RE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


_PLACED_PHASES = frozenset({"Running", "Succeeded", "Failed"})
"""Phases of a pod that runs or ran on its node (``Pending`` has none yet; ``Unknown`` is not
known)."""


class _ConflictError(Exception):
    """The API server answered 409: someone wrote the node since we read it."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _one_line(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """``text`` on one line (control characters and runs of spaces become one space), cut to
    ``limit`` characters."""
    flat = " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taint_value(alert_id: str) -> str:
    """The alert id as a taint value (a label value: at most 63 characters of ``[A-Za-z0-9_.-]``
    that start and end alphanumeric), or ``alert`` when nothing of it is left."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", alert_id)[:63]
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    return value or "alert"


def condition_message(alert_id: str, reason: str) -> str:
    """``minder:<alert id> <reason>`` on one line, at most :data:`CONDITION_MESSAGE_MAX`."""
    return _one_line(f"{mark_for(alert_id)} {reason}", CONDITION_MESSAGE_MAX)


def _is_ours(taint: Any) -> bool:
    return (
        isinstance(taint, dict)
        and taint.get("key") == TAINT_KEY
        and taint.get("effect") == TAINT_EFFECT
    )


def is_minder_taint(taint: Any) -> bool:
    """``taint`` is Minder's (key :data:`TAINT_KEY`, effect :data:`TAINT_EFFECT`), for any alert."""
    return _is_ours(taint)


def one_line(text: str, limit: int = ERROR_TEXT_MAX) -> str:
    """Untrusted ``text`` on one line, cut to ``limit`` characters."""
    return _one_line(text, limit)


def check_node_name(node: str) -> None:
    """Refuse anything but a node name (an RFC 1123 subdomain).

    Raises
    ------
    ActionError
        (not transient) ``node`` is not a node name.
    """
    _check_node_name(node)


def server_message(exc: ApiException) -> str:
    """The ``message`` of the API server's ``Status`` in ``exc`` (else its HTTP reason), on one
    line and truncated."""
    return _server_message(exc)


def _condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == CONDITION_TYPE:
            return condition
    return None


class KubernetesActuator:
    """Cordons, taints and marks Kubernetes nodes for Minder's alerts (see the module doc).

    Parameters
    ----------
    api_client
        A ``kubernetes.client.ApiClient`` for the cluster (see :meth:`from_config`).
    request_timeout_s
        Limit of each HTTP request to the API server.
    conflict_attempts
        How many times one apply or undo is tried when the node keeps changing under it (409).
    conflict_backoff_s
        Scale of the jittered exponential back-off between those attempts (capped at 1 s).
    clock
        The time written into the condition (UTC).
    job_label
        The pod label whose value is Minder's job id (:meth:`job_nodes`).
    job_namespace
        Look for a job's pods in this namespace only; None: in every namespace.
    """

    name = "kubernetes"

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        request_timeout_s: float = 10.0,
        conflict_attempts: int = 5,
        conflict_backoff_s: float = 0.05,
        clock: Callable[[], datetime] = _utcnow,
        job_label: str = DEFAULT_JOB_LABEL,
        job_namespace: str | None = None,
    ) -> None:
        if conflict_attempts < 1:
            raise ValueError(f"conflict_attempts must be at least 1, got {conflict_attempts}")
        if not (len(job_label) <= 316 and _LABEL_KEY_RE.fullmatch(job_label)):
            raise ValueError(
                f"job_label {job_label[:80]!r} is not a label key (e.g. job-name, example.com/job)"
            )
        if job_namespace is not None and not _NAMESPACE_RE.fullmatch(job_namespace):
            raise ValueError(
                f"job_namespace {job_namespace[:80]!r} is not a namespace name (an RFC 1123 label)"
            )
        self.job_label = job_label
        self.job_namespace = job_namespace
        self._api_client = api_client
        self._core = k8s_client.CoreV1Api(api_client)
        self._timeout = request_timeout_s
        self._attempts = conflict_attempts
        self._backoff = conflict_backoff_s
        self._clock = clock

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        *,
        request_timeout_s: float = 10.0,
        job_label: str = DEFAULT_JOB_LABEL,
        job_namespace: str | None = None,
    ) -> KubernetesActuator:
        """An actuator for the cluster of a kubeconfig (``kubeconfig`` None: ``$KUBECONFIG`` or
        ``~/.kube/config``; ``context`` None: its current context), or of the pod's service
        account (``in_cluster``). The settings go into a new ``Configuration``, never the
        client library's global default.

        Raises
        ------
        ActionError
            (not transient) the configuration cannot be loaded.
        """
        if in_cluster and (kubeconfig or context):
            raise ActionError(
                "kubernetes: in_cluster uses the pod's service account; do not also give a "
                "kubeconfig or context",
                transient=False,
            )
        configuration = k8s_client.Configuration()
        source = "in-cluster service account" if in_cluster else "kubeconfig"
        try:
            if in_cluster:
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                k8s_config.load_kube_config(
                    config_file=kubeconfig,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except (ConfigException, OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
            raise ActionError(
                f"kubernetes: cannot load the {source} configuration: {_one_line(str(exc))}",
                transient=False,
            ) from exc
        return cls(
            k8s_client.ApiClient(configuration),
            request_timeout_s=request_timeout_s,
            job_label=job_label,
            job_namespace=job_namespace,
        )

    def close(self) -> None:
        """Close the API client's connection pool."""
        self._api_client.close()

    @property
    def api_client(self) -> k8s_client.ApiClient:
        """The API client (the self-check launcher shares its connection and credentials)."""
        return self._api_client

    @property
    def request_timeout_s(self) -> float:
        """Limit of each HTTP request to the API server."""
        return self._timeout

    def read_node(self, node: str) -> dict[str, Any]:
        """The Node ``node`` as the API server stores it (JSON).

        Raises
        ------
        ActionError
            Not a node name, unknown node, API server unreachable, RBAC without ``get`` on
            ``nodes``.
        """
        _check_node_name(node)
        return self._read(node)

    # -- the scheduler's view ---------------------------------------------------------------

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The nodes that run a pod of job ``job_id`` now
        (:class:`~minder.actions.base.SchedulerView`): one list of the pods labelled
        ``<job_label>=<job_id>`` that run or ran (phase ``Running``, ``Succeeded``, ``Failed``),
        read for their ``spec.nodeName``.

        None when no such pod runs (or ``job_id`` is not a label value, so no pod can carry it).

        Raises
        ------
        ActionError
            API server unreachable or overloaded (transient), RBAC without ``list`` on ``pods``,
            an answer that is not a pod list.
        """
        if not (isinstance(job_id, str) and _LABEL_VALUE_RE.fullmatch(job_id)):
            log.debug("kubernetes: %s is not a label value: no pod carries it",
                      _one_line(repr(job_id), 80))  # fmt: skip
            return None
        selector = f"{self.job_label}={job_id}"
        where = f"in namespace {self.job_namespace}" if self.job_namespace else "in any namespace"
        subject = f"of job {job_id} ({selector}, {where})"
        namespace = self.job_namespace

        def request() -> object:
            if namespace is not None:
                return self._core.list_namespaced_pod(
                    namespace,
                    label_selector=selector,
                    field_selector="status.phase!=Pending",
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            return self._core.list_pod_for_all_namespaces(
                label_selector=selector,
                field_selector="status.phase!=Pending",
                _preload_content=False,
                _request_timeout=self._timeout,
            )

        answer = self._call(subject, "list", "pods", request)
        items = answer.get("items")
        if not isinstance(items, list):
            raise ActionError(
                f"kubernetes: cannot list pods {subject}: the answer is not a pod list",
                transient=True,
            )
        nodes: set[str] = set()
        for pod in items:
            if not isinstance(pod, dict):
                continue
            labels = (pod.get("metadata") or {}).get("labels") or {}
            phase = (pod.get("status") or {}).get("phase")
            node = (pod.get("spec") or {}).get("nodeName")
            # The selectors were the server's to apply; they are checked again here.
            # Succeeded and Failed pods too: a fault often kills its job before Minder acts,
            # and the node did run it (a pod is kept until its Job is deleted).
            if labels.get(self.job_label) == job_id and phase in _PLACED_PHASES and node:
                nodes.add(str(node))
        return frozenset(nodes) if nodes else None

    # -- the actions -----------------------------------------------------------------------

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        """Cordon ``node``, taint it and set its ``MinderFault`` condition for ``alert_id``."""
        _check_node_name(node)
        done: list[str] = []
        note = self._retrying(node, lambda: self._apply_once(node, alert_id, reason, done))
        detail = "; ".join(done) if done else note
        if done:
            log.info("kubernetes: node %s taken out for %s: %s", node, mark_for(alert_id), detail)
        return ActionOutcome(self.name, node, "cordon", bool(done), detail)

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        """Return ``node`` if Minder's mark for ``alert_id`` is on it (see the module doc)."""
        _check_node_name(node)
        done: list[str] = []
        note = self._retrying(node, lambda: self._undo_once(node, alert_id, done))
        detail = "; ".join(done) if done else note
        if done:
            log.info("kubernetes: node %s returned for %s: %s", node, mark_for(alert_id), detail)
        return ActionOutcome(self.name, node, "uncordon", bool(done), detail)

    def _apply_once(self, node: str, alert_id: str, reason: str, done: list[str]) -> str:
        current = self._read(node)
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        owner = annotations.get(ANNOTATION_ALERT)
        if owner is not None and owner != alert_id:
            return (
                f"node {node} is already out for {mark_for(_one_line(owner, 64))}; left as it is "
                f"(the mark stays with that alert)"
            )
        spec = current.get("spec") or {}
        taints = list(spec.get("taints") or [])
        new_annotations: dict[str, str] = {}
        new_spec: dict[str, Any] = {}
        steps: list[str] = []
        if not spec.get("unschedulable"):
            new_spec["unschedulable"] = True
            new_annotations[ANNOTATION_CORDONED] = "true"
            steps.append("cordoned")
        if not any(_is_ours(taint) for taint in taints):
            value = taint_value(alert_id)
            new_spec["taints"] = [
                *taints,
                {"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT},
            ]
            steps.append(f"tainted {TAINT_KEY}={value}:{TAINT_EFFECT}")
        if owner != alert_id:
            new_annotations[ANNOTATION_ALERT] = alert_id
            steps.append(f"annotated {ANNOTATION_ALERT}={_one_line(alert_id, 64)}")
        if new_spec or new_annotations:
            metadata: dict[str, Any] = {"resourceVersion": _resource_version(current)}
            if new_annotations:
                metadata["annotations"] = new_annotations
            self._patch(node, {"metadata": metadata, "spec": new_spec})
            done.extend(steps)

        message = condition_message(alert_id, reason)
        condition = _condition(current)
        if (
            condition is None
            or condition.get("status") != "True"
            or condition.get("reason") != CONDITION_REASON
            or condition.get("message") != message
        ):
            now = _rfc3339(self._clock())
            entry = {
                "type": CONDITION_TYPE,
                "status": "True",
                "reason": CONDITION_REASON,
                "message": message,
                "lastHeartbeatTime": now,
            }
            if condition is None or condition.get("status") != "True":
                entry["lastTransitionTime"] = now
            self._patch_status(node, entry)
            done.append(f"condition {CONDITION_TYPE}=True")
        unschedulable_note = (
            "" if annotations.get(ANNOTATION_CORDONED) == "true" else " (cordoned before Minder)"
        )
        return (
            f"node {node} already unschedulable{unschedulable_note}, tainted {TAINT_KEY} and "
            f"marked for {mark_for(alert_id)}; nothing to do"
        )

    def _undo_once(self, node: str, alert_id: str, done: list[str]) -> str:
        current = self._read(node)
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        owner = annotations.get(ANNOTATION_ALERT)
        if owner != alert_id:
            found = f"{mark_for(_one_line(owner, 64))}" if owner is not None else "no Minder mark"
            return f"{mark_for(alert_id)} is not on node {node} (found {found}); nothing touched"

        # The condition first: once the annotations are gone, a retry would not come back here.
        condition = _condition(current)
        if condition is not None and (
            condition.get("status") != "False" or condition.get("reason") != CONDITION_REASON_ENDED
        ):
            now = _rfc3339(self._clock())
            entry = {
                "type": CONDITION_TYPE,
                "status": "False",
                "reason": CONDITION_REASON_ENDED,
                "message": _one_line(f"{mark_for(alert_id)} ended", CONDITION_MESSAGE_MAX),
                "lastHeartbeatTime": now,
            }
            if condition.get("status") != "False":
                entry["lastTransitionTime"] = now
            # The answer is the node at its new resourceVersion: the patch below is built on it.
            current = self._patch_status(node, entry)
            done.append(f"condition {CONDITION_TYPE}=False")

        spec = current.get("spec") or {}
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        taints = list(spec.get("taints") or [])
        new_spec: dict[str, Any] = {}
        steps: list[str] = []
        kept = [taint for taint in taints if not _is_ours(taint)]
        if len(kept) != len(taints):
            new_spec["taints"] = kept or None
            steps.append(f"removed taint {TAINT_KEY}:{TAINT_EFFECT}")
        if annotations.get(ANNOTATION_CORDONED) == "true":
            if spec.get("unschedulable"):
                new_spec["unschedulable"] = None
                steps.append("uncordoned")
        elif spec.get("unschedulable"):
            steps.append("left cordoned (it was cordoned before Minder)")
        remove = {
            key: None for key in (ANNOTATION_ALERT, ANNOTATION_CORDONED) if key in annotations
        }
        metadata: dict[str, Any] = {"resourceVersion": _resource_version(current)}
        if remove:
            metadata["annotations"] = remove
            steps.append("removed Minder's annotations")
        if new_spec or remove:
            self._patch(node, {"metadata": metadata, "spec": new_spec})
            done.extend(steps)
        return f"node {node} already returned for {mark_for(alert_id)}; nothing to do"

    # -- the API ---------------------------------------------------------------------------

    def _retrying(self, node: str, attempt: Callable[[], str]) -> str:
        retrying = Retrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_random_exponential(multiplier=self._backoff, max=1.0),
            retry=retry_if_exception_type(_ConflictError),
            before_sleep=lambda state: log.info(
                "kubernetes: node %s changed while Minder wrote it (attempt %d); reading it again",
                node,
                state.attempt_number,
            ),
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _ConflictError as exc:
            raise ActionError(
                f"kubernetes: node {node} kept changing; the write still conflicted after "
                f"{self._attempts} attempts ({exc})",
                transient=True,
            ) from exc

    def _read(self, node: str) -> dict[str, Any]:
        return self._call(
            node,
            "get",
            "nodes",
            lambda: self._core.read_node(
                node, _preload_content=False, _request_timeout=self._timeout
            ),
        )

    def _patch(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(
            node,
            "patch",
            "nodes",
            lambda: self._core.patch_node(
                node,
                body,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )

    def _patch_status(self, node: str, condition: dict[str, Any]) -> dict[str, Any]:
        body = {"status": {"conditions": [condition]}}
        return self._call(
            node,
            "patch",
            "nodes/status",
            lambda: self._core.patch_node_status(
                node,
                body,
                field_manager=FIELD_MANAGER,
                _content_type=STRATEGIC_MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
        )

    def _call(
        self, node: str, verb: str, resource: str, request: Callable[[], object]
    ) -> dict[str, Any]:
        """Run one request; its JSON answer, or :class:`_ConflictError`, or :class:`ActionError`.

        ``node`` is the node's name, or for a request about pods the words that follow
        ``{verb} {resource}`` in errors."""
        what = f"{verb} {resource} {node}"
        response: Any = None
        try:
            response = request()
            data = response.data
        except ApiException as exc:
            raise _api_error(node, verb, resource, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActionError(
                f"kubernetes: cannot {what}: API server unreachable or too slow "
                f"({_one_line(f'{type(exc).__name__}: {exc}')})",
                transient=True,
            ) from exc
        finally:
            release = getattr(response, "release_conn", None)
            if callable(release):
                release()  # back to the pool for the next request
        try:
            answer = json.loads(data)
        except ValueError as exc:
            raise ActionError(
                f"kubernetes: cannot {what}: the answer is not JSON", transient=True
            ) from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("metadata"), dict):
            kind = "pod list" if resource == "pods" else "Node"
            raise ActionError(
                f"kubernetes: cannot {what}: the answer is not a {kind}", transient=True
            )
        return answer


def _resource_version(node: dict[str, Any]) -> str:
    version = (node.get("metadata") or {}).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise ActionError(
            "kubernetes: the API server sent a node without a resourceVersion", transient=True
        )
    return version


def _check_node_name(node: str) -> None:
    if not (isinstance(node, str) and len(node) <= 253 and _NODE_NAME_RE.fullmatch(node)):
        raise ActionError(
            f"kubernetes: {_one_line(repr(node), 80)} is not a node name (an RFC 1123 subdomain)",
            transient=False,
        )


def _server_message(exc: ApiException) -> str:
    """The ``message`` of the API server's ``Status``, else the HTTP reason; one line."""
    text = ""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            status = json.loads(body)
        except ValueError:
            status = None
        if isinstance(status, dict) and isinstance(status.get("message"), str):
            text = status["message"]
    return _one_line(text or str(exc.reason or "no message"))


def _api_error(node: str, verb: str, resource: str, exc: ApiException) -> Exception:
    """The error for an API server answer other than 2xx (:class:`_ConflictError` for a 409)."""
    code = int(exc.status or 0)
    said = _server_message(exc)
    what = f"{verb} {resource} {node}"
    if code == 409:
        return _ConflictError(f"409 Conflict: {said}")
    if code == 404 and resource != "pods":
        return ActionError(f"kubernetes: node {node} not found (404 on {what})", transient=False)
    if code == 401:
        return ActionError(
            f"kubernetes: cannot {what}: 401 Unauthorized, the API server refused the "
            f"credentials (token or certificate of the kubeconfig/service account): {said}",
            transient=False,
        )
    if code == 403:
        return ActionError(
            f"kubernetes: cannot {what}: 403 Forbidden, RBAC must allow verb {verb!r} on "
            f'resource {resource!r} (API group ""): {said}',
            transient=False,
        )
    if code in _TRANSIENT_CODES or code >= 500:
        return ActionError(
            f"kubernetes: cannot {what}: {code} from the API server: {said}", transient=True
        )
    if code == 0:
        # The client failed before an answer (TLS): a certificate problem is configuration.
        transient = "certificate" not in said.lower()
        return ActionError(f"kubernetes: cannot {what}: {said}", transient=transient)
    return ActionError(
        f"kubernetes: cannot {what}: {code} the API server refused the request: {said}",
        transient=False,
    )
