#!/usr/bin/env python3
"""Print Minder's Grafana dashboards as ConfigMaps for the Grafana dashboard sidecar.

One ConfigMap per ``dashboards/json/*.json``, labelled ``grafana_dashboard: "1"`` (the label
the sidecar of the Grafana Helm chart and kube-prometheus-stack watches by default) and
annotated ``grafana_folder: Minder``. The JSON files stay the only copy of the dashboards.

Why not kustomize's configMapGenerator: it loads no file outside the kustomization's
directory unless run with ``--load-restrictor LoadRestrictionsNone``, and it takes no glob,
so every new dashboard would have to be listed by hand.

Usage (from anywhere; needs PyYAML, a dependency of Minder)::

    python3 deploy/kubernetes/build_dashboards_configmap.py | kubectl apply --server-side -f -
    python3 deploy/kubernetes/build_dashboards_configmap.py --namespace monitoring -o out.yaml

Server-side apply avoids the 256 KiB limit of the annotation that client-side apply writes.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger("build_dashboards_configmap")

HERE = Path(__file__).resolve().parent
DASHBOARDS = HERE.parent.parent / "dashboards" / "json"
LABEL = ("grafana_dashboard", "1")
CONFIGMAP_LIMIT = 1024 * 1024  # bytes the API server accepts in one ConfigMap
_NAME = re.compile(r"[^a-z0-9-]+")


class DashboardError(Exception):
    """A dashboard file cannot be turned into a ConfigMap."""


def configmap_name(stem: str) -> str:
    """A valid ConfigMap name (DNS subdomain, at most 63 characters here) for a dashboard."""
    slug = _NAME.sub("-", stem.lower()).strip("-")
    if not slug:
        raise DashboardError(f"dashboard file name {stem!r} gives an empty ConfigMap name")
    return ("minder-dashboard-" + slug)[:63].rstrip("-")


def dashboard_configmap(path: Path, namespace: str, folder: str) -> dict[str, Any]:
    """The ConfigMap of one dashboard JSON file.

    Raises
    ------
    DashboardError
        The file is not a JSON object or is larger than a ConfigMap may be.
    """
    text = path.read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DashboardError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise DashboardError(f"{path}: expected a JSON object (a Grafana dashboard)")
    if len(text.encode("utf-8")) >= CONFIGMAP_LIMIT:
        raise DashboardError(f"{path}: larger than a ConfigMap can hold (1 MiB)")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(path.stem),
            "namespace": namespace,
            "labels": {
                LABEL[0]: LABEL[1],
                "app.kubernetes.io/name": "minder",
                "app.kubernetes.io/component": "dashboards",
            },
            "annotations": {"grafana_folder": folder},
        },
        "data": {path.name: text},
    }


def build(directory: Path, namespace: str = "minder", folder: str = "Minder") -> str:
    """The YAML stream of the ConfigMaps of every ``*.json`` in ``directory`` (sorted).

    Raises
    ------
    DashboardError
        No dashboard in ``directory``, two files with the same ConfigMap name, or a bad file.
    """
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise DashboardError(f"no *.json dashboard in {directory}")
    resources = [dashboard_configmap(p, namespace, folder) for p in paths]
    names = [r["metadata"]["name"] for r in resources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DashboardError(f"dashboard files map to the same ConfigMap name: {duplicates}")
    return yaml.safe_dump_all(resources, sort_keys=False, explicit_start=True, width=100)


def main(argv: list[str] | None = None) -> int:
    """Print (or write) the ConfigMaps; 0 on success, 1 on a bad dashboard."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboards", type=Path, default=DASHBOARDS, help="dashboard JSON dir")
    parser.add_argument("--namespace", default="minder", help="namespace the sidecar watches")
    parser.add_argument("--folder", default="Minder", help="Grafana folder (annotation)")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        text = build(args.dashboards, args.namespace, args.folder)
    except (DashboardError, OSError) as exc:
        logger.error("%s", exc)
        return 1
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
        logger.info("wrote %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
