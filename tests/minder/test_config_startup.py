"""Settings that never crash: every ``MINDER_*`` variable and every combination that needs an
optional package is checked at start-up, and each problem is one line naming the variable, the
value and what is allowed (with the pip extra for a missing package)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from detectors.hang_watch import HangDetector
from minder.config import (
    OTHER_PREFIXES,
    DetectionSettings,
    Settings,
    SettingsError,
    install_hint,
    setting_variables,
    unknown_variables,
)

ROOT = Path(__file__).resolve().parents[2]
# ``python -m minder.cli`` with some packages made unimportable, as if not installed
RUN_WITHOUT = (
    "import runpy, sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    if name: sys.modules[name] = None\n"
    "sys.argv = ['minder', *sys.argv[2:]]\n"
    "runpy.run_module('minder.cli', run_name='__main__')\n"
)


def _serve(env: dict[str, str], without: str = "") -> tuple[int, list[str]]:
    """``minder serve`` with ``env`` (and no other MINDER_* variable): its status and the
    non-empty lines of its stderr."""
    full = {k: v for k, v in os.environ.items() if not k.upper().startswith("MINDER_")}
    full.update(env)
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, without, "serve"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("env", "without", "expected"),
    [
        (
            {"MINDER_ACTIONS__TARGET": "kubernetes"},
            "kubernetes,urllib3",
            "error: bad setting MINDER_ACTIONS__TARGET='kubernetes': the Kubernetes target needs "
            "the Python package 'kubernetes', not installed: pip install 'minder[kubernetes]', "
            "or choose target none or slurm",
        ),
        (
            {"MINDER_DATABASE__URL": "mysql://minder:s3cret@db:3306/minder"},
            "",
            "error: bad setting MINDER_DATABASE__URL='mysql://minder:***@db:3306/minder': "
            "database 'mysql' is not supported: expected sqlite:///PATH or "
            "postgresql://USER@HOST:PORT/DB",
        ),
        (
            {"MINDER_DATABASE__URL": "postgresql://minder@db/minder"},
            "psycopg",
            "error: bad setting MINDER_DATABASE__URL='postgresql://minder@db/minder': a PostgreSQL "
            "URL needs the Python package 'psycopg[binary]', not installed: pip install",
        ),
        (
            {"MINDER_LOG_LEVEL": "LOUD"},
            "",
            "error: bad setting MINDER_LOG_LEVEL='LOUD': unknown log level: expected DEBUG, "
            "INFO, WARNING, ERROR, CRITICAL",
        ),
        (
            {"MINDER_API__PORTT": "1"},
            "",
            "error: unknown setting MINDER_API__PORTT='1': not a Minder variable, did you mean "
            "MINDER_API__PORT?",
        ),
        (
            {"MINDER_LOG__FORMAT": "xml"},
            "",
            "error: bad setting MINDER_LOG__FORMAT='xml': input should be 'auto', 'rich', "
            "'plain' or 'json'",
        ),
        (
            {"MINDER_DETECTION__DENOISER": "lstm_vae"},
            "torch",
            "error: bad setting MINDER_DETECTION__DENOISER='lstm_vae': the LSTM-VAE denoiser "
            "needs the Python package 'torch', not installed: pip install 'minder[deep]'",
        ),
        (
            {"MINDER_DETECTION__HANG_OWN_PAUSE_FACTOR": "0.5"},
            "",
            "error: bad setting MINDER_DETECTION__HANG_OWN_PAUSE_FACTOR='0.5': expected 0 (off) "
            "or a factor of 1 to 100",
        ),
        (
            {"MINDER_DETECTION__METHOD": "best"},
            "",
            "error: bad setting MINDER_DETECTION__METHOD='best': unknown method: expected one of "
            "minder, pairwise,",
        ),
    ],
)
def test_each_bad_start_is_one_line_naming_variable_value_and_what_is_allowed(
    env: dict[str, str], without: str, expected: str
) -> None:
    status, lines = _serve(env, without)
    assert status == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(expected), lines[0]
    assert "s3cret" not in lines[0]


def test_the_hang_setting_reaches_the_jobs_hang_detector() -> None:
    for factor in (0.0, 1.5):
        detector = DetectionSettings(hang_own_pause_factor=factor).detector_factory()()
        [hang] = [p for p in detector.parts if isinstance(p, HangDetector)]
        assert hang.config.own_pause_factor == factor


def test_every_unknown_variable_is_named_in_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("MINDER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MINDER_KAFKA__BOOTSTRAPP", "broker:9092")
    monkeypatch.setenv("MINDER_WEBHOK__URLS", "[]")
    monkeypatch.setenv("MINDER_XYZZY", "1")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    message = str(caught.value)
    assert "\n" not in message
    assert "MINDER_KAFKA__BOOTSTRAPP='broker:9092': not a Minder variable, did you mean " in (
        message
    )
    assert "did you mean MINDER_KAFKA__BOOTSTRAP?" in message
    assert (
        "MINDER_WEBHOK__URLS='[]': not a Minder variable, did you mean MINDER_WEBHOOK__URLS?"
        in (message)
    )
    assert "MINDER_XYZZY='1': not a Minder variable, see docs/operations.md, Settings" in message


def test_variables_minder_documents_beside_the_settings_are_neither_refused_nor_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [n for n in os.environ if n.upper().startswith("MINDER_")]:
        monkeypatch.delenv(name)
    # the agent's environment file (deploy/systemd/minder-agent.env), as systemd passes it
    monkeypatch.setenv("MINDER_KAFKA", "kafka.example.internal:9092")
    monkeypatch.setenv("MINDER_JOB", "partition-gpu-a")
    monkeypatch.setenv("MINDER_LABEL_RACK", "r12")
    monkeypatch.setenv("MINDER_METRICS_PORT", "9478")
    monkeypatch.setenv("MINDER_API_TOKEN", "t")
    monkeypatch.setenv("MINDER_ACTIONS__ACT_ON__RULE", "5")  # one key of a dict setting
    monkeypatch.setenv("minder_api__port", "8181")  # pydantic-settings ignores the case
    settings = Settings.load()
    assert settings.kafka.bootstrap == "127.0.0.1:9092"  # MINDER_KAFKA is not the section
    assert settings.actions.act_on["rule"] == 5.0
    assert settings.api.port == 8181


def test_documented_variables_are_settings_or_known_others() -> None:
    """A ``MINDER_*`` name in the README, docs/ or deploy/ that the start-up check would refuse:
    document it in ``minder.config.OTHER_VARIABLES`` or fix the name. (Docker build arguments
    never reach the service; the docs' example of a refused typo is one.)"""
    known = set(setting_variables())
    build_args = set(
        re.findall(r"^ARG (MINDER_\w+)", (ROOT / "deploy/Dockerfile").read_text(), re.M)
    )
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "deploy").rglob("*")]
    unknown = set()
    for path in [f for f in files if f.is_file()]:
        for line in path.read_text(errors="replace").splitlines():
            if "not a Minder variable" in line:
                continue
            for name in re.findall(r"MINDER_[A-Z0-9_]*[A-Z0-9]", line):
                if name in build_args or name + "_" in OTHER_PREFIXES:  # MINDER_LABEL_<KEY>
                    continue
                if any(v.startswith(name + "__") for v in known):  # a section: MINDER_API__*
                    continue
                if unknown_variables({name: "x"}) is not None:
                    unknown.add(f"{name} ({path.relative_to(ROOT)})")
    assert not unknown, sorted(unknown)


def test_install_hints_name_the_extra_that_carries_a_package() -> None:
    assert install_hint("kubernetes") == "pip install 'minder[kubernetes]'"
    # a core dependency missing from a broken environment is named as one, not as an extra
    assert install_hint("tenacity") == "pip install 'tenacity' (a dependency of minder)"
    assert install_hint("torch") == "pip install 'minder[deep]'"
    assert install_hint("no-such-package-of-minder") == "pip install 'no-such-package-of-minder'"


def test_supported_database_urls_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("MINDER_")]:
        monkeypatch.delenv(name)
    for url in (
        "sqlite:///minder.db",
        "sqlite+pysqlite:///:memory:",
        "postgresql://u@h/db",
        "postgres://u@h/db",
        "postgresql+psycopg://u:p@h:5432/db",
    ):
        monkeypatch.setenv("MINDER_DATABASE__URL", url)
        assert Settings.load().database.url == url
    monkeypatch.setenv("MINDER_DATABASE__URL", "minder.db")
    with pytest.raises(SettingsError, match="not a database URL: expected sqlite:///PATH"):
        Settings.load()


def test_kubernetes_service_links_are_not_refused() -> None:
    """A Service named ``minder`` (or ``minder-*``) puts these in every pod of its namespace."""
    links = {
        "MINDER_SERVICE_HOST": "10.0.0.7",
        "MINDER_SERVICE_PORT": "8080",
        "MINDER_SERVICE_PORT_HTTP": "8080",
        "MINDER_PORT": "tcp://10.0.0.7:8080",
        "MINDER_PORT_8080_TCP": "tcp://10.0.0.7:8080",
        "MINDER_PORT_8080_TCP_PROTO": "tcp",
        "MINDER_PORT_8080_TCP_PORT": "8080",
        "MINDER_PORT_8080_TCP_ADDR": "10.0.0.7",
        "MINDER_API_SERVICE_HOST": "10.0.0.8",
    }
    assert unknown_variables(links) is None
    typo = unknown_variables({**links, "MINDER_API__PORTT": "1"})
    assert typo is not None and "MINDER_API__PORTT" in typo and "MINDER_PORT" not in typo
