"""deploy/kubernetes: schema validation, kustomize rendering, wiring and least privilege.

kubernetes-validate (--strict: unknown fields refused) checks the built-in kinds against the
Kubernetes OpenAPI schemas of several versions. It has no schema for the Prometheus Operator's
CRDs (it only warns "Couldn't find schema" and passes), so ServiceMonitor, PodMonitor and
PrometheusRule are validated against tests/deploy/schemas/monitoring.coreos.com_v1.json, a
hand-written strict subset of the operator's CRD schemas. `kubectl kustomize` renders the
kustomization offline.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
CRD_SCHEMAS = Path(__file__).resolve().parent / "schemas" / "monitoring.coreos.com_v1.json"
# Oldest and newest Kubernetes versions the manifests are validated against.
KUBERNETES_VERSIONS = ["1.28.0", "1.37.0"]
NOT_IN_KUSTOMIZATION = {"kustomization.yaml", "secret.example.yaml", "selfcheck-rbac.yaml"}
OPTIONAL = ("secret.example.yaml", "selfcheck-rbac.yaml")
"""Applied by hand: the example Secret, and the self-check rights (only with self-checks on)."""

Resource = dict[str, Any]


def _documents(path: Path) -> list[Resource]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def _kustomization() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    return document


def _resources() -> list[Resource]:
    """Every resource that kustomization.yaml applies, plus the optional ones."""
    files = [*_kustomization()["resources"], *OPTIONAL]
    return [doc for name in files for doc in _documents(K8S / name)]


def _key(resource: Resource) -> str:
    namespace = resource["metadata"].get("namespace", "")
    return f"{resource['kind']}/{namespace}/{resource['metadata']['name']}"


def _find(kind: str, name: str) -> Resource:
    found = [r for r in _resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _container(workload: Resource, name: str) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    [container] = [c for c in containers if c["name"] == name]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _arg(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} not in {args}"
    return args[args.index(flag) + 1]


# ---- files ------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    listed = set(_kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - NOT_IN_KUSTOMIZATION
    assert listed == on_disk


def test_names_are_unique() -> None:
    keys = [_key(r) for r in _resources()]
    assert len(keys) == len(set(keys)), keys


# ---- schema validation ------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_kinds_validate_strictly(version: str) -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed: run "
        ".ci/install-deploy-tools.sh .venv (CI does)",
    )
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    failures, custom = [], []
    for resource in _resources():
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except SchemaNotFoundError:
            custom.append(resource["kind"])
        except ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            failures.append(f"{_key(resource)}: {path}: {exc.message}")
    assert failures == []
    # Only the operator's kinds lack a schema; they are checked below.
    assert set(custom) == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_strict_validation_catches_a_misspelt_field() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import ValidationError

    deployment = json.loads(json.dumps(_find("Deployment", "minder")))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def _crd_validator(kind: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    document = json.loads(CRD_SCHEMAS.read_text(encoding="utf-8"))
    schema = {"$defs": document["$defs"], **document["kinds"][kind]}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor", "PrometheusRule"])
def test_operator_kinds_validate_against_the_crd_schema(kind: str) -> None:
    validator = _crd_validator(kind)
    resources = [r for r in _resources() if r["kind"] == kind]
    assert resources, f"no {kind} in the manifests"
    errors = [
        f"{_key(r)}: {'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for r in resources
        for e in validator.iter_errors(r)
    ]
    assert errors == []


def test_crd_schema_catches_a_misspelt_field() -> None:
    validator = _crd_validator("ServiceMonitor")
    monitor = json.loads(json.dumps(_find("ServiceMonitor", "minder")))
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "15s"
    assert list(validator.iter_errors(monitor))
    del monitor["spec"]["selector"]
    assert any("selector" in e.message for e in validator.iter_errors(monitor))


# ---- kustomize --------------------------------------------------------------------------------


def _kustomize_version(kubectl: str) -> tuple[int, ...] | None:
    result = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, check=False
    )
    match = re.search(r"Kustomize Version: v(\d+)\.(\d+)", result.stdout)
    return tuple(int(g) for g in match.groups()) if match else None


def test_kustomize_renders_the_manifests(
    tool: Callable[[str], str], run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    kubectl = tool("kubectl")
    version = _kustomize_version(kubectl)
    if version is None or version < (4, 0):
        pytest.skip(f"kubectl's kustomize is {version}: the `labels` field needs v4 or later")
    result = run([kubectl, "kustomize", K8S])
    assert result.returncode == 0, explain(result)
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    expected = [doc for name in _kustomization()["resources"] for doc in _documents(K8S / name)]
    assert sorted(map(_key, rendered)) == sorted(map(_key, expected))
    for resource in rendered:
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "minder"
        spec = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            assert container["image"].startswith("minder:"), container["image"]


# ---- RBAC -------------------------------------------------------------------------------------


def test_cluster_role_is_least_privilege() -> None:
    role = _find("ClusterRole", "minder-node-actions")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # exactly what the actuator needs (its fake API server proves each rule is needed)
    from minder.actions.kubernetes import RBAC_RULES

    expected = {
        (group, resource, verb)
        for rule in RBAC_RULES
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert expected == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "nodes/status", "patch"),
        ("", "pods", "list"),
    }
    assert granted == expected
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, "no resourceNames/nonResourceURLs"
    kustomized = [doc for name in _kustomization()["resources"] for doc in _documents(K8S / name)]
    assert not [r for r in kustomized if r["kind"] in {"Role", "RoleBinding"}]


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_selfcheck_rights_are_exactly_the_launchers() -> None:
    """selfcheck-rbac.yaml adds to the actuator's ClusterRole exactly what the Kubernetes
    self-check launcher needs beyond it, and holds its Job and Secret rights in one namespace."""
    from minder.actions.kubernetes_selfcheck import NAMESPACE_RBAC_RULES, RBAC_RULES

    cluster = _find("ClusterRole", "minder-selfcheck-nodes")
    actuator = _find("ClusterRole", "minder-node-actions")
    assert _grants(cluster["rules"]) | _grants(actuator["rules"]) == _grants(RBAC_RULES)
    assert not _grants(cluster["rules"]) & _grants(actuator["rules"])
    role = _find("Role", "minder-selfcheck")
    assert _grants(role["rules"]) == _grants(NAMESPACE_RBAC_RULES)
    account = _find("Deployment", "minder")["spec"]["template"]["spec"]["serviceAccountName"]
    for kind, name, ref_kind in (
        ("ClusterRoleBinding", "minder-selfcheck-nodes", "ClusterRole"),
        ("RoleBinding", "minder-selfcheck", "Role"),
    ):
        binding = _find(kind, name)
        assert binding["roleRef"]["kind"] == ref_kind
        assert binding["roleRef"]["name"] == name
        assert [s["name"] for s in binding["subjects"]] == [account]
    assert role["metadata"]["namespace"] == "minder"


def test_cluster_role_is_bound_to_the_service_account_only() -> None:
    binding = _find("ClusterRoleBinding", "minder-node-actions")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "minder-node-actions",
    }
    deployment = _find("Deployment", "minder")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account,
            "namespace": deployment["metadata"]["namespace"],
        }
    ]
    _find("ServiceAccount", account)


def test_agent_has_no_api_access() -> None:
    daemonset = _find("DaemonSet", "minder-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    account = _find("ServiceAccount", pod["serviceAccountName"])
    assert account.get("automountServiceAccountToken") is False
    bindings = [r for r in _resources() if r["kind"].endswith("RoleBinding")]
    for binding in bindings:
        assert all(s["name"] != account["metadata"]["name"] for s in binding["subjects"])


# ---- the detection service --------------------------------------------------------------------


def test_service_deployment() -> None:
    deployment = _find("Deployment", "minder")
    assert deployment["spec"]["replicas"] >= 2
    container = _container(deployment, "minder")
    assert container["args"] == ["serve"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    [port] = container["ports"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in (port["name"], port["containerPort"])
    config_maps = [e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e]
    secrets = [e["secretRef"]["name"] for e in container["envFrom"] if "secretRef" in e]
    assert config_maps and secrets
    config = _find("ConfigMap", config_maps[0])["data"]
    assert config["MINDER_API__HOST"] == "0.0.0.0"
    assert int(config["MINDER_API__PORT"]) == port["containerPort"]
    # One consumer group for all replicas: the group id is shared configuration.
    assert config["MINDER_KAFKA__GROUP_ID"]
    assert "MINDER_KAFKA__GROUP_ID" not in _env(container)
    secret = _find("Secret", secrets[0])["stringData"]
    assert {"MINDER_DATABASE__URL", "MINDER_API__TOKEN"} <= secret.keys()
    assert not {"MINDER_DATABASE__URL", "MINDER_API__TOKEN"} & config.keys(), (
        "secrets in a ConfigMap"
    )
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_service_pod_meets_the_restricted_pod_security_standard() -> None:
    deployment = _find("Deployment", "minder")
    pod = deployment["spec"]["template"]["spec"]
    namespace = _find("Namespace", deployment["metadata"]["namespace"])
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key, False)
    assert all("hostPath" not in v for v in pod.get("volumes", []))
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]


def test_service_exposes_the_api_port() -> None:
    service = _find("Service", "minder")
    pod_labels = _find("Deployment", "minder")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    container_port = _container(_find("Deployment", "minder"), "minder")["ports"][0]
    assert port["targetPort"] in (container_port["name"], container_port["containerPort"])


# ---- the agent --------------------------------------------------------------------------------


def test_agent_daemonset_reads_the_node() -> None:
    daemonset = _find("DaemonSet", "minder-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert {"operator": "Exists"} in pod["tolerations"]
    container = _container(daemonset, "agent")
    env = _env(container)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "MINDER_JOB" in env
    args = container["args"]
    assert args[args.index("agent") - 1] != "serve"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    sysfs = _arg(args, "--sysfs-root")
    assert mounts[sysfs]["readOnly"] is True
    assert volumes[mounts[sysfs]["name"]]["hostPath"]["path"] == "/sys"
    spool = _arg(args, "--spool-dir")
    assert spool in mounts and not mounts[spool].get("readOnly", False)
    spool_volume = volumes[mounts[spool]["name"]]
    assert "hostPath" in spool_volume or "emptyDir" in spool_volume
    # $(VAR) in args expands only variables defined in env.
    for value in args:
        for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value):
            assert name in env, f"args use $({name}), which env does not define"


def test_agent_metrics_are_reachable_and_scraped() -> None:
    daemonset = _find("DaemonSet", "minder-agent")
    container = _container(daemonset, "agent")
    args = container["args"]
    address = _arg(args, "--metrics-addr")
    assert address not in {"127.0.0.1", "localhost", "::1"}, "Prometheus could not scrape it"
    [port] = container["ports"]
    assert int(_arg(args, "--metrics-port")) == port["containerPort"]
    assert container["livenessProbe"]["httpGet"]["port"] == port["name"]
    monitor = _find("PodMonitor", "minder-agent")
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [port["name"]]
    # The rules expect job="minder-agent".
    assert pod_labels[monitor["spec"]["jobLabel"]] == "minder-agent"


def test_agent_security_context() -> None:
    daemonset = _find("DaemonSet", "minder-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = _container(daemonset, "agent")
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"]
    assert "privileged" not in context
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # The only root process: the init container that hands the spool to the agent's user.
    for init in pod.get("initContainers", []):
        init_context = init["securityContext"]
        assert init_context["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert init_context["allowPrivilegeEscalation"] is False
        owner = init["command"][1]
        assert (
            owner == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
        )


# ---- monitoring -------------------------------------------------------------------------------


def test_service_monitor_selects_the_service() -> None:
    monitor = _find("ServiceMonitor", "minder")
    service = _find("Service", "minder")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])
    # The rules expect job="minder".
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "minder"
    for endpoint in monitor["spec"]["endpoints"]:
        assert not endpoint.get("honorLabels", False)


def test_references_resolve() -> None:
    resources = {_key(r) for r in _resources()}
    for workload in (r for r in _resources() if r["kind"] in {"Deployment", "DaemonSet"}):
        namespace = workload["metadata"]["namespace"]
        pod = workload["spec"]["template"]["spec"]
        assert f"ServiceAccount/{namespace}/{pod['serviceAccountName']}" in resources
        for container in pod["containers"] + pod.get("initContainers", []):
            for source in container.get("envFrom", []):
                for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if field in source:
                        assert f"{kind}/{namespace}/{source[field]['name']}" in resources
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    config = _find("ConfigMap", ref["name"])
                    assert config["metadata"]["namespace"] == namespace
                    assert ref["key"] in config["data"]
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod.get("volumes", [])}
        for resource in _resources():
            if resource["kind"] in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
                continue
            assert f"Namespace//{resource['metadata']['namespace']}" in resources, _key(resource)


# ---- generated files --------------------------------------------------------------------------


def test_prometheusrule_is_up_to_date(
    run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    result = run([sys.executable, K8S / "build_prometheusrule.py", "--check"])
    assert result.returncode == 0, explain(result)
    rule = _find("PrometheusRule", "minder")
    rules = yaml.safe_load((REPO / "deploy/prometheus/rules/minder.rules.yml").read_text("utf-8"))
    assert rule["spec"]["groups"] == rules["groups"]


def test_prometheusrule_check_detects_a_stale_file(
    run: Callable[..., Any], explain: Callable[[Any], str], tmp_path: Path
) -> None:
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text("# stale\n", encoding="utf-8")
    result = run([sys.executable, K8S / "build_prometheusrule.py", "--check", "--output", stale])
    assert result.returncode == 1, explain(result)
    assert "stale" in result.stderr


def _dashboards(
    directory: Path, run: Callable[..., Any], explain: Callable[[Any], str]
) -> list[Resource]:
    result = run([sys.executable, K8S / "build_dashboards_configmap.py", "--dashboards", directory])
    assert result.returncode == 0, explain(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_dashboard_configmaps_from_sample_dashboards(
    run: Callable[..., Any], explain: Callable[[Any], str], tmp_path: Path
) -> None:
    for name, title in (("minder-fleet", "Fleet"), ("Job Detail", "Job")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"title": title, "panels": []}))
    configmaps = _dashboards(tmp_path, run, explain)
    assert [c["metadata"]["name"] for c in configmaps] == [
        "minder-dashboard-job-detail",
        "minder-dashboard-minder-fleet",
    ]
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        [(key, text)] = configmap["data"].items()
        assert json.loads(text) == json.loads((tmp_path / key).read_text())
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for configmap in configmaps:
        kubernetes_validate.validate(configmap, KUBERNETES_VERSIONS[-1], strict=True)


def test_dashboard_script_refuses_bad_json(
    run: Callable[..., Any], explain: Callable[[Any], str], tmp_path: Path
) -> None:
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    result = run([sys.executable, K8S / "build_dashboards_configmap.py", "--dashboards", tmp_path])
    assert result.returncode == 1, explain(result)
    assert "broken.json" in result.stderr


def test_dashboard_configmaps_from_the_repository(
    run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    directory = REPO / "dashboards" / "json"
    if not any(directory.glob("*.json")):
        pytest.skip("dashboards/json/*.json is not in this tree yet")
    configmaps = _dashboards(directory, run, explain)
    assert len(configmaps) == len(list(directory.glob("*.json")))
    for configmap in configmaps:
        size = sum(len(v.encode()) for v in configmap["data"].values())
        assert size < 1024 * 1024, f"{configmap['metadata']['name']} exceeds a ConfigMap's 1 MiB"
