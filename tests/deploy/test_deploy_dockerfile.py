"""deploy/Dockerfile against pyproject.toml (no Docker daemon here: the file is parsed).

Checks that the image's Python satisfies requires-python, that every package setuptools finds
(the dashboards and their JSON too) is copied in, that the console script is the entrypoint,
that the extras a documented setting needs (kubernetes, grafana) are installed and the `deep`
extra (PyTorch) is not, and that the build context filter keeps what the Dockerfile copies. hadolint lints
it when installed; a slow test builds the wheel from exactly the files the Dockerfile copies.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import sys
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case) and argument text."""

    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form of the arguments, or None for the shell form."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        return value


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comments dropped, continuation lines joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    """The instructions of each build stage (from its FROM on)."""
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """ARG defaults declared before the first FROM."""
    values: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, default = instruction.args.partition("=")
            values[name.strip()] = default.strip().strip('"')
    return values


def substitute(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def setuptools_packages(pyproject: dict[str, Any]) -> set[str]:
    """Top-level packages that [tool.setuptools.packages.find] include patterns select."""
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {
        path.name
        for path in REPO.iterdir()
        if (path / "__init__.py").is_file()
        and any(fnmatch.fnmatchcase(path.name, pattern) for pattern in include)
    }


def copied_sources(stage: list[Instruction]) -> set[str]:
    """Source paths of the COPY instructions of a stage (not COPY --from)."""
    sources: set[str] = set()
    for instruction in stage:
        if instruction.keyword != "COPY" or "--from=" in instruction.args:
            continue
        words = [w for w in instruction.args.split() if not w.startswith("--")]
        sources.update(w.rstrip("/").removeprefix("./") for w in words[:-1])
    return sources


def test_multi_stage_slim_python_satisfying_requires_python(
    instructions: list[Instruction], pyproject: dict[str, Any]
) -> None:
    build_stages = stages(instructions)
    assert len(build_stages) >= 2, "expected a multi-stage build"
    args = global_args(instructions)
    requires = SpecifierSet(pyproject["project"]["requires-python"])
    for stage in build_stages:
        image = substitute(stage[0].args.split()[0], args)
        match = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim(?:-\w+)?", image)
        assert match, f"base image {image!r}: expected python:<version>-slim"
        assert Version(match.group(1)) in requires, f"{image} vs requires-python {requires}"


def test_every_package_and_the_readme_is_copied(
    instructions: list[Instruction], pyproject: dict[str, Any]
) -> None:
    packages = setuptools_packages(pyproject)
    assert {"minder", "collectors", "detectors", "whatif", "dashboards"} <= packages
    builder = next(s for s in stages(instructions) if any(i.keyword == "COPY" for i in s))
    sources = copied_sources(builder)
    expected = packages | {"pyproject.toml", pyproject["project"]["readme"]}
    assert expected - sources == set(), f"not copied: {sorted(expected - sources)}"
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: no such path in the repository"


def installed_extras(instructions: list[Instruction]) -> set[str]:
    """The extras of the image's ``pip install "/src[${MINDER_EXTRAS}]"`` (the ARG's default)."""
    runs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    match = re.search(r'pip install "/src\[\$\{MINDER_EXTRAS\}\]"', runs)
    assert match, 'expected pip install "/src[${MINDER_EXTRAS}]"'
    build = next(s for s in stages(instructions) if any(i.keyword == "COPY" for i in s))
    args = [i.args for i in build if i.keyword == "ARG" and i.args.startswith("MINDER_EXTRAS=")]
    assert len(args) == 1, "expected one ARG MINDER_EXTRAS=... in the build stage"
    return {e.strip() for e in args[0].partition("=")[2].strip('"').split(",") if e.strip()}


def test_installs_without_the_deep_extra(instructions: list[Instruction]) -> None:
    runs = " ".join(i.args for i in instructions if i.keyword == "RUN")
    extras = installed_extras(instructions)
    assert "deep" not in extras and "torch" not in runs
    assert not extras & {"dev", "demo"}, "the image needs no dev tools"


def test_installs_every_extra_a_documented_setting_needs(
    instructions: list[Instruction], pyproject: dict[str, Any]
) -> None:
    """MINDER_ACTIONS__TARGET=kubernetes needs the kubernetes extra, `minder dashboards push` the
    grafana extra; PostgreSQL's driver is a core dependency. The dependency layer installs the
    same extras' requirements as the package install."""
    extras = installed_extras(instructions)
    optional = pyproject["project"]["optional-dependencies"]
    assert {"kubernetes", "grafana"} <= extras <= set(optional)
    assert any(d.startswith("psycopg") for d in pyproject["project"]["dependencies"])
    runs = [i.args for i in instructions if i.keyword == "RUN"]
    layer = next(r for r in runs if "requirements.txt" in r)
    assert "optional-dependencies" in layer and "MINDER_EXTRAS" in layer
    final = stages(instructions)[-1]
    assert "minder dashboards list" in " ".join(r for r in runs), "the build lists the dashboards"
    assert any("--from=build" in i.args for i in final if i.keyword == "COPY")


def test_runtime_stage_runs_the_console_script_as_non_root(
    instructions: list[Instruction], pyproject: dict[str, Any]
) -> None:
    from minder.config import ApiSettings

    final = stages(instructions)[-1]

    def last(keyword: str) -> Instruction:
        found = [i for i in final if i.keyword == keyword]
        assert found, f"the runtime stage has no {keyword}"
        return found[-1]

    scripts = pyproject["project"]["scripts"]
    entrypoint = last("ENTRYPOINT").exec_form()
    assert entrypoint == ["minder"] and "minder" in scripts
    assert last("CMD").exec_form() == ["serve"]
    assert str(ApiSettings().port) in last("EXPOSE").args.split()
    user = last("USER").args.split(":")[0]
    assert user not in {"root", "0"}, "the image must not run as root"
    env = " ".join(i.args for i in final if i.keyword == "ENV")
    assert "MINDER_API__HOST=0.0.0.0" in env, "the API must listen beyond the container"
    assert "/opt/minder/bin" in env, "the venv's minder must be on PATH"


def test_dockerignore_keeps_what_the_dockerfile_copies(
    instructions: list[Instruction],
) -> None:
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "expected an allow-list: exclude everything, then re-include"
    reincluded = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    sources = set().union(*(copied_sources(stage) for stage in stages(instructions)))
    assert sources - reincluded == set(), f"excluded from the context: {sources - reincluded}"


def test_hadolint(
    tool: Callable[[str], str], run: Callable[..., Any], explain: Callable[[Any], str]
) -> None:
    result = run([tool("hadolint"), "--no-color", DOCKERFILE])
    assert result.returncode == 0, explain(result)


@pytest.mark.slow
def test_wheel_builds_from_exactly_the_copied_files(
    instructions: list[Instruction],
    pyproject: dict[str, Any],
    run: Callable[..., Any],
    explain: Callable[[Any], str],
    tmp_path: Path,
) -> None:
    """What `pip install .` does in the image, on a tree holding only what COPY brings."""
    pytest.importorskip("setuptools")
    context = tmp_path / "src"
    context.mkdir()
    sources = set().union(*(copied_sources(stage) for stage in stages(instructions)))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for source in sorted(sources):
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=ignore)
        else:
            shutil.copy2(origin, context / source)
    wheels = tmp_path / "wheels"
    result = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            wheels,
            context,
        ],
        timeout=300,
    )
    assert result.returncode == 0, explain(result)
    [wheel] = wheels.glob("minder-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        script = f"minder = {pyproject['project']['scripts']['minder']}"
        assert script in archive.read(entry_points).decode()
    for package in setuptools_packages(pyproject):
        assert f"{package}/__init__.py" in names, f"{package} is missing from the wheel"
    for package, patterns in pyproject["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:
            on_disk = list((REPO / package).glob(pattern))
            in_wheel = [n for n in names if fnmatch.fnmatch(n, f"{package}/{pattern}")]
            assert len(in_wheel) >= len(on_disk), f"package data {package}/{pattern} missing"
    # `minder dashboards list|push` read the dashboards from the installed package.
    shipped = {Path(n).name for n in names if fnmatch.fnmatch(n, "dashboards/json/*.json")}
    assert shipped == {p.name for p in (REPO / "dashboards" / "json").glob("*.json")}
