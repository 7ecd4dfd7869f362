"""The Kubernetes actuator against a fake API server (tests/minder/actions/fake_kube_api.py).

No API server can run here; the fake follows the documented API, and the second half of this
module checks that the fake itself keeps those semantics (strategic merge, merge patch, JSON
patch, resourceVersion preconditions, status codes), so that it cannot be more lenient than a
real cluster without a test failing.

The ClusterRole the actuator needs (``minder.actions.kubernetes.RBAC_RULES``), for
``deploy/kubernetes/rbac.yaml``::

    rules:
      - apiGroups: [""]
        resources: ["nodes"]
        verbs: ["get", "patch"]
      - apiGroups: [""]
        resources: ["nodes/status"]
        verbs: ["patch"]
      - apiGroups: [""]
        resources: ["pods"]
        verbs: ["list"]

:func:`test_rbac_rules_are_enough_and_each_is_needed` checks that list against the fake's RBAC.
"""

from __future__ import annotations

import http.client
import json
import socket
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
pytest.importorskip("tenacity", reason="tenacity is not installed")

from fake_kube_api import ALL_RULES, FakeKubeApi
from kubernetes import client

from minder.actions.base import ActionError, SchedulerView, mark_for
from minder.actions.executor import BREAKER, ActionExecutor
from minder.actions.kubernetes import (
    ANNOTATION_ALERT,
    ANNOTATION_CORDONED,
    CONDITION_MESSAGE_MAX,
    RBAC_RULES,
    TAINT_KEY,
    KubernetesActuator,
)
from minder.actions.policy import ActionPolicy
from minder.core.alert import Alert, AlertKind
from minder.delivery.worker import Backoff, DeliveryWorker
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database
from minder.storage.actions import get_breaker, list_audit
from minder.storage.alerts import list_alerts
from minder.storage.jobs import upsert_job_machines
from minder.storage.outbox import AlertEvent, Destination, record_alert_with_events
from minder.storage.records import MachineInfo

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)
OPERATOR_TAINT = {"key": "ops.example.com/maintenance", "value": "rack-7", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
NOTIFY = Destination("webhook:ops", frozenset(e.value for e in AlertEvent))


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as server:
        yield server
    assert server.unsupported == [], "the actuator used something the fake does not implement"


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_actuator(
    fake: FakeKubeApi, clock: Clock | None = None, *, token: str | None = "t", **kwargs: Any
) -> KubernetesActuator:
    api_key = {"authorization": f"Bearer {token}"} if token else None
    configuration = client.Configuration(host=fake.url, api_key=api_key)
    kwargs.setdefault("conflict_backoff_s", 0.0)
    kwargs.setdefault("request_timeout_s", 5.0)
    return KubernetesActuator(client.ApiClient(configuration), clock=clock or Clock(), **kwargs)


@pytest.fixture
def actuator(fake: FakeKubeApi, clock: Clock) -> Iterator[KubernetesActuator]:
    act = make_actuator(fake, clock)
    yield act
    act.close()


def minder_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t["key"] == TAINT_KEY]


def condition(node: dict[str, Any], kind: str = "MinderFault") -> dict[str, Any] | None:
    return next((c for c in node["status"].get("conditions", []) if c["type"] == kind), None)


# -- apply and undo ---------------------------------------------------------------------------


def test_apply_cordons_taints_sets_the_condition_and_records_what_it_did(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    added = fake.add_node("gpu-1", taints=[GPU_TAINT])
    outcome = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79 on GPU 3")

    assert (outcome.target, outcome.node, outcome.operation, outcome.changed) == (
        "kubernetes",
        "gpu-1",
        "cordon",
        True,
    )
    assert "cordoned" in outcome.detail and "\n" not in outcome.detail
    node = fake.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        GPU_TAINT,
        {"key": "minder.io/fault", "value": "al-42", "effect": "NoSchedule"},
    ]
    assert node["metadata"]["annotations"] == {
        ANNOTATION_ALERT: "al-42",
        ANNOTATION_CORDONED: "true",
    }
    assert condition(node) == {
        "type": "MinderFault",
        "status": "True",
        "reason": "MinderAlert",
        "message": f"{mark_for('al-42')} xid 79 on GPU 3",
        "lastHeartbeatTime": "2026-01-02T03:04:05Z",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
    }
    assert condition(node, "Ready") is not None  # the kubelet's conditions are untouched

    # The spec/metadata write is a merge patch with the resourceVersion that was read, and the
    # condition goes through the status subresource as a strategic merge patch.
    main, status = (
        fake.calls("PATCH", r"/api/v1/nodes/gpu-1"),
        fake.calls("PATCH", r"/api/v1/nodes/gpu-1/status"),
    )
    assert len(main) == 1 and len(status) == 1
    assert main[0].content_type == "application/merge-patch+json"
    assert main[0].body["metadata"]["resourceVersion"] == added["metadata"]["resourceVersion"]
    assert status[0].content_type == "application/strategic-merge-patch+json"
    assert list(status[0].body) == ["status"]


def test_apply_again_changes_nothing(
    fake: FakeKubeApi, actuator: KubernetesActuator, clock: Clock
) -> None:
    fake.add_node("gpu-1")
    assert actuator.apply("gpu-1", alert_id="al-42", reason="xid 79").changed
    version = fake.node("gpu-1")["metadata"]["resourceVersion"]
    patches = len(fake.calls("PATCH"))
    clock.now = LATER

    again = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")

    assert not again.changed
    assert "nothing to do" in again.detail
    assert len(fake.calls("PATCH")) == patches
    assert fake.node("gpu-1")["metadata"]["resourceVersion"] == version


def test_undo_reverts_what_minder_did_and_keeps_the_condition_as_false(
    fake: FakeKubeApi, actuator: KubernetesActuator, clock: Clock
) -> None:
    fake.add_node("gpu-1", taints=[GPU_TAINT], annotations={"team": "ml"})
    before = fake.node("gpu-1")
    actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    clock.now = LATER

    outcome = actuator.undo("gpu-1", alert_id="al-42")

    assert (outcome.operation, outcome.changed) == ("uncordon", True)
    node = fake.node("gpu-1")
    assert "unschedulable" not in node["spec"]
    assert node["spec"]["taints"] == [GPU_TAINT]
    assert node["metadata"]["annotations"] == {"team": "ml"}
    assert condition(node) == {
        "type": "MinderFault",
        "status": "False",
        "reason": "MinderAlertEnded",
        "message": f"{mark_for('al-42')} ended",
        "lastHeartbeatTime": "2026-01-02T04:00:00Z",
        "lastTransitionTime": "2026-01-02T04:00:00Z",
    }
    assert condition(node, "Ready") == condition(before, "Ready")

    again = actuator.undo("gpu-1", alert_id="al-42")
    assert not again.changed
    assert "nothing touched" in again.detail


def test_undo_leaves_an_operator_cordon_and_taints_alone(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1", unschedulable=True, taints=[OPERATOR_TAINT, GPU_TAINT])

    applied = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    node = fake.node("gpu-1")
    assert applied.changed and "cordoned;" not in applied.detail
    assert ANNOTATION_CORDONED not in node["metadata"]["annotations"]
    assert node["spec"]["taints"][:2] == [OPERATOR_TAINT, GPU_TAINT]
    assert len(minder_taints(node)) == 1

    undone = actuator.undo("gpu-1", alert_id="al-42")
    node = fake.node("gpu-1")
    assert undone.changed
    assert "left cordoned" in undone.detail
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [OPERATOR_TAINT, GPU_TAINT]
    assert "annotations" not in node["metadata"]


def test_undo_for_another_alert_or_an_unmarked_node_touches_nothing(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    fake.add_node("gpu-2", unschedulable=True, taints=[{**OPERATOR_TAINT, "key": TAINT_KEY}])
    actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    marked, unmarked = fake.node("gpu-1"), fake.node("gpu-2")
    patches = len(fake.calls("PATCH"))

    other = actuator.undo("gpu-1", alert_id="al-43")
    none = actuator.undo("gpu-2", alert_id="al-42")

    assert not other.changed and not none.changed
    assert "minder:al-43 is not on node gpu-1 (found minder:al-42)" in other.detail
    assert "found no Minder mark" in none.detail
    assert len(fake.calls("PATCH")) == patches
    assert (fake.node("gpu-1"), fake.node("gpu-2")) == (marked, unmarked)


def test_a_second_alert_leaves_the_node_with_the_first(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    actuator.apply("gpu-1", alert_id="al-1", reason="xid 79")
    second = actuator.apply("gpu-1", alert_id="al-2", reason="ecc")
    assert not second.changed
    assert "already out for minder:al-1" in second.detail
    assert fake.node("gpu-1")["metadata"]["annotations"][ANNOTATION_ALERT] == "al-1"
    assert not actuator.undo("gpu-1", alert_id="al-2").changed
    assert actuator.undo("gpu-1", alert_id="al-1").changed


def test_the_condition_message_changes_with_the_reason(
    fake: FakeKubeApi, actuator: KubernetesActuator, clock: Clock
) -> None:
    fake.add_node("gpu-1")
    actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    clock.now = LATER
    outcome = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79 and 48")
    cond = condition(fake.node("gpu-1"))
    assert outcome.changed and outcome.detail == "condition MinderFault=True"
    assert cond is not None and cond["message"] == "minder:al-42 xid 79 and 48"
    assert cond["lastTransitionTime"] == "2026-01-02T03:04:05Z"  # still True: no transition
    assert cond["lastHeartbeatTime"] == "2026-01-02T04:00:00Z"


def test_untrusted_alert_ids_and_reasons_fit_the_api_limits(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    alert_id = "-job/7:rank 3\n" + "x" * 60
    reason = "line one\nline two\t" + "y" * 5000
    assert actuator.apply("gpu-1", alert_id=alert_id, reason=reason).changed  # the fake validates
    node = fake.node("gpu-1")
    (taint,) = minder_taints(node)
    assert taint["value"].startswith("job-7-rank-3-xxx") and len(taint["value"]) <= 63
    assert node["metadata"]["annotations"][ANNOTATION_ALERT] == alert_id
    cond = condition(node)
    assert cond is not None
    assert cond["message"].startswith("minder:-job/7:rank 3 xxx")
    assert "\n" not in cond["message"] and len(cond["message"]) <= CONDITION_MESSAGE_MAX
    assert actuator.undo("gpu-1", alert_id=alert_id).changed
    assert minder_taints(fake.node("gpu-1")) == []


def test_a_bad_node_name_is_refused_before_any_request(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    for name in ("", "../secrets", "GPU_1", "a" * 254):
        with pytest.raises(ActionError) as caught:
            actuator.apply(name, alert_id="al-42", reason="x")
        assert not caught.value.transient
    assert fake.requests == []


# -- concurrency ------------------------------------------------------------------------------


def test_a_concurrent_write_gives_a_real_conflict_and_the_apply_retries(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    """An operator taints the node between Minder's read and its write: the resourceVersion
    precondition makes the API server answer 409, Minder reads again, and both taints stay."""
    fake.add_node("gpu-1")
    raced: list[dict[str, Any]] = []

    def operator_writes(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1" and not raced:
            raced.append(
                fake.write(
                    "gpu-1", lambda n: n["spec"].setdefault("taints", []).append(OPERATOR_TAINT)
                )
            )

    fake.hooks.append(operator_writes)
    outcome = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")

    assert outcome.changed
    assert [r.status for r in fake.calls("PATCH", r"/api/v1/nodes/gpu-1")] == [409, 200]
    node = fake.node("gpu-1")
    assert node["spec"]["taints"][0] == OPERATOR_TAINT
    assert len(minder_taints(node)) == 1
    assert node["spec"]["unschedulable"] is True


def test_undo_retries_a_conflict_and_keeps_a_taint_added_meanwhile(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    raced: list[dict[str, Any]] = []

    def operator_writes(method: str, path: str) -> None:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1" and not raced:
            raced.append(fake.write("gpu-1", lambda n: n["spec"]["taints"].append(OPERATOR_TAINT)))

    fake.hooks.append(operator_writes)
    assert actuator.undo("gpu-1", alert_id="al-42").changed
    node = fake.node("gpu-1")
    assert node["spec"]["taints"] == [OPERATOR_TAINT]
    assert "unschedulable" not in node["spec"]
    assert "annotations" not in node["metadata"]


def test_an_injected_conflict_once_is_retried(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    fake.inject(409, method="PATCH", path=r"/api/v1/nodes/gpu-1")
    fake.inject(409, method="PATCH", path=r"/api/v1/nodes/gpu-1/status")
    outcome = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    assert outcome.changed
    assert "cordoned" in outcome.detail and "condition MinderFault=True" in outcome.detail
    node = fake.node("gpu-1")
    assert node["spec"]["unschedulable"] is True
    assert condition(node) is not None


def test_a_persistent_conflict_is_a_transient_error(fake: FakeKubeApi, clock: Clock) -> None:
    fake.add_node("gpu-1")
    fake.inject(409, times=100, method="PATCH")
    actuator = make_actuator(fake, clock, conflict_attempts=3)
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    assert caught.value.transient
    assert "after 3 attempts" in str(caught.value) and "409" in str(caught.value)
    assert len(fake.calls("PATCH")) == 3
    assert len(fake.calls("GET")) == 3  # each attempt reads the node again


# -- errors -----------------------------------------------------------------------------------


def test_a_missing_node_is_not_transient(actuator: KubernetesActuator) -> None:
    for call in (
        lambda: actuator.apply("ghost", alert_id="al-42", reason="x"),
        lambda: actuator.undo("ghost", alert_id="al-42"),
    ):
        with pytest.raises(ActionError) as caught:
            call()
        assert not caught.value.transient
        assert "node ghost not found" in str(caught.value)


@pytest.mark.parametrize("code", [429, 500, 503, 504])
def test_server_side_failures_are_transient(
    fake: FakeKubeApi, actuator: KubernetesActuator, code: int
) -> None:
    """On a PATCH: urllib3 itself retries a GET answered 429 or 503 with ``Retry-After``."""
    fake.add_node("gpu-1")
    fake.inject(code, method="PATCH")
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    assert caught.value.transient
    assert str(code) in str(caught.value)
    assert actuator.apply("gpu-1", alert_id="al-42", reason="x").changed  # once it is over


@pytest.mark.parametrize("code", [400, 422])
def test_a_refused_request_is_not_transient(
    fake: FakeKubeApi, actuator: KubernetesActuator, code: int
) -> None:
    fake.add_node("gpu-1")
    fake.inject(code, method="PATCH")
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    assert not caught.value.transient


def test_the_servers_message_is_one_line_and_truncated(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    fake.inject(500, message="boom\r\nInjected: header\n" + "z" * 10_000)
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    text = str(caught.value)
    assert "\n" not in text and "\r" not in text
    assert "boom Injected: header" in text
    assert len(text) < 400


def test_an_unreachable_server_is_transient(clock: Clock) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration(
        host=f"http://127.0.0.1:{port}", api_key={"authorization": "Bearer t"}
    )
    actuator = KubernetesActuator(client.ApiClient(configuration), request_timeout_s=2.0)
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    assert caught.value.transient
    assert "unreachable" in str(caught.value)


@pytest.mark.parametrize("fault", ["timeout", "drop"])
def test_a_hung_or_dropped_request_is_transient(
    fake: FakeKubeApi, clock: Clock, fault: str
) -> None:
    fake.add_node("gpu-1")
    fake.inject(fault, method="PATCH", hold_s=10.0)
    actuator = make_actuator(fake, clock, request_timeout_s=0.3)
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    assert caught.value.transient
    assert "\n" not in str(caught.value)


def test_no_token_is_401_and_not_transient(fake: FakeKubeApi, clock: Clock) -> None:
    fake.add_node("gpu-1")
    for token in (None, "wrong"):
        actuator = make_actuator(fake, clock, token=token)
        with pytest.raises(ActionError) as caught:
            actuator.apply("gpu-1", alert_id="al-42", reason="x")
        assert not caught.value.transient
        assert "401 Unauthorized" in str(caught.value)
    assert {r.status for r in fake.requests} == {401}


def test_forbidden_names_the_missing_verb_and_resource(fake: FakeKubeApi, clock: Clock) -> None:
    fake.add_node("gpu-1")
    fake.tokens["no-status"] = ("minder", ALL_RULES - {("patch", "nodes/status")})
    actuator = make_actuator(fake, clock, token="no-status")
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="x")
    assert not caught.value.transient
    assert "403 Forbidden, RBAC must allow verb 'patch' on resource 'nodes/status'" in str(
        caught.value
    )


def _rules(rules: list[dict[str, list[str]]]) -> frozenset[tuple[str, str]]:
    return frozenset(
        (verb, resource)
        for rule in rules
        if rule["apiGroups"] == [""]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


def test_rbac_rules_are_enough_and_each_is_needed(fake: FakeKubeApi, clock: Clock) -> None:
    needed = _rules(RBAC_RULES)
    assert needed == {
        ("get", "nodes"),
        ("patch", "nodes"),
        ("patch", "nodes/status"),
        ("list", "pods"),
    }
    fake.tokens["minimal"] = ("minder", needed)
    fake.add_node("gpu-1")
    fake.add_pod("train-0", node="gpu-1", labels={"job-name": "train"})
    actuator = make_actuator(fake, clock, token="minimal")
    assert actuator.job_nodes("train") == {"gpu-1"}
    assert actuator.apply("gpu-1", alert_id="al-42", reason="x").changed
    assert actuator.undo("gpu-1", alert_id="al-42").changed

    for rule in sorted(needed):
        fake.tokens["less"] = ("minder", needed - {rule})
        fake.add_node("gpu-2")
        lesser = make_actuator(fake, clock, token="less")
        with pytest.raises(ActionError) as caught:  # the check and an apply use every rule
            lesser.job_nodes("train")
            lesser.apply("gpu-2", alert_id="al-42", reason="x")
        assert not caught.value.transient
        assert f"verb {rule[0]!r} on resource {rule[1]!r}" in str(caught.value)


def test_a_failed_condition_write_converges_on_the_next_apply(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    fake.inject(500, method="PATCH", path=r"/api/v1/nodes/gpu-1/status")
    with pytest.raises(ActionError) as caught:
        actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    assert caught.value.transient
    assert fake.node("gpu-1")["spec"]["unschedulable"] is True
    retried = actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    assert retried.changed and retried.detail == "condition MinderFault=True"
    assert not actuator.apply("gpu-1", alert_id="al-42", reason="xid 79").changed


def test_a_failed_undo_converges_on_the_next_undo(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.add_node("gpu-1")
    actuator.apply("gpu-1", alert_id="al-42", reason="xid 79")
    fake.inject(503, method="PATCH", path=r"/api/v1/nodes/gpu-1")
    with pytest.raises(ActionError):
        actuator.undo("gpu-1", alert_id="al-42")
    node = fake.node("gpu-1")
    assert node["metadata"]["annotations"][ANNOTATION_ALERT] == "al-42"  # the mark is still on
    assert (condition(node) or {}).get("status") == "False"
    retried = actuator.undo("gpu-1", alert_id="al-42")
    assert retried.changed and "uncordoned" in retried.detail
    assert "unschedulable" not in fake.node("gpu-1")["spec"]


# -- the scheduler's view: which nodes a job runs on -------------------------------------------


def test_job_nodes_are_the_nodes_of_the_jobs_running_pods(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    view: SchedulerView = actuator
    fake.add_pod("train-0", node="gpu-1", labels={"job-name": "train"})
    fake.add_pod("train-1", node="gpu-2", labels={"job-name": "train"}, namespace="ml")
    fake.add_pod("train-2", node="gpu-3", labels={"job-name": "train"}, phase="Succeeded")
    fake.add_pod("train-3", labels={"job-name": "train"}, phase="Pending")  # not scheduled
    fake.add_pod("other-0", node="gpu-4", labels={"job-name": "other"})
    fake.add_pod("unlabelled", node="gpu-5")
    # the Succeeded pod ran there too (a fault may end the job before Minder acts)
    assert view.job_nodes("train") == {"gpu-1", "gpu-2", "gpu-3"}
    assert view.job_nodes("other") == {"gpu-4"}
    assert view.job_nodes("ghost") is None
    listed = fake.calls("GET", "/api/v1/pods")[0]  # one request per check
    assert len(fake.calls("GET")) == 3
    assert listed.query == {
        "labelSelector": ["job-name=train"],
        "fieldSelector": ["status.phase!=Pending"],
    }


def test_job_nodes_in_one_namespace_with_another_label(fake: FakeKubeApi, clock: Clock) -> None:
    fake.add_pod("a", node="gpu-1", labels={"example.com/job": "run-7"}, namespace="ml")
    fake.add_pod("b", node="gpu-2", labels={"example.com/job": "run-7"}, namespace="dev")
    actuator = make_actuator(fake, clock, job_label="example.com/job", job_namespace="ml")
    assert actuator.job_nodes("run-7") == {"gpu-1"}
    assert [r.path for r in fake.calls("GET")] == ["/api/v1/namespaces/ml/pods"]
    with pytest.raises(ValueError, match="not a label key"):
        make_actuator(fake, clock, job_label="bad label")
    with pytest.raises(ValueError, match="not a namespace"):
        make_actuator(fake, clock, job_namespace="ML_ns")


def test_a_job_id_that_no_label_can_hold_asks_nothing(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    for job_id in ("a,job-name=train", "x" * 64, "-lead", "", "job name"):
        assert actuator.job_nodes(job_id) is None
    assert fake.requests == []


def test_an_unreachable_or_overloaded_api_server_makes_the_check_transient(
    fake: FakeKubeApi, actuator: KubernetesActuator
) -> None:
    fake.inject(503, path="/api/v1/pods")
    with pytest.raises(ActionError, match="list pods of job train") as info:
        actuator.job_nodes("train")
    assert info.value.transient
    fake.inject("drop", times=10, path="/api/v1/pods")  # the client retries a dropped GET
    with pytest.raises(ActionError) as info:
        actuator.job_nodes("train")
    assert info.value.transient


def _checked_executor(
    fake: FakeKubeApi, clock: Clock, tmp_path: Path
) -> tuple[ActionExecutor, SessionFactory, DeliveryWorker]:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'checked.db'}")
    upgrade_database(engine)
    sessions = session_factory(engine)
    with sessions.begin() as session:  # 8 watched machines: 2 % allows one per hour
        upsert_job_machines(
            session, "train", [MachineInfo(f"gpu-{i}", "", "") for i in range(8)], 1.0
        )
    executor = ActionExecutor(
        make_actuator(fake, clock),
        ActionPolicy(enforce=True, max_per_job=1, max_fraction=0.02),
        sessions,
        notify=[NOTIFY],
    )
    worker = DeliveryWorker(executor, sessions, backoff=Backoff(base_s=0.01, cap_s=0.05))
    return executor, sessions, worker


def test_only_an_alert_on_a_node_of_its_job_cordons(
    fake: FakeKubeApi, clock: Clock, tmp_path: Path
) -> None:
    for i in range(8):
        fake.add_node(f"gpu-{i}")
    for i in range(4):
        fake.add_pod(f"train-{i}", node=f"gpu-{i}", labels={"job-name": "train"})
    executor, sessions, worker = _checked_executor(fake, clock, tmp_path)
    destinations = [executor.destination_spec(), NOTIFY]

    def alert(job: str, machine: str) -> Alert:
        raised = Alert(job=job, machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count",
                       score=1.0, first_ts=1000.0, detected_ts=1001.0)  # fmt: skip
        with sessions.begin() as session:
            stored, _ = record_alert_with_events(session, raised, destinations)
        worker.run_once()
        return stored

    unknown = alert("ghost", "gpu-5")  # no such job
    outside = alert("train", "gpu-6")  # a node outside the job
    with sessions() as session:
        skipped, _ = list_audit(session, outcome="skipped_not_in_job")
        suspicious, _ = list_alerts(session, kind="suspicious_source")
        assert not get_breaker(session, BREAKER).tripped
    assert {e.alert_id for e in skipped} == {unknown.id, outside.id}
    for node in ("gpu-5", "gpu-6"):
        assert not fake.node(node)["spec"].get("unschedulable")
        assert not minder_taints(fake.node(node))
    assert not fake.calls("PATCH")
    by_original = {a.evidence["original_alert_id"]: a for a in suspicious}
    assert by_original[outside.id].evidence["reason"] == (
        "node gpu-6 is not running job train per kubernetes (the job runs on 4 other node(s))"
    )
    assert (
        by_original[unknown.id]
        .evidence["reason"]
        .startswith("node gpu-5 is not running job ghost per kubernetes")
    )

    real = alert("train", "gpu-2")  # the one machine the breaker allows
    assert fake.node("gpu-2")["spec"]["unschedulable"] is True
    with sessions() as session:
        [applied], _ = list_audit(session, outcome="applied")
        assert not get_breaker(session, BREAKER).tripped
    assert applied.alert_id == real.id


# -- configuration ----------------------------------------------------------------------------


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters:
              - name: lab
                cluster: {{server: "{server}"}}
            users:
              - name: minder
                user: {{token: t}}
              - name: nobody
                user: {{token: nope}}
            contexts:
              - name: lab
                context: {{cluster: lab, user: minder}}
              - name: lab-nobody
                context: {{cluster: lab, user: nobody}}
            current-context: lab-nobody
            """
        )
    )
    return path


def test_from_config_uses_the_kubeconfig_context_and_not_the_global_default(
    fake: FakeKubeApi, tmp_path: Path
) -> None:
    fake.add_node("gpu-1")
    default_host = client.Configuration.get_default_copy().host
    actuator = KubernetesActuator.from_config(str(_kubeconfig(tmp_path, fake.url)), "lab", False)
    assert actuator.apply("gpu-1", alert_id="al-42", reason="x").changed
    assert client.Configuration.get_default_copy().host == default_host
    assert fake.requests[0].authorization == "Bearer t"

    current = KubernetesActuator.from_config(str(_kubeconfig(tmp_path, fake.url)), None, False)
    with pytest.raises(ActionError) as caught:  # the current context's user is refused
        current.undo("gpu-1", alert_id="al-42")
    assert "401" in str(caught.value)


def test_from_config_errors_are_not_transient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _kubeconfig(tmp_path, "http://127.0.0.1:1")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    for kwargs in (
        {"kubeconfig": str(config), "context": "missing", "in_cluster": False},
        {"kubeconfig": str(tmp_path / "absent"), "context": None, "in_cluster": False},
        {"kubeconfig": None, "context": None, "in_cluster": True},
        {"kubeconfig": str(config), "context": None, "in_cluster": True},
    ):
        with pytest.raises(ActionError) as caught:
            KubernetesActuator.from_config(**kwargs)
        assert not caught.value.transient, kwargs
        assert "\n" not in str(caught.value)


# -- the fake follows the API -----------------------------------------------------------------


def raw(
    fake: FakeKubeApi,
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
    token: str | None = "t",
) -> tuple[int, Any]:
    """One request to the fake without the client library, to see exactly what it answers."""
    host, port = fake.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = content_type or "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else None
    finally:
        conn.close()


SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSONP = "application/json-patch+json"


def rv(node: dict[str, Any]) -> str:
    return str(node["metadata"]["resourceVersion"])


def test_fake_strategic_merge_replaces_taints_which_are_atomic(fake: FakeKubeApi) -> None:
    """``spec.taints`` has no patch strategy (API reference: "Atomic: will be replaced during a
    merge"), so a strategic merge patch replaces the list instead of merging by key."""
    fake.add_node("n1", taints=[OPERATOR_TAINT, GPU_TAINT])
    new = {"key": "minder.io/fault", "value": "x", "effect": "NoSchedule"}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": [new]}}, SMP)
    assert code == 200
    assert node["spec"]["taints"] == [new]


def test_fake_strategic_merge_merges_conditions_by_type(fake: FakeKubeApi) -> None:
    fake.add_node("n1")
    ready = condition(fake.node("n1"), "Ready")
    x = {"type": "X", "status": "True", "reason": "Because"}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1/status", {"status": {"conditions": [x]}}, SMP)
    assert code == 200
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready", "X"]
    assert condition(node, "Ready") == ready

    patch = {"status": {"conditions": [{"type": "Ready", "status": "False", "message": None}]}}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1/status", patch, SMP)
    assert code == 200 and ready is not None
    assert condition(node, "Ready") == {
        **{k: v for k, v in ready.items() if k != "message"},
        "status": "False",
    }

    patch = {"status": {"conditions": [{"type": "X", "$patch": "delete"}]}}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1/status", patch, SMP)
    assert [c["type"] for c in node["status"]["conditions"]] == ["Ready"]

    patch = {"status": {"conditions": [{"status": "True"}]}}  # no merge key
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1/status", patch, SMP)
    assert code == 400 and answer["reason"] == "BadRequest"


def test_fake_strategic_merge_maps_and_sets(fake: FakeKubeApi) -> None:
    fake.add_node("n1", annotations={"a": "1", "b": "2"})
    patch = {"metadata": {"annotations": {"a": None, "c": "3"}, "finalizers": ["f1"]}}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", patch, SMP)
    assert code == 200
    assert node["metadata"]["annotations"] == {"b": "2", "c": "3"}
    code, node = raw(
        fake, "PATCH", "/api/v1/nodes/n1", {"metadata": {"finalizers": ["f2", "f1"]}}, SMP
    )
    assert node["metadata"]["finalizers"] == ["f1", "f2"]  # a set: merged, not replaced


def test_fake_merge_patch_replaces_lists_and_null_deletes(fake: FakeKubeApi) -> None:
    fake.add_node("n1", annotations={"a": "1", "b": "2"}, taints=[OPERATOR_TAINT])
    x = {"type": "X", "status": "True"}
    code, node = raw(
        fake, "PATCH", "/api/v1/nodes/n1/status", {"status": {"conditions": [x]}}, MERGE
    )
    assert code == 200
    assert node["status"]["conditions"] == [x]  # RFC 7386: the list is replaced, Ready is gone
    patch = {"metadata": {"annotations": {"a": None}}, "spec": {"taints": None}}
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", patch, MERGE)
    assert node["metadata"]["annotations"] == {"b": "2"}
    assert "taints" not in node["spec"]


def test_fake_json_patch_with_test_op(fake: FakeKubeApi) -> None:
    before = fake.add_node("n1", annotations={"x": "y"})
    ok = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv(before)},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "c"},
    ]
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", ok, JSONP)
    assert code == 200
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"] == {"x": "y", "a/b": "c"}
    fake.add_node("bare")  # no annotations: adding below a missing parent does not apply
    missing_parent = [{"op": "add", "path": "/metadata/annotations/k", "value": "v"}]
    assert raw(fake, "PATCH", "/api/v1/nodes/bare", missing_parent, JSONP)[0] == 422

    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv(before)},
        {"op": "replace", "path": "/spec/unschedulable", "value": False},
    ]
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", stale, JSONP)
    assert code == 422  # not 409: the apiserver answers a failed test like any failed patch
    assert answer["reason"] == "Invalid" and answer["kind"] == "Status"
    assert fake.node("n1") == node

    code, answer = raw(
        fake, "PATCH", "/api/v1/nodes/n1", [{"op": "remove", "path": "/spec/nope"}], JSONP
    )
    assert code == 422
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", {"op": "add"}, JSONP)
    assert code == 400
    code, answer = raw(
        fake,
        "PATCH",
        "/api/v1/nodes/n1",
        [{"op": "test", "path": "/spec/unschedulable", "value": 1}],
        JSONP,
    )
    assert code == 422  # true is not 1 in JSON


def test_fake_resource_version_preconditions_and_increments(fake: FakeKubeApi) -> None:
    first = fake.add_node("n1")
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": True}}, MERGE)
    assert code == 200 and int(rv(node)) > int(rv(first))

    stale = {"metadata": {"resourceVersion": rv(first)}, "spec": {"unschedulable": False}}
    for content_type in (MERGE, SMP):
        code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", stale, content_type)
        assert code == 409
        assert {k: answer[k] for k in ("kind", "apiVersion", "status", "reason", "code")} == {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Conflict",
            "code": 409,
        }
        assert "the object has been modified" in answer["message"]
    replace_rv = [{"op": "replace", "path": "/metadata/resourceVersion", "value": rv(first)}]
    assert raw(fake, "PATCH", "/api/v1/nodes/n1", replace_rv, JSONP)[0] == 409
    assert fake.node("n1") == node

    fresh = {"metadata": {"resourceVersion": rv(node)}, "spec": {"unschedulable": False}}
    code, newer = raw(fake, "PATCH", "/api/v1/nodes/n1", fresh, MERGE)
    assert code == 200 and int(rv(newer)) > int(rv(node))
    assert "unschedulable" not in newer["spec"]  # omitempty

    code, same = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": False}}, MERGE)
    assert code == 200 and rv(same) == rv(newer)  # a no-op patch is not a write


def test_fake_status_and_main_resource_change_only_their_part(fake: FakeKubeApi) -> None:
    fake.add_node("n1")
    x = {"type": "X", "status": "True"}
    both = {
        "metadata": {"labels": {"l": "v"}},
        "spec": {"unschedulable": True},
        "status": {"conditions": [x]},
    }
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1", both, SMP)
    assert code == 200
    assert node["spec"]["unschedulable"] is True and node["metadata"]["labels"]["l"] == "v"
    assert condition(node, "X") is None
    code, node = raw(fake, "PATCH", "/api/v1/nodes/n1/status", {**both, "spec": {}}, SMP)
    assert condition(node, "X") == x
    assert node["spec"]["unschedulable"] is True  # "spec": {} in a status patch changes nothing


def test_fake_validates_taints(fake: FakeKubeApi) -> None:
    fake.add_node("n1")
    for taints in (
        [{"key": "k", "effect": "Sometimes"}],
        [{"key": "k", "effect": "NoSchedule"}, {"key": "k", "value": "v", "effect": "NoSchedule"}],
        [{"key": "bad key", "effect": "NoSchedule"}],
        [{"key": "k", "value": "-bad value-", "effect": "NoSchedule"}],
    ):
        code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": taints}}, MERGE)
        assert code == 422 and answer["reason"] == "Invalid", taints
        assert answer["details"]["causes"][0]["field"].startswith("spec.taints")
    same_key = [{"key": "k", "effect": "NoSchedule"}, {"key": "k", "effect": "NoExecute"}]
    assert raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": same_key}}, MERGE)[0] == 200
    typed = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {"unschedulable": "yes"}}, MERGE)
    assert typed[0] == 422


def test_fake_status_codes(fake: FakeKubeApi) -> None:
    fake.add_node("n1", labels={"pool": "a100"})
    fake.add_node("n2")
    code, answer = raw(fake, "GET", "/api/v1/nodes/ghost")
    assert (code, answer["reason"], answer["message"]) == (
        404,
        "NotFound",
        'nodes "ghost" not found',
    )
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/ghost", {}, MERGE)
    assert code == 404
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", {"spec": {}}, "application/json")
    assert (code, answer["reason"]) == (415, "UnsupportedMediaType")
    code, answer = raw(fake, "GET", "/api/v1/nodes/n1", token=None)
    assert (code, answer["reason"]) == (401, "Unauthorized")
    fake.tokens["reader"] = ("reader", frozenset({("get", "nodes")}))
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1/status", {}, SMP, token="reader")
    assert code == 403
    assert answer["message"] == (
        'nodes "n1" is forbidden: User "reader" cannot patch resource "nodes/status" in API '
        'group "" at the cluster scope'
    )
    code, answer = raw(fake, "PATCH", "/api/v1/nodes/n1", b"{not json", MERGE)
    assert code == 400
    code, listing = raw(fake, "GET", "/api/v1/nodes?labelSelector=pool%3Da100")
    assert code == 200 and listing["kind"] == "NodeList"
    assert [n["metadata"]["name"] for n in listing["items"]] == ["n1"]
    assert "kind" not in listing["items"][0]
    code, listing = raw(fake, "GET", "/api/v1/nodes")
    assert len(listing["items"]) == 2
    code, answer = raw(fake, "GET", "/api/v1/nodes?limit=1")
    assert code == 501 and fake.unsupported == ["the limit query parameter"]
    fake.unsupported.clear()


def test_fake_lists_pods_by_label_and_field_selectors(fake: FakeKubeApi) -> None:
    fake.add_pod("a", node="gpu-1", labels={"job-name": "t"})
    fake.add_pod("b", node="gpu-2", labels={"job-name": "t"}, namespace="ml", phase="Failed")
    fake.add_pod("c", labels={"job-name": "u"}, phase="Pending")

    def names(path: str) -> list[str]:
        code, listing = raw(fake, "GET", path)
        assert code == 200 and listing["kind"] == "PodList", listing
        assert all("kind" not in item for item in listing["items"])
        return [item["metadata"]["name"] for item in listing["items"]]

    assert names("/api/v1/pods") == ["a", "c", "b"]
    assert names("/api/v1/pods?labelSelector=job-name%3Dt") == ["a", "b"]
    assert names(
        "/api/v1/pods?labelSelector=job-name%3Dt&fieldSelector=status.phase%3DRunning"
    ) == ["a"]
    assert names("/api/v1/pods?fieldSelector=status.phase!%3DRunning,spec.nodeName%3D") == ["c"]
    assert names("/api/v1/namespaces/ml/pods") == ["b"]
    assert names("/api/v1/namespaces/none/pods") == []
    code, answer = raw(fake, "GET", "/api/v1/pods?fieldSelector=metadata.labels%3Dx")
    assert (code, answer["message"]) == (400, "field label not supported: metadata.labels")
    code, pod = raw(fake, "GET", "/api/v1/namespaces/ml/pods/b")
    assert code == 200 and pod["spec"]["nodeName"] == "gpu-2" and pod["kind"] == "Pod"
    code, answer = raw(fake, "GET", "/api/v1/namespaces/ml/pods/zz")
    assert (code, answer["message"]) == (404, 'pods "zz" not found')
    fake.tokens["nodes-only"] = ("ops", frozenset({("get", "nodes")}))
    code, answer = raw(fake, "GET", "/api/v1/pods", token="nodes-only")
    assert (code, answer["message"]) == (
        403,
        'pods is forbidden: User "ops" cannot list resource "pods" in API group "" at the '
        "cluster scope",
    )
    code, answer = raw(fake, "GET", "/api/v1/namespaces/ml/pods", token="nodes-only")
    assert code == 403 and answer["message"].endswith('in the namespace "ml"')


def test_fake_fault_injection(fake: FakeKubeApi) -> None:
    fake.add_node("n1")
    fake.inject(500, times=2, method="GET")
    assert [raw(fake, "GET", "/api/v1/nodes/n1")[0] for _ in range(3)] == [500, 500, 200]
    fake.inject(429)
    code, answer = raw(fake, "GET", "/api/v1/nodes/n1")
    assert (code, answer["reason"]) == (429, "TooManyRequests")
    fake.inject("drop")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        raw(fake, "GET", "/api/v1/nodes/n1")
    assert raw(fake, "GET", "/api/v1/nodes/n1")[0] == 200
