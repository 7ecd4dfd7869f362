"""How the service assembly wires the self-checks: one clear start-up error when they cannot
run, and otherwise the service on the actions' scheduler, woken by its drains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fake_launcher import FakeScheduler, Run
from prometheus_client import CollectorRegistry

from minder.actions.slurm_selfcheck import SlurmSelfCheckLauncher
from minder.config import ActionSettings, SelfCheckSettings, Settings, SettingsError
from minder.core.errors import MinderError
from minder.service.delivery import build_delivery
from minder.service.stack import build_selfchecks, selfcheck_wake_of
from minder.storage import SessionFactory, create_engine_for, session_factory, upgrade_database


@pytest.fixture
def sessions(tmp_path: Path) -> SessionFactory:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'minder.db'}")
    upgrade_database(engine)
    return session_factory(engine)


def _settings(monkeypatch: pytest.MonkeyPatch, **actions: object) -> Settings:
    for name in [n for n in os.environ if n.upper().startswith("MINDER_")]:
        monkeypatch.delenv(name)
    return Settings(
        actions=ActionSettings(**actions),
        selfcheck=SelfCheckSettings(enabled=True, report_url="http://minder:8080", partners=2),
    )


def _fake() -> FakeScheduler:
    return FakeScheduler(["n1", "n2"], runner=lambda launch: Run(hang=True), post=print)


def test_without_a_scheduler_target_the_start_fails_naming_the_setting(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(monkeypatch)
    delivery = build_delivery(settings, sessions, CollectorRegistry(), kafka_alerts=False)
    with pytest.raises(MinderError, match="without a scheduler target: set MINDER_ACTIONS__TARGET"):
        build_selfchecks(settings, sessions, delivery, CollectorRegistry())


def test_a_target_that_cannot_run_checks_fails_the_start(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(monkeypatch)
    delivery = build_delivery(settings, sessions, CollectorRegistry(), actuator=_fake(),
                              kafka_alerts=False)  # fmt: skip
    with pytest.raises(MinderError, match=r"actions target 'slurm' .* cannot run them"):
        build_selfchecks(settings, sessions, delivery, CollectorRegistry())


def test_the_service_runs_on_the_actions_scheduler_and_its_policy(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(monkeypatch, enforce=True, act_on={"rule": 0, "hang": 0})
    fake = _fake()
    registry = CollectorRegistry()
    delivery = build_delivery(settings, sessions, registry, actuator=fake, kafka_alerts=False)
    service = build_selfchecks(settings, sessions, delivery, registry, launcher=fake)
    assert service.launcher is fake and service.policy.enforce
    assert service.policy.kinds == {"rule", "hang"}  # the acting kinds by default
    assert service.policy.partners == 2 and service.policy.report_url == "http://minder:8080"
    assert delivery.executor is not None and delivery.executor.on_applied == service.wake
    assert registry.get_sample_value("minder_selfchecks_in_progress", {"target": "slurm"}) == 0


def test_slurm_gets_its_launcher(sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch, target="slurm")
    registry = CollectorRegistry()
    delivery = build_delivery(settings, sessions, registry, kafka_alerts=False)
    service = build_selfchecks(settings, sessions, delivery, registry)
    assert isinstance(service.launcher, SlurmSelfCheckLauncher)
    assert not service.policy.enforce  # MINDER_ACTIONS__ENFORCE is false: a dry run
    assert service.launcher.options.sbatch_args == ("--exclusive",)


def test_sbatch_args_reach_the_slurm_launcher(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settings(monkeypatch)
    monkeypatch.setenv("MINDER_ACTIONS__TARGET", "slurm")
    monkeypatch.setenv("MINDER_SELFCHECK__ENABLED", "true")
    monkeypatch.setenv("MINDER_SELFCHECK__REPORT_URL", "http://minder:8080")
    monkeypatch.setenv("MINDER_SELFCHECK__SBATCH_ARGS", '["--exclusive", "--gres=gpu:8"]')
    settings = Settings()
    registry = CollectorRegistry()
    delivery = build_delivery(settings, sessions, registry, kafka_alerts=False)
    service = build_selfchecks(settings, sessions, delivery, registry)
    assert isinstance(service.launcher, SlurmSelfCheckLauncher)
    assert service.launcher.options.sbatch_args == ("--exclusive", "--gres=gpu:8")


def test_selfcheck_settings_are_checked_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [n for n in os.environ if n.upper().startswith("MINDER_")]:
        monkeypatch.delenv(name)
    assert Settings.load().selfcheck.enabled is False  # nothing is checked unless turned on
    monkeypatch.setenv("MINDER_SELFCHECK__ENABLED", "true")
    with pytest.raises(SettingsError, match="without MINDER_SELFCHECK__REPORT_URL: expected"):
        Settings.load()
    monkeypatch.setenv("MINDER_SELFCHECK__REPORT_URL", "minder:8080")
    with pytest.raises(SettingsError, match="MINDER_SELFCHECK__REPORT_URL='minder:8080'"):
        Settings.load()
    monkeypatch.setenv("MINDER_SELFCHECK__REPORT_URL", "http://minder:8080")
    monkeypatch.setenv("MINDER_SELFCHECK__KINDS", '["rule", "suspicious_source"]')
    with pytest.raises(SettingsError, match="unknown kind 'suspicious_source'"):
        Settings.load()
    monkeypatch.setenv("MINDER_SELFCHECK__KINDS", '["rule"]')
    monkeypatch.setenv("MINDER_SELFCHECK__COMMAND", '["minder", ""]')
    with pytest.raises(SettingsError, match="MINDER_SELFCHECK__COMMAND=<a JSON value>: expected"):
        Settings.load()
    monkeypatch.delenv("MINDER_SELFCHECK__COMMAND")
    monkeypatch.setenv("MINDER_SELFCHECK__MAX_CONCURENT", "2")
    with pytest.raises(SettingsError, match="did you mean MINDER_SELFCHECK__MAX_CONCURRENT"):
        Settings.load()
    monkeypatch.delenv("MINDER_SELFCHECK__MAX_CONCURENT")
    # a checked node's own variables (one underscore) are no settings, and never refused
    monkeypatch.setenv("MINDER_SELFCHECK_NODES", "n7,n3")
    monkeypatch.setenv("MINDER_SELFCHECK_TOKEN", "t")
    monkeypatch.setenv("MINDER_SELFCHECK_BASELINE_H100_PCIE", "600")
    monkeypatch.setenv("MINDER_SELFCHECK__MAX_CONCURRENT", "7")
    loaded = Settings.load().selfcheck
    assert (loaded.enabled, loaded.kinds, loaded.max_concurrent) == (True, ["rule"], 7)


def test_the_api_is_woken_only_by_an_enforcing_service(
    sessions: SessionFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None: the API refuses an operator's request (nothing would launch it)
    assert selfcheck_wake_of(None) is None
    for enforce in (False, True):
        settings = _settings(monkeypatch, enforce=enforce)
        fake = _fake()
        registry = CollectorRegistry()
        delivery = build_delivery(settings, sessions, registry, actuator=fake, kafka_alerts=False)
        service = build_selfchecks(settings, sessions, delivery, registry, launcher=fake)
        assert selfcheck_wake_of(service) == (service.wake if enforce else None)
