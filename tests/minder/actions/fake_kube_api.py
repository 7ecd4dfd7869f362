"""A small stand-in for the Kubernetes API server's Node, Pod, Job and Secret endpoints, for
testing the actuator and the self-check launcher.

No API server can run in this environment, so this fake follows the documented API (the
Kubernetes API reference for ``Node`` v1, "API Concepts", the API conventions, and the apiserver's
patch handler) for the endpoints that :mod:`minder.actions.kubernetes` calls, served by the stdlib
``http.server`` on 127.0.0.1 (a free port) from a thread:

- ``GET /api/v1/nodes`` (a ``NodeList``; ``labelSelector`` with ``=``, ``==``, ``!=``, ``key``
  and ``!key``), ``GET /api/v1/nodes/{name}`` and ``GET /api/v1/nodes/{name}/status``;
- ``GET /api/v1/pods`` (every namespace) and ``GET /api/v1/namespaces/{namespace}/pods``: a
  ``PodList`` filtered by ``labelSelector`` (as above) and ``fieldSelector`` (``=``, ``==``, ``!=``,
  comma-separated, on the fields the apiserver allows for pods: ``metadata.name``,
  ``metadata.namespace``, ``spec.nodeName``, ``spec.restartPolicy``, ``spec.schedulerName``,
  ``spec.serviceAccountName``, ``spec.hostNetwork``, ``status.phase``, ``status.podIP``,
  ``status.nominatedNodeName``; an absent field reads ``""``, so ``spec.nodeName=`` selects
  unscheduled pods; any other field is a 400 ``field label not supported: <field>``), and
  ``GET /api/v1/namespaces/{namespace}/pods/{name}``; pods are added by tests
  (:meth:`FakeKubeApi.add_pod`) or by the fake's Job controller, never written through the API;
- ``batch/v1`` Jobs (API reference "Job" v1, "Garbage Collection"): ``POST``, ``GET`` and
  ``DELETE /apis/batch/v1/namespaces/{namespace}/jobs[/{name}]``, ``GET /apis/batch/v1/jobs``
  (``JobList``, ``labelSelector`` as above). A create is refused as the apiserver does: 409
  ``AlreadyExists`` ``jobs.batch "x" already exists``, 404 ``namespaces "x" not found`` (the
  namespaces are :attr:`FakeKubeApi.namespaces`), 422 ``Invalid`` for a name that is not a DNS-1123
  label, a ``restartPolicy`` other than ``Never``/``OnFailure``, no containers, a container
  without a name or an image, an ``env`` entry with both ``value`` and ``valueFrom`` or a
  ``secretKeyRef`` without ``name``/``key``, a negative ``backoffLimit``/``ttlSecondsAfterFinished``
  or ``activeDeadlineSeconds`` < 1, a toleration with an unknown effect or ``Exists`` with a
  value. The defaults of the REST strategy are set (``completions``, ``parallelism``, ``backoffLimit:
  6``, ``completionMode``, ``suspend``, the ``selector`` and the ``controller-uid``/``job-name``
  labels of the template). The Job controller is played at once: a new Job gets one ``Pending``
  pod (owner reference to the Job, the template's labels and spec, ``nodeName`` included) and
  ``status.active: 1``; tests move it on with :meth:`FakeKubeApi.run_job` (the kubelet starts the
  pod, or leaves it ``Pending`` with ``CreateContainerConfigError`` when a Secret its ``env``
  references is missing) and :meth:`FakeKubeApi.finish_job` (``Complete`` or ``Failed``
  conditions). A delete takes ``propagationPolicy`` from the query or a ``DeleteOptions`` body;
  a Job's default is ``Orphan`` (its pods stay, without the owner reference); ``Background`` and
  ``Foreground`` delete its pods, and the Secrets of which it was the only owner (the garbage
  collector, at once here); answers a ``Status`` ``Success``. A create whose
  ``metadata.ownerReferences`` entry lacks ``apiVersion``, ``kind``, ``name`` or ``uid`` is a 422;
- core/v1 Secrets: ``POST /api/v1/namespaces/{namespace}/secrets`` (``data`` must be base64,
  ``stringData`` is merged into ``data``, ``type`` defaults to ``Opaque``, 409 ``AlreadyExists``),
  ``GET`` and ``DELETE`` of one (404 ``secrets "x" not found``);
- ``PATCH /api/v1/nodes/{name}`` and ``PATCH /api/v1/nodes/{name}/status`` with the three patch
  types of "API Concepts":

  * ``application/strategic-merge-patch+json``: maps merge and ``null`` deletes a key; a list
    merges only where the Node schema declares a patch strategy (``status.conditions`` and
    ``status.addresses`` merge on ``type``, ``metadata.ownerReferences`` on ``uid``;
    ``metadata.finalizers`` and ``spec.podCIDRs`` are sets); every other list is atomic and is
    replaced. **``spec.taints`` is atomic** ("*Atomic: will be replaced during a merge*" in the
    API reference): a strategic merge patch with ``taints`` replaces the whole list, it does
    not merge by ``key``. Directives: ``$patch: replace|delete|merge``,
    ``$deleteFromPrimitiveList/<field>``, and ``$setElementOrder/<field>`` (accepted, ignored);
    a list element of a merging list without its merge key is a 400, as in the apiserver;
  * ``application/merge-patch+json`` (RFC 7386): maps merge, ``null`` deletes, lists are
    replaced whole;
  * ``application/json-patch+json`` (RFC 6902: ``add``, ``remove``, ``replace``, ``move``,
    ``copy``, ``test``). A malformed patch (not a list, unknown ``op``, missing ``path``) is a
    400; a patch that fails to apply, a failing ``test`` included, is a **422** ``Invalid``
    "the server rejected our request due to an error in our request" (the apiserver's
    ``NewGenericServerResponse(422, ...)``), not a 409.

  Any other ``Content-Type`` is a 415 ``UnsupportedMediaType`` (server-side apply,
  ``application/apply-patch+yaml``, is not implemented here and is refused the same way).

Write semantics: ``metadata.resourceVersion`` comes from one counter (etcd's revision) and is
bumped on every write; a patch that leaves the object unchanged is not a write and keeps it. A
patched object that carries a ``resourceVersion`` other than the stored one (a stale one in a
merge patch body, or set by a JSON patch ``replace``) is a 409 ``Conflict`` "Operation cannot be
fulfilled on nodes "x": the object has been modified; ...". A patch of the main resource ignores
``status`` and changes only ``labels``, ``annotations``, ``finalizers`` and ``ownerReferences``
of ``metadata`` (and ``spec``); a patch of ``/status`` changes only ``status``. A name that differs
from the URL's is a 400, a changed ``uid`` a 422. The result is checked as the apiserver does for
the fields this fake knows: types of ``spec.unschedulable``, ``spec.taints``, labels,
annotations and ``status.conditions`` (422), and ``ValidateNodeUpdate``'s taint rules (effect
one of ``NoSchedule``, ``PreferNoSchedule``, ``NoExecute``; the key a qualified name; the value a
label value; unique by ``key`` and ``effect``), label and annotation keys and values (422
``Invalid`` with ``causes``). Empty ``omitempty`` fields are dropped from the stored object as
the Go types do (``unschedulable: false``, an empty ``taints`` list or ``annotations`` map).
``dryRun=All`` computes the answer without storing it.

Errors are ``Status`` objects ``{"kind": "Status", "apiVersion": "v1", "metadata": {}, "status":
"Failure", "message", "reason", "details"?, "code"}``: 404 ``NotFound`` ``nodes "x" not found``,
401 ``Unauthorized`` without ``Authorization: Bearer <known token>``, 403 ``Forbidden`` ``nodes
"x" is forbidden: User "..." cannot patch resource "nodes/status" in API group "" at the cluster
scope`` when the token's rules lack the verb, 405 for other methods.

Fault injection (:meth:`FakeKubeApi.inject`): the next N matching requests answer a given status
(409, 429 with ``Retry-After``, 500, 503, 504 ... as a ``Status``), hang past the client's timeout
(``"timeout"``), or close the connection without answering (``"drop"``). :attr:`hooks` run before
each request is handled, to play a concurrent writer. Requests are recorded in
:attr:`FakeKubeApi.requests`.

Not implemented (a request that needs them gets a 501 naming the gap, and is listed in
:attr:`FakeKubeApi.unsupported`): create/update/delete of nodes, any write of pods, update or patch
of Jobs and Secrets, a list of Secrets, ``generateName``, watch, ``limit``/``continue``,
``fieldSelector`` on nodes and Jobs, server-side apply, ``$retainKeys``, managedFields, admission,
and any resource but nodes, pods, Jobs and Secrets.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_YAML = "application/apply-patch+yaml"
ACCEPTED_PATCH_TYPES = (JSON_PATCH, MERGE, APPLY_YAML, STRATEGIC)
"""What the apiserver lists in its 415 (the fake implements the first, second and fourth)."""

# Patch strategies of the Node schema (k8s.io/api/core/v1 types.go, API reference "Node"):
# path -> ("merge", merge key) | ("set", None). Every other list is atomic.
NODE_LIST_STRATEGIES: dict[tuple[str, ...], tuple[str, str | None]] = {
    ("metadata", "finalizers"): ("set", None),
    ("metadata", "ownerReferences"): ("merge", "uid"),
    ("spec", "podCIDRs"): ("set", None),
    ("status", "conditions"): ("merge", "type"),
    ("status", "addresses"): ("merge", "type"),
}
MUTABLE_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
ANNOTATIONS_MAX_BYTES = 256 * 1024
POD_FIELDS: dict[str, tuple[str, ...]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.restartPolicy": ("spec", "restartPolicy"),
    "spec.schedulerName": ("spec", "schedulerName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "spec.hostNetwork": ("spec", "hostNetwork"),
    "status.phase": ("status", "phase"),
    "status.podIP": ("status", "podIP"),
    "status.nominatedNodeName": ("status", "nominatedNodeName"),
}
"""The field selectors the apiserver accepts for pods (pkg/registry/core/pod ``PodToSelectableFields``
and the v1 field label conversion), and where each field lives."""
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
_NAME_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

ALL_RULES = frozenset(
    {
        ("get", "nodes"),
        ("list", "nodes"),
        ("patch", "nodes"),
        ("get", "nodes/status"),
        ("patch", "nodes/status"),
        ("get", "pods"),
        ("list", "pods"),
        ("create", "jobs"),
        ("get", "jobs"),
        ("list", "jobs"),
        ("delete", "jobs"),
        ("create", "secrets"),
        ("get", "secrets"),
        ("delete", "secrets"),
    }
)
"""Every (verb, resource) the fake serves: the default token's RBAC (``jobs`` are batch/v1's)."""
DEFAULT_NAMESPACES = frozenset({"default", "kube-system", "minder"})
_DNS1123_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_ENV_NAME_RE = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
JOB_RESTART_POLICIES = ("Never", "OnFailure")
PROPAGATION_POLICIES = ("Orphan", "Background", "Foreground")


class ApiError(Exception):
    """An answer other than 2xx: the HTTP code and its ``Status`` body."""

    def __init__(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body
        self.headers = headers or {}


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``metav1.Status`` failure, as the apiserver writes it (``details`` omitted when nil)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def not_found(name: str) -> ApiError:
    return ApiError(
        404,
        status(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"}),
    )


def conflict(name: str) -> ApiError:
    message = (
        f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    return ApiError(409, status(409, "Conflict", message, {"name": name, "kind": "nodes"}))


def bad_request(message: str) -> ApiError:
    return ApiError(400, status(400, "BadRequest", message))


def invalid(name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 as ``errors.NewInvalid(Kind("Node"), name, errs)`` writes it."""
    summary = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    details = {"name": name, "kind": "Node", "causes": causes}
    return ApiError(422, status(422, "Invalid", f'Node "{name}" is invalid: {summary}', details))


def patch_failed() -> ApiError:
    """A JSON patch that does not apply (a failing ``test`` included): the apiserver's
    ``NewGenericServerResponse(http.StatusUnprocessableEntity, ...)``, which keeps only its own
    message."""
    message = "the server rejected our request due to an error in our request"
    return ApiError(422, status(422, "Invalid", message, {}))


class FakeNotImplementedError(Exception):
    """The request needs something this fake does not implement (answered 501)."""


# -- RFC 7386 merge patch ---------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 ``MergePatch(target, patch)``: maps merge, ``null`` removes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- strategic merge patch --------------------------------------------------------------------


def strategic_merge(
    original: dict[str, Any],
    patch: dict[str, Any],
    strategies: dict[tuple[str, ...], tuple[str, str | None]] = NODE_LIST_STRATEGIES,
    path: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Apply a strategic merge patch map to ``original`` (not modified) under ``strategies``."""
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive!r}")
    result = copy.deepcopy(original)
    for key, value in patch.items():
        if key == "$patch" or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field_name = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise bad_request(f"{key} must be a list")
            current = result.get(field_name)
            if isinstance(current, list):
                result[field_name] = [item for item in current if item not in value]
            continue
        if key == "$retainKeys":
            raise FakeNotImplementedError("the $retainKeys directive")
        if key.startswith("$"):
            raise bad_request(f"unknown strategic merge patch directive {key!r}")
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
                continue
            base = result.get(key)
            result[key] = strategic_merge(
                base if isinstance(base, dict) else {}, value, strategies, (*path, key)
            )
        elif isinstance(value, list):
            result[key] = _strategic_list(result.get(key), value, strategies, (*path, key))
        else:
            result[key] = value
    return result


def _strategic_list(
    original: Any,
    patch: list[Any],
    strategies: dict[tuple[str, ...], tuple[str, str | None]],
    path: tuple[str, ...],
) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            copy.deepcopy(item)
            for item in patch
            if not (isinstance(item, dict) and item.get("$patch") == "replace")
        ]
    strategy, merge_key = strategies.get(path, ("atomic", None))
    current = copy.deepcopy(original) if isinstance(original, list) else []
    if strategy == "atomic":
        return copy.deepcopy(patch)
    if strategy == "set":
        for item in patch:
            if item not in current:
                current.append(copy.deepcopy(item))
        return current
    assert merge_key is not None
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        index = next(
            (
                i
                for i, old in enumerate(current)
                if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del current[index]
            continue
        if index is None:
            current.append(_strip_directives(item))
        else:
            current[index] = strategic_merge(current[index], item, strategies, path)
    return current


def _strip_directives(value: dict[str, Any]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in value.items() if not k.startswith("$")}


# -- RFC 6902 JSON patch ----------------------------------------------------------------------


class JsonPatchError(Exception):
    """The patch does not apply to the document (422 in the apiserver)."""


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality (RFC 6902 §4.6): a boolean is not a number, 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise bad_request(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(token: str, size: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return size
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise JsonPatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > size or (index == size and not allow_end):
        raise JsonPatchError(f"array index {index} out of bounds")
    return index


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise JsonPatchError(f"missing path element {token!r}")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(token, len(node), allow_end=False)]
        else:
            raise JsonPatchError(f"cannot descend into a scalar at {token!r}")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise JsonPatchError(f"missing value at {last!r}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), allow_end=False)]
    raise JsonPatchError("cannot index a scalar")


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise JsonPatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise JsonPatchError(f"missing value at {last!r}")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(last, len(parent), allow_end=False))
    raise JsonPatchError("cannot remove from a scalar")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return copy.deepcopy(value)
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), allow_end=True), copy.deepcopy(value))
    else:
        raise JsonPatchError("cannot add to a scalar")
    return doc


def json_patch(document: Any, operations: Any) -> Any:
    """Apply an RFC 6902 patch; :class:`ApiError` 400 when malformed, 422 when it fails."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(document)
    try:
        for op in operations:
            if not isinstance(op, dict) or "op" not in op:
                raise bad_request(f"invalid JSON patch operation {op!r}")
            kind = op["op"]
            tokens = _pointer(op.get("path"))
            if kind in ("add", "replace", "test") and "value" not in op:
                raise bad_request(f"JSON patch {kind} operation is missing a value")
            if kind == "add":
                doc = _add(doc, tokens, op["value"])
            elif kind == "remove":
                _remove(doc, tokens)
            elif kind == "replace":
                if not tokens:
                    doc = copy.deepcopy(op["value"])
                else:
                    _remove(doc, tokens)  # must exist
                    doc = _add(doc, tokens, op["value"])
            elif kind in ("move", "copy"):
                source = _pointer(op.get("from"))
                if kind == "move" and tokens[: len(source)] == source and tokens != source:
                    raise JsonPatchError("cannot move a value into one of its children")
                value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
                doc = _add(doc, tokens, value)
            elif kind == "test":
                if not _json_equal(_get(doc, tokens), op["value"]):
                    raise JsonPatchError(f"testing value {op.get('path')} failed")
            else:
                raise bad_request(f"Unexpected kind: {kind}")
    except JsonPatchError as exc:
        raise patch_failed() from exc
    return doc


# -- validation -------------------------------------------------------------------------------


def _qualified_name_error(key: Any) -> str | None:
    if not isinstance(key, str) or not key:
        return "name part must be non-empty"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix)):
        return "prefix part must be a lowercase RFC 1123 subdomain"
    if len(name) > 63 or not _NAME_RE.fullmatch(name):
        return (
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start "
            "and end with an alphanumeric character (at most 63 characters)"
        )
    return None


def _label_value_error(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE_RE.fullmatch(value):
        return (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', "
            "'_' or '.', and must start and end with an alphanumeric character (at most 63)"
        )
    return None


def _type_errors(node: dict[str, Any]) -> list[dict[str, str]]:
    """What the apiserver's decoder would refuse in the fields this fake knows."""
    errors: list[dict[str, str]] = []

    def bad(path: str, expected: str) -> None:
        errors.append(
            {"reason": "FieldValueInvalid", "message": f"expected {expected}", "field": path}
        )

    meta = node.get("metadata", {})
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            bad(f"metadata.{key}", "map of string to string")
    if not isinstance(meta.get("resourceVersion", ""), str):
        bad("metadata.resourceVersion", "string")
    spec = node.get("spec", {})
    if not isinstance(spec, dict):
        bad("spec", "object")
        return errors
    if "unschedulable" in spec and not isinstance(spec["unschedulable"], bool):
        bad("spec.unschedulable", "boolean")
    taints = spec.get("taints")
    if taints is not None:
        if not isinstance(taints, list):
            bad("spec.taints", "list")
        else:
            for i, taint in enumerate(taints):
                if not isinstance(taint, dict) or not all(
                    isinstance(taint.get(k, ""), str) for k in ("key", "value", "effect")
                ):
                    bad(f"spec.taints[{i}]", "object with string key, value and effect")
    conditions = node.get("status", {}).get("conditions")
    if conditions is not None:
        if not isinstance(conditions, list):
            bad("status.conditions", "list")
        else:
            for i, condition in enumerate(conditions):
                if not isinstance(condition, dict) or not all(
                    isinstance(v, str) for v in condition.values()
                ):
                    bad(f"status.conditions[{i}]", "object of string fields")
    return errors


def _validate(node: dict[str, Any]) -> list[dict[str, str]]:
    """``ValidateNodeUpdate`` for taints, and ``ValidateObjectMeta`` for labels/annotations."""
    errors: list[dict[str, str]] = []
    meta = node.get("metadata", {})
    for key, value in meta.get("labels", {}).items():
        if problem := _qualified_name_error(key):
            errors.append(_cause("FieldValueInvalid", f"metadata.labels: {key!r}", problem))
        if problem := _label_value_error(value):
            errors.append(_cause("FieldValueInvalid", f"metadata.labels: {value!r}", problem))
    annotations = meta.get("annotations", {})
    for key in annotations:
        if problem := _qualified_name_error(key):
            errors.append(_cause("FieldValueInvalid", f"metadata.annotations: {key!r}", problem))
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > ANNOTATIONS_MAX_BYTES:
        errors.append(
            _cause(
                "FieldValueTooLong",
                "metadata.annotations",
                f"Too long: must have at most {ANNOTATIONS_MAX_BYTES} bytes",
            )
        )
    seen: set[tuple[str, str]] = set()
    for i, taint in enumerate(node.get("spec", {}).get("taints", [])):
        where = f"spec.taints[{i}]"
        if problem := _qualified_name_error(taint.get("key")):
            errors.append(_cause("FieldValueInvalid", f"{where}.key", problem))
        if problem := _label_value_error(taint.get("value", "")):
            errors.append(_cause("FieldValueInvalid", f"{where}.value", problem))
        effect = taint.get("effect")
        if not effect:
            errors.append(_cause("FieldValueRequired", f"{where}.effect", "Required value"))
        elif effect not in TAINT_EFFECTS:
            supported = ", ".join(f'"{e}"' for e in TAINT_EFFECTS)
            errors.append(
                _cause(
                    "FieldValueNotSupported",
                    f"{where}.effect",
                    f'Unsupported value: "{effect}": supported values: {supported}',
                )
            )
        pair = (str(taint.get("key")), str(effect))
        if pair in seen:
            errors.append(
                _cause(
                    "FieldValueDuplicate",
                    "spec.taints",
                    "taints must be unique by key and effect pair",
                )
            )
        seen.add(pair)
    return errors


def _cause(reason: str, field_path: str, message: str) -> dict[str, str]:
    return {"reason": reason, "message": message, "field": field_path}


def _prune_omitempty(node: dict[str, Any]) -> None:
    """Drop the zero values that Go's ``omitempty`` leaves out of the stored JSON."""
    meta = node.setdefault("metadata", {})
    for key in ("labels", "annotations", "finalizers", "ownerReferences"):
        if key in meta and not meta[key]:
            del meta[key]
    for part in ("spec", "status"):
        section = node.get(part)
        if isinstance(section, dict):
            for key in [k for k, v in section.items() if v in (None, False, "", [], {})]:
                del section[key]
    for taint in node.get("spec", {}).get("taints", []) or []:
        if isinstance(taint, dict):
            for key in ("value", "timeAdded"):
                if key in taint and taint[key] in (None, ""):
                    del taint[key]
    for condition in node.get("status", {}).get("conditions", []) or []:
        if isinstance(condition, dict):
            for key in ("reason", "message", "lastHeartbeatTime", "lastTransitionTime"):
                if key in condition and condition[key] in (None, ""):
                    del condition[key]


# -- the server -------------------------------------------------------------------------------


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    authorization: str | None
    body: Any
    status: int = 0


@dataclass
class Fault:
    """What the next ``times`` matching requests get instead of an answer."""

    kind: int | str  # an HTTP status, "timeout" or "drop"
    times: int
    method: str | None = None
    path: str | None = None  # a regex over the URL path
    hold_s: float = 5.0
    message: str | None = None  # the Status message, instead of the usual one for the code

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and (
            self.path is None or re.fullmatch(self.path, path) is not None
        )


_FAULT_STATUS: dict[int, tuple[str, str]] = {
    429: ("TooManyRequests", "Too many requests, please try again later."),
    500: ("InternalError", "Internal error occurred: injected fault"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "Timeout: request did not complete within the allowed duration"),
    400: ("BadRequest", "injected bad request"),
    403: ("Forbidden", "injected forbidden"),
    404: ("NotFound", "injected not found"),
    422: ("Invalid", "the server rejected our request due to an error in our request"),
}


@dataclass
class FakeKubeApi:
    """The fake's state; :meth:`start` serves it on 127.0.0.1 (a free port) from a thread.

    ``tokens`` maps a bearer token to its user and the ``(verb, resource)`` pairs its RBAC
    allows; by default ``token`` may do everything the fake serves.
    """

    token: str = "t"
    user: str = "system:serviceaccount:minder:minder"
    tokens: dict[str, tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    secrets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    namespaces: set[str] = field(default_factory=lambda: set(DEFAULT_NAMESPACES))
    requests: list[Recorded] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    hooks: list[Callable[[str, str], None]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    revision: int = 1000
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.tokens.setdefault(self.token, (self.user, ALL_RULES))

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeKubeApi:
        fake = self

        class Handler(_Handler):
            kube = fake

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._stopping.clear()
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers for tests -----------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        unschedulable: bool = False,
        taints: list[dict[str, Any]] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        conditions: list[dict[str, Any]] | None = None,
        internal_ip: str | None = None,
        allocatable: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Store a node as a kubelet would have registered it (``Ready`` by default), with an
        ``InternalIP`` address and ``status.allocatable`` (e.g. ``{"nvidia.com/gpu": "8"}``,
        as the device plugin advertises) when given, and ``status.capacity`` (the same as
        ``allocatable`` unless given: the device plugin counts an unhealthy GPU in the capacity
        only)."""
        now = _now()
        node: dict[str, Any] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                "creationTimestamp": now,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                "annotations": dict(annotations or {}),
            },
            "spec": {"unschedulable": unschedulable, "taints": list(taints or [])},
            "status": {
                "conditions": conditions
                if conditions is not None
                else [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "addresses": [
                    *([{"type": "InternalIP", "address": internal_ip}] if internal_ip else []),
                    {"type": "Hostname", "address": name},
                ],
                **({"allocatable": dict(allocatable)} if allocatable else {}),
                **(
                    {"capacity": dict(capacity if capacity is not None else allocatable or {})}
                    if capacity or allocatable
                    else {}
                ),
            },
        }
        _prune_omitempty(node)
        with self._lock:
            self.revision += 1
            node["metadata"]["resourceVersion"] = str(self.revision)
            self.nodes[name] = node
        return copy.deepcopy(node)

    def node(self, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.nodes[name])

    def add_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        node: str | None = None,
        phase: str = "Running",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """Store a pod as the scheduler and the kubelet would have left it: bound to ``node``
        (``spec.nodeName``; None: not scheduled) in ``phase``; ``owner`` ``(kind, name)`` is its
        controller (``("DaemonSet", "nvidia-device-plugin")``: an ``apps/v1`` owner reference),
        ``annotations`` e.g. ``kubernetes.io/config.mirror`` for a static pod's mirror."""
        if phase not in POD_PHASES:
            raise ValueError(f"pod phase {phase!r}: expected one of {POD_PHASES}")
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "image": "trainer:1"}],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
        }
        if node is not None:
            spec["nodeName"] = node
        pod: dict[str, Any] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{name}")),
                "creationTimestamp": _now(),
                "labels": dict(labels or {}),
            },
            "spec": spec,
            "status": {"phase": phase},
        }
        if annotations:
            pod["metadata"]["annotations"] = dict(annotations)
        if owner is not None:
            kind, owner_name = owner
            group = "batch/v1" if kind == "Job" else "apps/v1"
            pod["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": group,
                    "kind": kind,
                    "name": owner_name,
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}/{kind}/{owner_name}")),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        with self._lock:
            self.revision += 1
            pod["metadata"]["resourceVersion"] = str(self.revision)
            self.pods[(namespace, name)] = pod
        return copy.deepcopy(pod)

    def write(self, name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """A write by someone else (an operator, the kubelet): ``change`` edits the stored node
        in place, and the resourceVersion is bumped."""
        with self._lock:
            node = self.nodes[name]
            change(node)
            _prune_omitempty(node)
            self.revision += 1
            node["metadata"]["resourceVersion"] = str(self.revision)
            return copy.deepcopy(node)

    def inject(
        self,
        kind: int | str,
        times: int = 1,
        *,
        method: str | None = None,
        path: str | None = None,
        hold_s: float = 5.0,
        message: str | None = None,
    ) -> None:
        """The next ``times`` requests (of ``method``, whose path matches the regex ``path``) get
        ``kind``: an HTTP status with a ``Status`` body, ``"timeout"`` (no answer for ``hold_s``
        seconds, then the connection is closed) or ``"drop"`` (closed at once). ``message``
        replaces the Status message of an HTTP status fault."""
        if not (isinstance(kind, int) or kind in ("timeout", "drop")):
            raise ValueError(f"unknown fault {kind!r}")
        with self._lock:
            self.faults.append(Fault(kind, times, method, path, hold_s, message))

    def calls(self, method: str, pattern: str = r".*") -> list[Recorded]:
        """Recorded requests of ``method`` whose path matches the regex ``pattern``."""
        return [r for r in self.requests if r.method == method and re.fullmatch(pattern, r.path)]

    # -- the API ---------------------------------------------------------------------------

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    def handle(self, record: Recorded) -> tuple[int, Any, dict[str, str]]:
        """Answer one request: (HTTP status, JSON body, extra headers)."""
        try:
            return self._handle(record)
        except ApiError as exc:
            return exc.code, exc.body, exc.headers
        except FakeNotImplementedError as exc:
            gap = str(exc)
            self.unsupported.append(gap)
            message = f"fake_kube_api does not implement {gap}"
            return 501, status(501, "InternalError", message), {}

    def _handle(self, record: Recorded) -> tuple[int, Any, dict[str, str]]:
        user, rules = self._authenticate(record.authorization)
        jobs = re.fullmatch(
            r"/apis/batch/v1/(?:namespaces/([^/]+)/)?jobs(?:/([^/]+))?", record.path
        )
        if jobs is not None:
            return self._jobs(record, user, rules, jobs.group(1), jobs.group(2))
        secrets = re.fullmatch(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?", record.path)
        if secrets is not None:
            return self._secrets(record, user, rules, secrets.group(1), secrets.group(2))
        pods = re.fullmatch(r"/api/v1/(?:namespaces/([^/]+)/)?pods(?:/([^/]+))?", record.path)
        if pods is not None:
            return self._pods(record, user, rules, pods.group(1), pods.group(2))
        match = re.fullmatch(r"/api/v1/nodes(?:/([^/]+)(?:/(status))?)?", record.path)
        if match is None:
            raise FakeNotImplementedError(f"the path {record.path}")
        name, subresource = match.group(1), match.group(2)
        resource = "nodes/status" if subresource else "nodes"
        if record.method == "GET":
            verb = "get" if name else "list"
        elif record.method == "PATCH" and name:
            verb = "patch"
        elif record.method in ("POST", "PUT", "DELETE"):
            raise FakeNotImplementedError(f"{record.method} on {record.path}")
        else:
            raise ApiError(
                405,
                status(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ),
            )
        if (verb, resource) not in rules:
            what = f'nodes "{name}"' if name else "nodes"
            message = (
                f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
                'in API group "" at the cluster scope'
            )
            details: dict[str, Any] = {"kind": "nodes"}
            if name:
                details = {"name": name, "kind": "nodes"}
            raise ApiError(403, status(403, "Forbidden", message, details))
        for key in ("watch", "limit", "continue", "fieldSelector", "resourceVersionMatch"):
            if key in record.query:
                raise FakeNotImplementedError(f"the {key} query parameter")
        if verb == "list":
            return 200, self._list(record.query), {}
        assert name is not None
        with self._lock:
            if name not in self.nodes:
                raise not_found(name)
            if verb == "get":
                return 200, copy.deepcopy(self.nodes[name]), {}
            return 200, self._patch(name, subresource == "status", record), {}

    def _pods(
        self,
        record: Recorded,
        user: str,
        rules: frozenset[tuple[str, str]],
        namespace: str | None,
        name: str | None,
    ) -> tuple[int, Any, dict[str, str]]:
        if name is not None and namespace is None:
            raise FakeNotImplementedError(f"the path {record.path}")
        if record.method != "GET":
            raise FakeNotImplementedError(f"{record.method} on {record.path}")
        verb = "get" if name else "list"
        if (verb, "pods") not in rules:
            what = f'pods "{name}"' if name else "pods"
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            message = (
                f'{what} is forbidden: User "{user}" cannot {verb} resource "pods" in API group '
                f'"" {scope}'
            )
            details: dict[str, Any] = {"kind": "pods"}
            if name:
                details = {"name": name, "kind": "pods"}
            raise ApiError(403, status(403, "Forbidden", message, details))
        for key in ("watch", "limit", "continue", "resourceVersionMatch"):
            if key in record.query:
                raise FakeNotImplementedError(f"the {key} query parameter")
        with self._lock:
            if name is not None:
                assert namespace is not None
                pod = self.pods.get((namespace, name))
                if pod is None:
                    raise ApiError(
                        404,
                        status(
                            404,
                            "NotFound",
                            f'pods "{name}" not found',
                            {"name": name, "kind": "pods"},
                        ),
                    )
                return 200, copy.deepcopy(pod), {}
            labels = record.query.get("labelSelector", [""])[-1]
            fields = _field_requirements(record.query.get("fieldSelector", [""])[-1])
            items = [
                copy.deepcopy(pod)
                for (ns, _), pod in sorted(self.pods.items())
                if (namespace is None or ns == namespace)
                and all(_selects(pod, req) for req in labels.split(",") if req.strip())
                and all(_field_matches(pod, *req) for req in fields)
            ]
            revision = str(self.revision)
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        body = {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": revision},
            "items": items,
        }
        return 200, body, {}

    # -- batch/v1 Jobs and core/v1 Secrets ------------------------------------------------

    def _authorize(
        self,
        user: str,
        rules: frozenset[tuple[str, str]],
        verb: str,
        resource: str,
        group: str,
        namespace: str | None,
        name: str | None,
    ) -> None:
        if (verb, resource) in rules:
            return
        kind = f"{resource}.{group}" if group else resource
        what = f'{kind} "{name}"' if name else kind
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        message = (
            f'{what} is forbidden: User "{user}" cannot {verb} resource "{resource}" in API '
            f'group "{group}" {scope}'
        )
        details: dict[str, Any] = {"kind": resource}
        if group:
            details["group"] = group
        if name:
            details["name"] = name
        raise ApiError(403, status(403, "Forbidden", message, details))

    def _verb(self, record: Recorded, name: str | None) -> str:
        if record.method == "GET":
            return "get" if name else "list"
        if record.method == "POST" and name is None:
            return "create"
        if record.method == "DELETE" and name is not None:
            return "delete"
        if record.method in ("PUT", "PATCH", "DELETE"):
            raise FakeNotImplementedError(f"{record.method} on {record.path}")
        raise ApiError(
            405,
            status(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ),
        )

    def _new_object(
        self, record: Recorded, namespace: str, kind: str, resource: str, group: str
    ) -> tuple[str, dict[str, Any]]:
        """The body of a create: its name and a copy, with the checks every create gets."""
        if record.body is _INVALID_JSON or not isinstance(record.body, dict):
            raise bad_request(f"the body of the request is not a {kind} object")
        body = copy.deepcopy(record.body)
        if body.get("kind", kind) != kind:
            raise bad_request(f"the body is a {body.get('kind')}, expected {kind}")
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        if "generateName" in meta and "name" not in meta:
            raise FakeNotImplementedError("metadata.generateName")
        if meta.get("namespace", namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        name = meta.get("name")
        kind_name = f"{resource}.{group}" if group else resource
        if not isinstance(name, str) or not name:
            raise _invalid_object(
                kind,
                "",
                [_cause("FieldValueRequired", "metadata.name", "name or generateName is required")],
            )
        if namespace not in self.namespaces:
            raise ApiError(
                404,
                status(
                    404,
                    "NotFound",
                    f'namespaces "{namespace}" not found',
                    {"name": namespace, "kind": "namespaces"},
                ),
            )
        if (namespace, name) in (self.jobs if kind == "Job" else self.secrets):
            raise ApiError(
                409,
                status(
                    409,
                    "AlreadyExists",
                    f'{kind_name} "{name}" already exists',
                    {"name": name, **({"group": group} if group else {}), "kind": resource},
                ),
            )
        for key in ("labels", "annotations"):
            value = meta.get(key)
            if value is not None and (
                not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
            ):
                raise _invalid_object(
                    kind,
                    name,
                    [
                        _cause(
                            "FieldValueInvalid",
                            f"metadata.{key}",
                            "expected map of string to string",
                        )
                    ],
                )
        errors: list[dict[str, str]] = []
        for key, value in (meta.get("labels") or {}).items():
            if problem := _qualified_name_error(key):
                errors.append(_cause("FieldValueInvalid", f"metadata.labels: {key!r}", problem))
            if problem := _label_value_error(value):
                errors.append(_cause("FieldValueInvalid", f"metadata.labels: {value!r}", problem))
        owners = meta.get("ownerReferences")
        if owners is not None and not isinstance(owners, list):
            errors.append(
                _cause("FieldValueInvalid", "metadata.ownerReferences", "expected a list")
            )
        for index, owner in enumerate(owners or []):
            for field_name in ("apiVersion", "kind", "name", "uid"):
                value = owner.get(field_name) if isinstance(owner, dict) else None
                if not isinstance(value, str) or not value:
                    errors.append(
                        _cause(
                            "FieldValueRequired" if value in (None, "") else "FieldValueInvalid",
                            f"metadata.ownerReferences[{index}].{field_name}",
                            f"{field_name} must not be empty",
                        )
                    )
        if errors:
            raise _invalid_object(kind, name, errors)
        self.revision += 1
        meta.update(
            {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(self.revision),
                "creationTimestamp": _now(),
            }
        )
        meta.pop("deletionTimestamp", None)
        return name, body

    def _deleted(self, name: str, resource: str, group: str, uid: str) -> dict[str, Any]:
        """The ``Status`` a delete answers."""
        details: dict[str, Any] = {"name": name, "kind": resource, "uid": uid}
        if group:
            details["group"] = group
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _propagation(self, record: Recorded) -> str:
        """The delete's ``propagationPolicy`` (query or ``DeleteOptions`` body); a Job's default
        through the API is ``Orphan`` (the batch/v1 REST strategy keeps the legacy default)."""
        values = record.query.get("propagationPolicy", [])
        policy = values[-1] if values else None
        if isinstance(record.body, dict) and record.body.get("propagationPolicy"):
            policy = record.body["propagationPolicy"]
        policy = policy or "Orphan"
        if policy not in PROPAGATION_POLICIES:
            raise bad_request(
                f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                f'"{policy}": supported values: "Foreground", "Background", "Orphan", "nil"'
            )
        return policy

    def _jobs(
        self,
        record: Recorded,
        user: str,
        rules: frozenset[tuple[str, str]],
        namespace: str | None,
        name: str | None,
    ) -> tuple[int, Any, dict[str, str]]:
        verb = self._verb(record, name)
        if namespace is None and verb != "list":
            raise FakeNotImplementedError(f"{record.method} on {record.path}")
        self._authorize(user, rules, verb, "jobs", "batch", namespace, name)
        for key in ("watch", "limit", "continue", "fieldSelector", "resourceVersionMatch"):
            if key in record.query:
                raise FakeNotImplementedError(f"the {key} query parameter on jobs")
        with self._lock:
            if verb == "list":
                selector = record.query.get("labelSelector", [""])[-1]
                items = [
                    copy.deepcopy(job)
                    for (ns, _), job in sorted(self.jobs.items())
                    if (namespace is None or ns == namespace)
                    and all(_selects(job, req) for req in selector.split(",") if req.strip())
                ]
                for item in items:
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                body = {
                    "kind": "JobList",
                    "apiVersion": "batch/v1",
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": items,
                }
                return 200, body, {}
            assert namespace is not None
            if verb == "create":
                job_name, new_job = self._new_object(record, namespace, "Job", "jobs", "batch")
                _validate_job(job_name, new_job)
                _default_job(new_job)
                self.jobs[(namespace, job_name)] = new_job
                self._start_job_pod(namespace, new_job)
                return 201, copy.deepcopy(self.jobs[(namespace, job_name)]), {}
            assert name is not None
            job = self.jobs.get((namespace, name))
            if job is None:
                raise ApiError(
                    404,
                    status(
                        404,
                        "NotFound",
                        f'jobs.batch "{name}" not found',
                        {"name": name, "group": "batch", "kind": "jobs"},
                    ),
                )
            if verb == "get":
                return 200, copy.deepcopy(job), {}
            policy = self._propagation(record)
            uid = job["metadata"]["uid"]
            del self.jobs[(namespace, name)]
            self.revision += 1
            for pod_key, pod in list(self.pods.items()):
                owners = pod["metadata"].get("ownerReferences") or []
                if not any(owner.get("uid") == uid for owner in owners):
                    continue
                if policy == "Orphan":
                    pod["metadata"]["ownerReferences"] = [o for o in owners if o.get("uid") != uid]
                else:  # the garbage collector deletes the dependents (at once, here)
                    del self.pods[pod_key]
            for secret_key, secret in list(self.secrets.items()):
                owners = secret["metadata"].get("ownerReferences") or []
                if secret_key[0] != namespace or not any(o.get("uid") == uid for o in owners):
                    continue
                if policy == "Orphan":
                    secret["metadata"]["ownerReferences"] = [
                        o for o in owners if o.get("uid") != uid
                    ]
                elif len(owners) == 1:  # its only owner is gone: collected
                    del self.secrets[secret_key]
                else:
                    secret["metadata"]["ownerReferences"] = [
                        o for o in owners if o.get("uid") != uid
                    ]
            return 200, self._deleted(name, "jobs", "batch", uid), {}

    def _secrets(
        self,
        record: Recorded,
        user: str,
        rules: frozenset[tuple[str, str]],
        namespace: str,
        name: str | None,
    ) -> tuple[int, Any, dict[str, str]]:
        verb = self._verb(record, name)
        if verb == "list":
            raise FakeNotImplementedError("list of secrets")
        self._authorize(user, rules, verb, "secrets", "", namespace, name)
        with self._lock:
            if verb == "create":
                secret_name, new_secret = self._new_object(
                    record, namespace, "Secret", "secrets", ""
                )
                data = dict(new_secret.get("data") or {})
                errors = []
                for key, value in data.items():
                    try:
                        base64.b64decode(value, validate=True)
                    except (ValueError, TypeError):
                        errors.append(
                            _cause("FieldValueInvalid", f"data[{key}]", "illegal base64 data")
                        )
                for key, value in (new_secret.pop("stringData", None) or {}).items():
                    data[key] = base64.b64encode(str(value).encode()).decode()
                for key in data:
                    if not re.fullmatch(r"[-._a-zA-Z0-9]+", key):
                        errors.append(
                            _cause(
                                "FieldValueInvalid",
                                f"data[{key}]",
                                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                            )
                        )
                if errors:
                    raise _invalid_object("Secret", secret_name, errors)
                new_secret["data"] = data
                new_secret.setdefault("type", "Opaque")
                new_secret["kind"], new_secret["apiVersion"] = "Secret", "v1"
                self.secrets[(namespace, secret_name)] = new_secret
                return 201, copy.deepcopy(new_secret), {}
            assert name is not None
            secret = self.secrets.get((namespace, name))
            if secret is None:
                raise ApiError(
                    404,
                    status(
                        404,
                        "NotFound",
                        f'secrets "{name}" not found',
                        {"name": name, "kind": "secrets"},
                    ),
                )
            if verb == "get":
                return 200, copy.deepcopy(secret), {}
            self._propagation(record)
            del self.secrets[(namespace, name)]
            self.revision += 1
            return 200, self._deleted(name, "secrets", "", secret["metadata"]["uid"]), {}

    def _start_job_pod(self, namespace: str, job: dict[str, Any]) -> None:
        """What the Job controller does with a new Job: one pod from its template (parallelism
        1), labelled and owned by the Job, ``Pending`` until :meth:`run_job`."""
        meta = job["metadata"]
        template = job["spec"]["template"]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        suffix = uuid.uuid4().hex[:5]
        self.revision += 1
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": f"{meta['name']}-{suffix}",
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(self.revision),
                "creationTimestamp": _now(),
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]),
            "status": {"phase": "Pending"},
        }
        self.pods[(namespace, pod["metadata"]["name"])] = pod
        job["status"] = {"active": 1, "ready": 0, "startTime": _now()}

    # -- the Job controller and kubelet, played by tests ------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.jobs[(namespace, name)])

    def secret(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.secrets[(namespace, name)])

    def job_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The pods the Job controller made for Job ``name``."""
        with self._lock:
            uid = self.jobs[(namespace, name)]["metadata"]["uid"]
            return [
                copy.deepcopy(pod)
                for (ns, _), pod in sorted(self.pods.items())
                if ns == namespace
                and any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])
            ]

    def run_job(self, namespace: str, name: str) -> str:
        """The kubelet starts the Job's pod: ``Running`` and ready, or left ``Pending`` with
        ``CreateContainerConfigError`` when a Secret its environment references is missing (as
        the kubelet does). Returns the pod's phase."""
        with self._lock:
            job = self.jobs[(namespace, name)]
            uid = job["metadata"]["uid"]
            for pod in self.pods.values():
                if not any(
                    o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or []
                ):
                    continue
                missing = [
                    ref["name"]
                    for container in pod["spec"].get("containers") or []
                    for env in container.get("env") or []
                    for ref in [((env.get("valueFrom") or {}).get("secretKeyRef") or {})]
                    if ref and (namespace, ref.get("name")) not in self.secrets
                ]
                if missing:
                    pod["status"] = {
                        "phase": "Pending",
                        "containerStatuses": [
                            {
                                "name": "selfcheck",
                                "ready": False,
                                "state": {
                                    "waiting": {
                                        "reason": "CreateContainerConfigError",
                                        "message": f'secret "{missing[0]}" not found',
                                    }
                                },
                            }
                        ],
                    }
                    return "Pending"
                pod["status"] = {"phase": "Running", "podIP": "10.1.0.1"}
                job["status"] = {**job.get("status", {}), "active": 1, "ready": 1}
                self.revision += 1
                return "Running"
        raise KeyError(f"job {namespace}/{name} has no pod")

    def finish_job(
        self, namespace: str, name: str, *, succeeded: bool, reason: str | None = None
    ) -> None:
        """The pod ends and the Job controller sets the Job's final condition: ``Complete``, or
        ``Failed`` with ``reason`` (``BackoffLimitExceeded`` by default; ``DeadlineExceeded``
        for ``activeDeadlineSeconds``)."""
        with self._lock:
            job = self.jobs[(namespace, name)]
            uid = job["metadata"]["uid"]
            for pod in self.pods.values():
                if any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or []):
                    pod["status"] = {"phase": "Succeeded" if succeeded else "Failed"}
            now = _now()
            kind = "Complete" if succeeded else "Failed"
            condition = {
                "type": kind,
                "status": "True",
                "lastProbeTime": now,
                "lastTransitionTime": now,
            }
            if not succeeded:
                condition["reason"] = reason or "BackoffLimitExceeded"
                condition["message"] = "Job has reached the specified backoff limit"
            status_ = {
                "startTime": job.get("status", {}).get("startTime", now),
                "conditions": [condition],
            }
            status_["succeeded" if succeeded else "failed"] = 1
            if succeeded:
                status_["completionTime"] = now
            status_["ready"] = 0
            job["status"] = status_
            self.revision += 1
            job["metadata"]["resourceVersion"] = str(self.revision)

    def _authenticate(self, authorization: str | None) -> tuple[str, frozenset[tuple[str, str]]]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and token in self.tokens:
            return self.tokens[token]
        raise ApiError(401, status(401, "Unauthorized", "Unauthorized"))

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        selector = query.get("labelSelector", [""])[-1]
        requirements = [part.strip() for part in selector.split(",") if part.strip()]
        with self._lock:
            items = [
                copy.deepcopy(node)
                for node in self.nodes.values()
                if all(_selects(node, req) for req in requirements)
            ]
            revision = str(self.revision)
        for item in items:  # list items carry no kind/apiVersion on the wire
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": revision},
            "items": items,
        }

    def _patch(self, name: str, is_status: bool, record: Recorded) -> dict[str, Any]:
        content_type = (record.content_type or "").split(";", 1)[0].strip().lower()
        if content_type not in ACCEPTED_PATCH_TYPES:
            message = (
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(ACCEPTED_PATCH_TYPES)}"
            )
            raise ApiError(415, status(415, "UnsupportedMediaType", message))
        if content_type == APPLY_YAML:
            raise FakeNotImplementedError("server-side apply (application/apply-patch+yaml)")
        dry_run = record.query.get("dryRun", [])
        if any(value != "All" for value in dry_run):
            raise bad_request(f"Invalid dryRun: {dry_run}")
        if record.body is _INVALID_JSON:
            raise bad_request("error decoding patch: invalid JSON")
        current = self.nodes[name]
        if content_type == JSON_PATCH:
            patched = json_patch(current, record.body)
        else:
            if not isinstance(record.body, dict):
                raise bad_request(
                    "error decoding patch: json: cannot unmarshal array into Go value of type "
                    "map[string]interface {}"
                )
            if content_type == MERGE:
                patched = merge_patch(current, record.body)
            else:
                patched = strategic_merge(current, record.body)
        if not isinstance(patched, dict):
            raise patch_failed()
        return self._commit(name, current, patched, is_status=is_status, dry_run=bool(dry_run))

    def _commit(
        self,
        name: str,
        current: dict[str, Any],
        patched: dict[str, Any],
        *,
        is_status: bool,
        dry_run: bool,
    ) -> dict[str, Any]:
        if errors := _type_errors(patched):
            raise invalid(name, errors)
        meta = patched.get("metadata") if isinstance(patched.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        if meta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        wanted_rv = meta.get("resourceVersion") or ""
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(name)
        if meta.get("uid", current["metadata"]["uid"]) != current["metadata"]["uid"]:
            raise invalid(name, [_cause("FieldValueInvalid", "metadata.uid", "field is immutable")])
        result = copy.deepcopy(current)
        if is_status:
            result["status"] = copy.deepcopy(patched.get("status") or {})
        else:
            for key in MUTABLE_METADATA:
                if key in meta:
                    result["metadata"][key] = copy.deepcopy(meta[key])
                else:
                    result["metadata"].pop(key, None)
            result["spec"] = copy.deepcopy(patched.get("spec") or {})
        _prune_omitempty(result)
        if errors := _validate(result):
            raise invalid(name, errors)
        if result == current or dry_run:
            return result
        self.revision += 1
        result["metadata"]["resourceVersion"] = str(self.revision)
        self.nodes[name] = result
        return copy.deepcopy(result)


def _invalid_object(kind: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 as ``errors.NewInvalid(Kind(kind), name, errs)`` writes it."""
    summary = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    details = {"name": name, "kind": kind, "causes": causes}
    return ApiError(422, status(422, "Invalid", f'{kind} "{name}" is invalid: {summary}', details))


def _validate_job(name: str, job: dict[str, Any]) -> None:
    """What ``ValidateJob`` refuses among the fields this fake knows (422)."""
    errors: list[dict[str, str]] = []
    if len(name) > 63 or not _DNS1123_LABEL_RE.fullmatch(name):
        errors.append(
            _cause(
                "FieldValueInvalid",
                "metadata.name",
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric character (at most 63)",
            )
        )
    spec = job.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(pod_spec, dict):
        errors.append(_cause("FieldValueRequired", "spec.template.spec", "Required value"))
        raise _invalid_object("Job", name, errors)
    assert isinstance(spec, dict)
    for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        value = spec.get(key)
        if value is not None and (
            not isinstance(value, int) or value < (1 if key == "activeDeadlineSeconds" else 0)
        ):
            errors.append(
                _cause("FieldValueInvalid", f"spec.{key}", "must be greater than or equal to 0")
            )
    policy = pod_spec.get("restartPolicy")
    if policy not in JOB_RESTART_POLICIES:
        errors.append(
            _cause(
                "FieldValueNotSupported",
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"',
            )
        )
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(
            _cause("FieldValueRequired", "spec.template.spec.containers", "Required value")
        )
        containers = []
    for i, container in enumerate(containers):
        where = f"spec.template.spec.containers[{i}]"
        if not isinstance(container, dict) or not container.get("name"):
            errors.append(_cause("FieldValueRequired", f"{where}.name", "Required value"))
            continue
        if not container.get("image"):
            errors.append(_cause("FieldValueRequired", f"{where}.image", "Required value"))
        for j, env in enumerate(container.get("env") or []):
            at = f"{where}.env[{j}]"
            if not isinstance(env, dict) or not _ENV_NAME_RE.fullmatch(str(env.get("name", ""))):
                errors.append(
                    _cause("FieldValueInvalid", f"{at}.name", "a valid environment variable name")
                )
                continue
            source = env.get("valueFrom")
            if env.get("value") and source:
                errors.append(
                    _cause(
                        "FieldValueInvalid",
                        f"{at}.valueFrom",
                        "may not be specified when `value` is not empty",
                    )
                )
            if source is not None:
                ref = source.get("secretKeyRef") if isinstance(source, dict) else None
                if not isinstance(ref, dict) or not ref.get("name") or not ref.get("key"):
                    errors.append(
                        _cause(
                            "FieldValueRequired", f"{at}.valueFrom.secretKeyRef", "Required value"
                        )
                    )
    for i, toleration in enumerate(pod_spec.get("tolerations") or []):
        effect = toleration.get("effect") if isinstance(toleration, dict) else None
        if effect and effect not in TAINT_EFFECTS:
            errors.append(
                _cause(
                    "FieldValueNotSupported",
                    f"spec.template.spec.tolerations[{i}].effect",
                    f'Unsupported value: "{effect}"',
                )
            )
        if (
            isinstance(toleration, dict)
            and toleration.get("operator") == "Exists"
            and toleration.get("value")
        ):
            errors.append(
                _cause(
                    "FieldValueInvalid",
                    f"spec.template.spec.tolerations[{i}].operator",
                    "value must be empty when `operator` is 'Exists'",
                )
            )
    if errors:
        raise _invalid_object("Job", name, errors)


def _default_job(job: dict[str, Any]) -> None:
    """The defaults and labels the apiserver and the Job's REST strategy add on create."""
    job["kind"], job["apiVersion"] = "Job", "batch/v1"
    meta = job["metadata"]
    spec = job["spec"]
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    uid, name = meta["uid"], meta["name"]
    controller_labels = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    template = spec["template"]
    template_meta = template.setdefault("metadata", {})
    template_meta["labels"] = {**(template_meta.get("labels") or {}), **controller_labels}
    meta["generation"] = 1
    job["status"] = {}


def _selects(node: dict[str, Any], requirement: str) -> bool:
    labels = node.get("metadata", {}).get("labels", {})
    if "!=" in requirement:
        key, value = (s.strip() for s in requirement.split("!=", 1))
        return labels.get(key) != value
    if "=" in requirement:
        key, value = (s.strip() for s in requirement.replace("==", "=").split("=", 1))
        return labels.get(key) == value
    if requirement.startswith("!"):
        return requirement[1:].strip() not in labels
    if re.search(r"\s(in|notin)\s", requirement):
        raise FakeNotImplementedError("set-based label selectors")
    return requirement in labels


def _field_requirements(selector: str) -> list[tuple[str, str, bool]]:
    """``(field, value, equal)`` of a pod field selector; a field the apiserver does not allow
    for pods is its 400."""
    requirements = []
    for part in (p.strip() for p in selector.split(",")):
        if not part:
            continue
        equal = "!=" not in part
        key, _, value = part.replace("!=", "=").replace("==", "=").partition("=")
        if key.strip() not in POD_FIELDS:
            raise bad_request(f"field label not supported: {key.strip()}")
        requirements.append((key.strip(), value.strip(), equal))
    return requirements


def _field_matches(pod: dict[str, Any], key: str, value: str, equal: bool) -> bool:
    current: Any = pod
    for step in POD_FIELDS[key]:
        current = current.get(step) if isinstance(current, dict) else None
    text = (
        ""
        if current is None
        else str(current).lower()
        if isinstance(current, bool)
        else str(current)
    )
    return (text == value) is equal


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_INVALID_JSON = object()


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKubeApi
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = _INVALID_JSON
        record = Recorded(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            content_type=self.headers.get("Content-Type"),
            authorization=self.headers.get("Authorization"),
            body=body,
        )
        kube = self.kube
        with kube._lock:
            kube.requests.append(record)
        for hook in list(kube.hooks):
            hook(record.method, record.path)
        fault = kube._take_fault(record.method, record.path)
        if fault is not None and not isinstance(fault.kind, int):
            record.status = -1
            if fault.kind == "timeout":
                kube._stopping.wait(fault.hold_s)
            self.close_connection = True
            return
        if fault is not None:
            assert isinstance(fault.kind, int)
            code, answer, headers = _fault_answer(fault.kind, record.path, fault.message)
        else:
            code, answer, headers = kube.handle(record)
        record.status = code
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()


def _fault_answer(
    code: int, path: str, custom: str | None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    name_match = re.fullmatch(r"/api/v1/nodes/([^/]+).*", path)
    name = name_match.group(1) if name_match else ""
    if code == 409:
        error = conflict(name)
        return error.code, error.body, {}
    reason, message = _FAULT_STATUS.get(code, ("InternalError", f"injected {code}"))
    message = custom if custom is not None else message
    details: dict[str, Any] | None = None
    headers: dict[str, str] = {}
    if code == 429:
        details = {"retryAfterSeconds": 1}
        headers["Retry-After"] = "1"
    return code, status(code, reason, message, details), headers
