"""The Kubernetes self-check launcher with the real ``kubernetes`` client against the fake API
server (tests/minder/actions/fake_kube_api.py: Nodes, Pods, batch/v1 Jobs and Secrets, and the Job
controller played by the tests)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_kube_api import FakeKubeApi
from kubernetes import client

from minder.actions.base import ActionError
from minder.actions.kubernetes import (
    ANNOTATION_ALERT,
    TAINT_KEY,
    KubernetesActuator,
    taint_value,
)
from minder.actions.kubernetes import (
    RBAC_RULES as ACTUATOR_RULES,
)
from minder.actions.kubernetes_selfcheck import (
    LABEL_CHECK,
    NAMESPACE_RBAC_RULES,
    RBAC_RULES,
    KubernetesSelfCheckLauncher,
    parse_ref,
)
from minder.actions.selfcheck import CheckLaunch, LauncherOptions, LaunchState, SelfCheckLauncher
from minder.actions.selfcheck_targets import build_selfcheck_launcher

NS = "minder"
SUSPECT, P1, P2, P3 = "gpu-1", "gpu-2", "gpu-3", "gpu-4"
TOKEN = "tok-" + "s3cr3t" * 6
DAEMON = ("DaemonSet", "nvidia-device-plugin")
H100 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as server:
        yield server
    assert server.unsupported == [], "the launcher used something the fake does not implement"


def make_actuator(fake: FakeKubeApi, token: str = "t") -> KubernetesActuator:
    configuration = client.Configuration(
        host=fake.url, api_key={"authorization": f"Bearer {token}"}
    )
    return KubernetesActuator(
        client.ApiClient(configuration),
        conflict_backoff_s=0.0,
        request_timeout_s=5.0,
        clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


def make_launcher(
    fake: FakeKubeApi, token: str = "t", **options: Any
) -> KubernetesSelfCheckLauncher:
    options.setdefault("image", "registry.example.com/minder:1.4")
    options.setdefault("master_port", 29591)
    return KubernetesSelfCheckLauncher(make_actuator(fake, token), LauncherOptions(**options))


def cluster(fake: FakeKubeApi) -> None:
    """Four GPU nodes of one instance type, each with its device plugin (a DaemonSet pod)."""
    for i, name in enumerate((SUSPECT, P1, P2, P3), start=1):
        fake.add_node(
            name, labels=H100, internal_ip=f"10.0.0.{i}", allocatable={"nvidia.com/gpu": "8"}
        )
        fake.add_pod(f"plugin-{name}", namespace="kube-system", node=name, owner=DAEMON)


def take_out(fake: FakeKubeApi, node: str = SUSPECT, alert_id: str = "al-42") -> str:
    actuator = make_actuator(fake)
    assert actuator.apply(node, alert_id=alert_id, reason="gpu_xid gpu5 xid=79").changed
    return alert_id


def check(alert_id: str, partners: tuple[str, ...], **changes: Any) -> CheckLaunch:
    fields: dict[str, Any] = {
        "check_id": "c0ffee12",
        "alert_id": alert_id,
        "node": SUSPECT,
        "partners": partners,
        "command": ("minder", "selfcheck", "run", "--report-url", "http://minder:8080"),
        "env": {
            "MINDER_SELFCHECK_TOKEN": TOKEN,
            "MINDER_SELFCHECK_REPORT_URL": "http://minder:8080",
        },
        "timeout_s": 600.0,
    }
    fields.update(changes)
    return CheckLaunch(**fields)


def minder_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints", []) if t["key"] == TAINT_KEY]


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# -- ready and partners ---------------------------------------------------------------------------


def test_ready_only_for_minders_own_taint_on_a_node_without_workload(fake: FakeKubeApi) -> None:
    cluster(fake)
    launcher = make_launcher(fake)
    assert "no Minder mark" in (launcher.ready(SUSPECT, alert_id="al-42") or "")
    alert_id = take_out(fake)
    fake.add_pod("train-0", node=SUSPECT, labels={"job-name": "train"}, owner=("Job", "train"))
    fake.add_pod("static-etcd", namespace="kube-system", node=SUSPECT,
                 annotations={"kubernetes.io/config.mirror": "abc"})  # fmt: skip
    fake.add_pod("old-0", node=SUSPECT, phase="Succeeded")
    why = launcher.ready(SUSPECT, alert_id=alert_id) or ""
    assert "still runs pods (default/train-0)" in why  # not the DaemonSet's, mirror or ended pods
    assert "another" not in why
    assert "not held by Minder for minder:other" in (
        launcher.ready(SUSPECT, alert_id="other") or ""
    )
    fake.pods.pop(("default", "train-0"))
    assert launcher.ready(SUSPECT, alert_id=alert_id) is None

    # Someone removed Minder's taint but left the mark; or the kubelet stopped posting Ready.
    fake.write(SUSPECT, lambda n: n["spec"].pop("taints"))
    assert "lacks Minder's taint" in (launcher.ready(SUSPECT, alert_id=alert_id) or "")
    take_out(fake, alert_id=alert_id)
    fake.write(SUSPECT, lambda n: n["status"]["conditions"][0].update(status="Unknown"))
    assert "not Ready" in (launcher.ready(SUSPECT, alert_id=alert_id) or "")


def test_partners_are_idle_nodes_of_the_suspects_instance_type(fake: FakeKubeApi) -> None:
    cluster(fake)
    fake.add_node("cpu-1", internal_ip="10.0.1.1")  # another instance type (none)
    fake.add_node("gpu-5", labels=H100, unschedulable=True)  # cordoned by an operator
    fake.add_node("gpu-6", labels=H100, taints=[{"key": "ops", "effect": "NoExecute"}])
    fake.add_node("gpu-7", labels=H100, taints=[{"key": "soft", "effect": "PreferNoSchedule"}])
    fake.add_node("gpu-8", labels=H100, conditions=[{"type": "Ready", "status": "False"}])
    take_out(fake)
    launcher = make_launcher(fake)
    fake.add_pod("serve-0", node=P2, owner=("ReplicaSet", "serve-abc"))  # a workload: busy
    fake.add_pod("done-0", node=P3, phase="Failed")  # over: idle
    assert launcher.partners(SUSPECT, 10) == (P1, P3, "gpu-7")
    assert launcher.partners(SUSPECT, 2) == (P1, P3)
    assert launcher.partners(SUSPECT, 0) == ()
    take_out(fake, P1, alert_id="al-43")  # Minder took it out for another alert
    assert launcher.partners(SUSPECT, 10) == (P3, "gpu-7")
    with pytest.raises(ActionError, match="not found"):
        launcher.partners("gpu-99", 1)


# -- launch ---------------------------------------------------------------------------------------


def test_launch_makes_a_pinned_tolerating_job_per_node_and_a_secret(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, (P1, P2)))
    assert ref == f"{NS}/c0ffee12" and parse_ref(ref) == (NS, "c0ffee12")

    jobs = {name: job for (ns, name), job in fake.jobs.items() if ns == NS}
    assert sorted(jobs) == [f"minder-selfcheck-c0ffee12-{rank}" for rank in range(3)]
    for rank, node in enumerate((SUSPECT, P1, P2)):
        job = jobs[f"minder-selfcheck-c0ffee12-{rank}"]
        assert job["metadata"]["labels"][LABEL_CHECK] == "c0ffee12"
        assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "minder"
        spec = job["spec"]
        assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 600)
        assert spec["ttlSecondsAfterFinished"] == 3600
        pod = spec["template"]["spec"]
        assert pod["nodeName"] == node
        assert pod["restartPolicy"] == "Never" and pod["hostNetwork"] is True
        assert pod["automountServiceAccountToken"] is False
        assert {"key": TAINT_KEY, "operator": "Equal", "value": taint_value(alert_id),
                "effect": "NoSchedule"} in pod["tolerations"]  # fmt: skip
        container = pod["containers"][0]
        assert container["image"] == "registry.example.com/minder:1.4"
        assert container["command"] == ["minder", "selfcheck", "run", "--report-url",
                                        "http://minder:8080"]  # fmt: skip
        assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
        env = env_of(job)
        assert env["MINDER_SELFCHECK_RANK"] == str(rank)
        assert env["MINDER_SELFCHECK_NODE"] == node
        assert env["MINDER_SELFCHECK_WORLD"] == "3"
        assert env["MINDER_SELFCHECK_NODES"] == f"{SUSPECT},{P1},{P2}"
        assert env["MINDER_SELFCHECK_SUSPECT"] == SUSPECT
        assert env["MINDER_SELFCHECK_MASTER"] == "10.0.0.1:29591"  # the suspect's InternalIP
        assert env["MINDER_SELFCHECK_CHECK_ID"] == "c0ffee12"
        assert env["MINDER_SELFCHECK_TIMEOUT_S"] == "600"
        assert env["MINDER_SELFCHECK_REPORT_URL"] == "http://minder:8080"
        assert env["MINDER_SELFCHECK_EXPECTED_GPUS"] == "8"  # the node's capacity
        # Only the suspect posts the report: only its Job reads the token.
        if rank == 0:
            assert env["MINDER_SELFCHECK_TOKEN"] == {
                "secretKeyRef": {"name": "minder-selfcheck-c0ffee12", "key": "token"}
            }
        else:
            assert "MINDER_SELFCHECK_TOKEN" not in env
            assert 'minder-selfcheck-c0ffee12"' not in json.dumps(spec)  # no Secret reference
        # The Job controller made its pod, on the node, with the Job's labels.
        (made,) = fake.job_pods(NS, f"minder-selfcheck-c0ffee12-{rank}")
        assert made["spec"]["nodeName"] == node
        assert made["metadata"]["labels"]["job-name"] == f"minder-selfcheck-c0ffee12-{rank}"

    # The token is in the Secret only: never in a Job, nor in any request but the Secret's.
    secret = fake.secret(NS, "minder-selfcheck-c0ffee12")
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    # Owned by the suspect's Job: the garbage collector deletes it with that Job.
    suspect_job = jobs["minder-selfcheck-c0ffee12-0"]
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "minder-selfcheck-c0ffee12-0",
            "uid": suspect_job["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
    ]
    for request in fake.requests:
        if not request.path.endswith("/secrets"):
            assert TOKEN not in json.dumps(request.body or {}), request.path
    assert all(TOKEN not in json.dumps(job) for job in jobs.values())
    # The node stays cordoned and tainted for the whole check.
    held = fake.node(SUSPECT)
    assert held["spec"]["unschedulable"] is True and minder_taints(held)


def test_expected_gpus_are_the_capacity_not_what_is_allocatable(fake: FakeKubeApi) -> None:
    """The device plugin marked one of 8 GPUs unhealthy: the pod gets the 7 allocatable, and
    the check is told 8, so that ``gpu.matmul`` fails seeing 7."""
    fake.add_node(
        SUSPECT,
        labels=H100,
        internal_ip="10.0.0.1",
        allocatable={"nvidia.com/gpu": "7"},
        capacity={"nvidia.com/gpu": "8"},
    )
    fake.add_node(P1, labels=H100, internal_ip="10.0.0.2")  # no GPU resource at all
    alert_id = take_out(fake)
    make_launcher(fake).launch(check(alert_id, (P1,)))
    suspect = fake.job(NS, "minder-selfcheck-c0ffee12-0")
    container = suspect["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "7"}}
    assert env_of(suspect)["MINDER_SELFCHECK_EXPECTED_GPUS"] == "8"
    partner = fake.job(NS, "minder-selfcheck-c0ffee12-1")
    assert "MINDER_SELFCHECK_EXPECTED_GPUS" not in env_of(partner)


def test_the_secret_goes_with_the_suspects_job(fake: FakeKubeApi) -> None:
    """Deleted by the garbage collector with its owner (as after ``ttlSecondsAfterFinished``),
    even when Minder never releases the check."""
    cluster(fake)
    alert_id = take_out(fake)
    make_launcher(fake).launch(check(alert_id, (P1,)))
    assert fake.secrets
    api = client.BatchV1Api(make_actuator(fake).api_client)
    api.delete_namespaced_job("minder-selfcheck-c0ffee12-0", NS, propagation_policy="Background")
    assert not fake.secrets


def test_an_interrupted_launch_is_cleaned_up_with_ref_for(fake: FakeKubeApi) -> None:
    """The launch made its objects but the service never stored the ref: ``ref_for`` names
    them all the same."""
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    returned = launcher.launch(check(alert_id, (P1, P2)))
    ref = launcher.ref_for("c0ffee12")
    assert ref == returned == f"{NS}/c0ffee12"
    assert launcher.status(ref).state is LaunchState.PENDING
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="launch interrupted"
    )
    assert outcome.changed
    assert not fake.jobs and not fake.secrets and not [k for k in fake.pods if k[0] == NS]
    assert minder_taints(fake.node(SUSPECT))
    with pytest.raises(ActionError, match="check id 'Bad_1'") as info:
        launcher.ref_for("Bad_1")
    assert not info.value.transient


def test_status_follows_the_jobs(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, (P1,)))
    assert launcher.status(ref).state is LaunchState.PENDING
    assert fake.run_job(NS, "minder-selfcheck-c0ffee12-0") == "Running"  # the Secret is there
    assert fake.run_job(NS, "minder-selfcheck-c0ffee12-1") == "Running"
    assert launcher.status(ref).state is LaunchState.RUNNING
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-1", succeeded=True)
    assert launcher.status(ref).state is LaunchState.RUNNING
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-0", succeeded=True)
    assert launcher.status(ref).state is LaunchState.SUCCEEDED

    other = launcher.launch(check(alert_id, (P2,), check_id="bad1"))
    fake.run_job(NS, "minder-selfcheck-bad1-0")
    fake.finish_job(NS, "minder-selfcheck-bad1-1", succeeded=False, reason="DeadlineExceeded")
    failed = launcher.status(other)
    assert failed.state is LaunchState.FAILED
    assert "minder-selfcheck-bad1-1 on gpu-3 failed: DeadlineExceeded" in failed.detail
    assert launcher.status(f"{NS}/nothing").state is LaunchState.GONE


def test_pass_removes_minders_taint_and_the_jobs(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, (P1,)))
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-0", succeeded=True)
    outcome = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert outcome.changed and outcome.operation == "uncordon"
    node = fake.node(SUSPECT)
    assert not minder_taints(node) and not node["spec"].get("unschedulable")
    assert ANNOTATION_ALERT not in node["metadata"].get("annotations", {})
    assert not [k for k in fake.jobs if k[0] == NS] and not fake.secrets
    assert not [k for k in fake.pods if k[0] == NS]  # Background: the pods went with their Jobs
    deletes = fake.calls("DELETE", r"/apis/batch/v1/namespaces/minder/jobs/.*")
    assert deletes and all(r.query.get("propagationPolicy") == ["Background"] for r in deletes)
    again = launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    assert not again.changed and "already" in again.detail


def test_fail_keeps_the_taint_and_says_why(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, ()))
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-0", succeeded=True)
    outcome = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="failed: gpu.matmul"
    )
    assert outcome.changed and outcome.operation == "cordon"
    node = fake.node(SUSPECT)
    assert minder_taints(node) and node["spec"]["unschedulable"] is True
    condition = next(c for c in node["status"]["conditions"] if c["type"] == "MinderFault")
    assert condition["status"] == "True"
    assert condition["message"] == f"minder:{alert_id} selfcheck failed: gpu.matmul"
    assert not fake.jobs and not fake.secrets
    again = launcher.release(
        ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="failed: gpu.matmul"
    )
    assert not again.changed


def test_pass_keeps_an_operators_cordon(fake: FakeKubeApi) -> None:
    cluster(fake)
    fake.write(SUSPECT, lambda n: n["spec"].update(unschedulable=True))
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, ()))
    launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="passed")
    node = fake.node(SUSPECT)
    assert not minder_taints(node) and node["spec"]["unschedulable"] is True


def test_cancel_deletes_the_jobs_and_the_secret(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    ref = launcher.launch(check(alert_id, (P1,)))
    fake.run_job(NS, "minder-selfcheck-c0ffee12-0")
    launcher.cancel(ref)
    assert not fake.jobs and not fake.secrets and not [k for k in fake.pods if k[0] == NS]
    assert launcher.status(ref).state is LaunchState.GONE
    launcher.cancel(ref)  # nothing left: no error
    assert minder_taints(fake.node(SUSPECT))  # a cancel returns nothing


def test_a_failed_launch_deletes_what_it_made(fake: FakeKubeApi) -> None:
    cluster(fake)
    alert_id = take_out(fake)
    launcher = make_launcher(fake)
    fake.inject(503, method="POST", path=r"/apis/batch/v1/namespaces/minder/jobs")
    with pytest.raises(ActionError, match="503") as info:
        launcher.launch(check(alert_id, (P1,)))
    assert info.value.transient
    assert not fake.jobs and not fake.secrets
    # The objects of an earlier launch of that id are left (Minder died before it stored the
    # ref): AlreadyExists, not transient, and nothing of theirs is deleted.
    launcher.launch(check(alert_id, (P1,)))
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-0", succeeded=True)
    fake.finish_job(NS, "minder-selfcheck-c0ffee12-1", succeeded=True)
    with pytest.raises(ActionError, match="already exists") as info:
        launcher.launch(check(alert_id, (P2,)))
    assert not info.value.transient
    assert len(fake.jobs) == 2 and len(fake.secrets) == 1


def test_launch_refuses_what_it_must_not_check(fake: FakeKubeApi) -> None:
    cluster(fake)
    launcher = make_launcher(fake)
    with pytest.raises(ActionError, match="not held by Minder") as info:
        launcher.launch(check("al-42", ()))
    assert not info.value.transient  # someone else's hold never becomes Minder's
    alert_id = take_out(fake)
    fake.add_pod("train-0", node=SUSPECT, owner=("Job", "train"))
    with pytest.raises(ActionError, match="still runs pods") as info:
        launcher.launch(check(alert_id, ()))
    assert info.value.transient  # its pods end
    fake.pods.pop(("default", "train-0"))
    fake.add_pod("serve-0", node=P1, owner=("ReplicaSet", "serve-abc"))
    with pytest.raises(ActionError, match="no longer idle"):
        launcher.launch(check(alert_id, (P1,)))
    fake.write(SUSPECT, lambda n: n["status"].update(addresses=[]))
    with pytest.raises(ActionError, match="InternalIP") as info:
        launcher.launch(check(alert_id, (P2,)))
    assert not info.value.transient
    assert not fake.jobs and not fake.secrets


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"check_id": "Upper"}, "check id"),
        ({"check_id": "x" * 41}, "check id"),
        ({"node": "bad node"}, "not a node name"),
        ({"partners": (SUSPECT,)}, "repeat"),
        ({"command": ()}, "command"),
        ({"env": {"A-B": "x"}}, "environment name"),
        ({"timeout_s": -1.0}, "timeout"),
    ],
)
def test_a_bad_launch_is_refused_before_any_request(
    fake: FakeKubeApi, changes: dict[str, Any], message: str
) -> None:
    launcher = make_launcher(fake)
    with pytest.raises(ActionError, match=message) as info:
        launcher.launch(check("al-42", changes.pop("partners", ()), **changes))
    assert not info.value.transient
    assert fake.requests == []


def test_rbac_rules_are_enough_and_each_is_needed(fake: FakeKubeApi) -> None:
    def flat(rules: list[dict[str, list[str]]]) -> frozenset[tuple[str, str]]:
        return frozenset(
            (verb, resource)
            for rule in rules
            for resource in rule["resources"]
            for verb in rule["verbs"]
        )

    needed = flat(RBAC_RULES) | flat(NAMESPACE_RBAC_RULES)
    assert flat(ACTUATOR_RULES) <= needed
    fake.tokens["minimal"] = ("minder", needed)

    def whole_check(token: str, alert_id: str, check_id: str) -> None:
        launcher = make_launcher(fake, token=token)
        assert launcher.ready(SUSPECT, alert_id=alert_id) is None
        partners = launcher.partners(SUSPECT, 1)
        ref = launcher.launch(check(alert_id, partners, check_id=check_id))
        launcher.status(ref)
        launcher.cancel(ref)
        launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=False, reason="x")
        launcher.release(ref, node=SUSPECT, alert_id=alert_id, passed=True, reason="x")

    cluster(fake)
    whole_check("minimal", take_out(fake), "full")
    for rule in sorted(needed):
        fake.tokens["less"] = ("minder", needed - {rule})
        alert_id = take_out(fake, alert_id=f"al-{rule[0]}-{rule[1].replace('/', '-')}")
        with pytest.raises(ActionError) as caught:
            whole_check("less", alert_id, "less")
        assert not caught.value.transient
        assert f"verb {rule[0]!r} on resource {rule[1]!r}" in str(caught.value)
        make_launcher(fake).cancel(f"{NS}/less")
        make_actuator(fake).undo(SUSPECT, alert_id=alert_id)


def test_options_protocol_and_target() -> None:
    actuator = KubernetesActuator(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    launcher = build_selfcheck_launcher(actuator, LauncherOptions(namespace="checks"))
    assert isinstance(launcher, KubernetesSelfCheckLauncher)
    checked: SelfCheckLauncher = launcher
    assert checked.name == "kubernetes" and launcher.options.namespace == "checks"
    with pytest.raises(ValueError, match="namespace"):
        KubernetesSelfCheckLauncher(actuator, LauncherOptions(namespace="Bad_NS"))
    with pytest.raises(ValueError, match="image"):
        KubernetesSelfCheckLauncher(actuator, LauncherOptions(image="a b"))
    with pytest.raises(ValueError, match="master_port"):
        KubernetesSelfCheckLauncher(actuator, LauncherOptions(master_port=70000))
    with pytest.raises(ActionError, match="scheduler ref"):
        launcher.status("no-slash")


def test_the_fakes_jobs_and_secrets_answer_as_the_api_does(fake: FakeKubeApi) -> None:
    """What the launcher relies on, through the real client: the fake's Job and Secret semantics
    (validation, AlreadyExists, NotFound, the default Orphan propagation, RBAC)."""
    api = client.ApiClient(
        client.Configuration(host=fake.url, api_key={"authorization": "Bearer t"})
    )
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    fake.add_node(SUSPECT)
    job: Any = {
        "metadata": {"name": "j1", "labels": {"a": "b"}},
        "spec": {
            "template": {
                "spec": {
                    "nodeName": SUSPECT,
                    "restartPolicy": "Always",
                    "containers": [{"name": "c", "image": "i"}],
                }
            }
        },
    }
    with pytest.raises(client.ApiException) as caught:
        batch.create_namespaced_job(NS, job)
    assert caught.value.status == 422 and "restartPolicy" in str(caught.value.body)
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    made: Any = batch.create_namespaced_job(NS, job)
    assert made.spec.backoff_limit == 6 and made.spec.template.metadata.labels["job-name"] == "j1"
    with pytest.raises(client.ApiException) as caught:
        batch.create_namespaced_job(NS, job)
    assert caught.value.status == 409 and "AlreadyExists" in str(caught.value.body)
    with pytest.raises(client.ApiException) as caught:
        batch.create_namespaced_job("nowhere", job)
    assert caught.value.status == 404
    listed: Any = batch.list_namespaced_job(NS, label_selector="a=b")
    assert [j.metadata.name for j in listed.items] == ["j1"]
    assert batch.list_namespaced_job(NS, label_selector="a=c").items == []
    (pod,) = fake.job_pods(NS, "j1")
    batch.delete_namespaced_job("j1", NS)  # the API's default for Jobs: Orphan
    assert (NS, pod["metadata"]["name"]) in fake.pods
    assert not fake.pods[(NS, pod["metadata"]["name"])]["metadata"].get("ownerReferences")
    with pytest.raises(client.ApiException) as caught:
        batch.read_namespaced_job("j1", NS)
    assert caught.value.status == 404

    bad: Any = {"metadata": {"name": "s1"}, "data": {"token": "not base64!"}}
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_secret(NS, bad)
    assert caught.value.status == 422
    good: Any = {"metadata": {"name": "s1"}, "stringData": {"token": "x"}}
    core.create_namespaced_secret(NS, good)
    assert fake.secret(NS, "s1")["data"] == {"token": base64.b64encode(b"x").decode()}
    core.delete_namespaced_secret("s1", NS)
    with pytest.raises(client.ApiException) as caught:
        core.delete_namespaced_secret("s1", NS)
    assert caught.value.status == 404

    fake.tokens["reader"] = ("reader", frozenset({("list", "jobs")}))
    denied = client.BatchV1Api(
        client.ApiClient(
            client.Configuration(host=fake.url, api_key={"authorization": "Bearer reader"})
        )
    )
    with pytest.raises(client.ApiException) as caught:
        denied.create_namespaced_job(NS, job)
    assert caught.value.status == 403
    message = json.loads(caught.value.body or "{}")["message"]
    assert 'cannot create resource "jobs" in API group "batch"' in message
