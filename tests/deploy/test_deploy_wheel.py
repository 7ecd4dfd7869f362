"""The built wheel, installed in a clean virtualenv, works on its own.

Builds the wheel from exactly the files the package is made of (as the image does), installs it
with the extras the README's first command names and those the image installs (``grafana``,
``kubernetes``) into a new virtualenv without the system's or this venv's packages, and runs,
from a folder outside the repository: ``minder dashboards list`` (the shipped JSON, found
without ``--dir``), ``minder dashboards push`` (into tests/fake_grafana.py), ``minder serve
--help``, and a settings check with each scheduler-actions target (``MINDER_ACTIONS__TARGET``
``none``, ``slurm``, ``kubernetes``): the settings load and the target's actuator is built, as
``minder serve`` does at start-up.

Needs the package index (PyPI, or the pip configuration's) for the build backend and the
dependencies; one to two minutes with a warm pip cache. ``.ci/wheel-test`` runs this file alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_grafana import FakeGrafana

INSTALL_TIMEOUT_S = 600
"""The dependencies' download and install (about 70 s from a warm pip cache)."""

# The module's first test also builds and installs the wheel (its fixture).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT_S + 300)]

REPO = Path(__file__).resolve().parents[2]

SETTINGS_CHECK = """\
from minder.config import Settings
from minder.service.delivery import build_actuator

settings = Settings.load()
target = settings.actions.target
actuator = "-" if target == "none" else type(build_actuator(settings)).__name__
print(target, actuator)
"""
"""What ``minder serve`` does with the settings before it starts anything: load them (every
MINDER_* value checked) and build the scheduler target (its optional package imported)."""

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
  - name: trial
    cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
  - name: minder
    user: {token: not-a-real-token}
contexts:
  - name: trial
    context: {cluster: trial, user: minder}
current-context: trial
"""


def readme_extras() -> set[str]:
    """The extras of the README's first install command (``pip install -e ".[a,b]"``)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md: expected a ```bash block of first commands"
    first = block.group(1).splitlines()[0]
    match = re.search(r'pip install -e "\.\[([\w,-]+)\]"', first)
    assert match, f"README.md's first command installs no extras: {first}"
    return set(match.group(1).split(","))


def image_extras() -> set[str]:
    """The extras deploy/Dockerfile installs (``ARG MINDER_EXTRAS=…``; test_deploy_dockerfile.py
    checks that they hold what a documented setting needs)."""
    text = (REPO / "deploy" / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG MINDER_EXTRAS=([\w,-]+)$", text, re.M)
    assert match, "deploy/Dockerfile: expected ARG MINDER_EXTRAS=..."
    return set(match.group(1).split(","))


def package_sources() -> list[str]:
    """pyproject.toml, the README and the top-level packages setuptools finds."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [
        p.name
        for p in sorted(REPO.iterdir())
        if (p / "__init__.py").is_file()
        and any(re.fullmatch(i.replace("*", ".*"), p.name) for i in include)
    ]
    return ["pyproject.toml", pyproject["project"]["readme"], *packages]


@dataclass
class Installed:
    venv: Path
    wheel: Path
    workdir: Path

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A command of the venv, from a folder outside the repository, without MINDER_*."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("MINDER_", "PYTHON"))}
        clean.update({"COLUMNS": "200", "NO_COLOR": "1", "HOME": str(self.workdir)})
        clean.update(env or {})
        return subprocess.run(
            [str(self.venv / "bin" / args[0]), *args[1:]],
            cwd=self.workdir,
            env=clean,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _explain(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{result.args}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in package_sources():
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    wheels = root / "wheels"
    build = subprocess.run(
        [
            # Build isolation: the build backend pyproject.toml names, from the index (this
            # venv need not have setuptools: Python 3.12's venvs do not).
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet"),
            *("-w", str(wheels), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, _explain(build)
    [wheel] = wheels.glob("minder-*.whl")
    venv = root / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(venv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, _explain(made)
    extras = ",".join(sorted(readme_extras() | image_extras()))
    assert {"grafana", "kubernetes"} <= set(extras.split(","))
    install = subprocess.run(
        [
            *(str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"),
            *("--disable-pip-version-check", f"{wheel}[{extras}]"),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    assert install.returncode == 0, _explain(install)
    workdir = root / "elsewhere"
    workdir.mkdir()
    yield Installed(venv, wheel, workdir)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        names = set(archive.namelist())
    shipped = {p.name for p in (REPO / "dashboards" / "json").glob("*.json")}
    assert {f"dashboards/json/{n}" for n in shipped} <= names
    assert "dashboards/provisioning/datasources/minder.yaml" in names
    found = installed.run(
        "python",
        "-c",
        "import dashboards, minder; print(minder.__file__); print(dashboards.__file__)",
    )
    assert found.returncode == 0, _explain(found)
    for line in found.stdout.split():
        assert Path(line).is_relative_to(installed.venv), line


def test_dashboards_list_finds_the_shipped_json(installed: Installed) -> None:
    result = installed.run("minder", "dashboards", "list", "--format", "json")
    assert result.returncode == 0, _explain(result)
    listed = json.loads(result.stdout)
    assert {d["uid"] for d in listed} == {
        "minder-fleet",
        "minder-job",
        "minder-whatif",
        "minder-service",
        "minder-agents",
    }
    for dashboard in listed:
        assert Path(dashboard["file"]).is_relative_to(installed.venv), dashboard["file"]


def test_dashboards_push_works_from_the_readme_install(installed: Installed) -> None:
    with FakeGrafana() as grafana:
        result = installed.run(
            "minder",
            "dashboards",
            "push",
            "--grafana-url",
            grafana.url,
            "--token",
            grafana.token,
            "--format",
            "json",
        )
        assert result.returncode == 0, _explain(result)
        report = json.loads(result.stdout)
        assert {d["status"] for d in report["dashboards"]} == {"created"}
        assert len(grafana.dashboards) == 5


def test_serve_help(installed: Installed) -> None:
    result = installed.run("minder", "serve", "--help")
    assert result.returncode == 0, _explain(result)
    assert "Usage: minder serve" in result.stdout


@pytest.mark.parametrize("target", ["none", "slurm", "kubernetes"])
def test_settings_check_with_each_actions_target(installed: Installed, target: str) -> None:
    env = {"MINDER_ACTIONS__TARGET": target}
    if target == "kubernetes":
        kubeconfig = installed.workdir / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG, encoding="utf-8")
        env["MINDER_ACTIONS__KUBECONFIG"] = str(kubeconfig)
    result = installed.run("python", "-c", SETTINGS_CHECK, env=env)
    assert result.returncode == 0, _explain(result)
    expected = {"none": "-", "slurm": "SlurmActuator", "kubernetes": "KubernetesActuator"}
    assert result.stdout.split() == [target, expected[target]]
