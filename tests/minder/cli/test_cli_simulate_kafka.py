"""``minder simulate --kafka`` with the Kafka security options, and plaintext against the real
embedded broker."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from minder.cli import app

runner = CliRunner()

TINY = {
    "seed": 5,
    "duration_s": 6,
    "jobs": [{"name": "tiny", "machines": 4, "machines_per_domain": 4, "step_time_s": 2.0}],
}
SECRET = "simulate-secret-not-for-output"
BATCHES = 4 * 6  # one per machine and second


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def _env(**extra: str) -> dict[str, str]:
    cleared = {k: "" for k in os.environ if k.startswith("MINDER_")}
    return {**cleared, "COLUMNS": "400", **extra}


def _record_clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Replace kafka-python's producer and admin client where minder.stream imports them by
    recorders of their keyword arguments (a fake: no TLS/SASL broker runs here); the producer
    acknowledges every send at once."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import minder.stream.producer as producer_module
        import minder.stream.topics as topics_module
    made: list[tuple[str, dict[str, Any]]] = []

    class Acknowledged:
        def add_callback(self, callback: Any, *args: Any) -> Acknowledged:
            callback(*args, None)
            return self

        def add_errback(self, errback: Any, *args: Any) -> Acknowledged:
            return self

    class Producer:
        def __init__(self, **config: Any) -> None:
            made.append(("producer", config))
            self.sent = 0

        def send(self, *args: Any, **kwargs: Any) -> Acknowledged:
            self.sent += 1
            return Acknowledged()

        def flush(self, *args: Any, **kwargs: Any) -> None:
            return None

        def close(self, *args: Any, **kwargs: Any) -> None:
            return None

    class Admin:
        def __init__(self, **config: Any) -> None:
            made.append(("admin", config))

        def list_topics(self) -> list[str]:
            return []

        def create_topics(self, *args: Any, **kwargs: Any) -> None:
            return None

        def close(self) -> None:
            return None

    monkeypatch.setattr(producer_module, "KafkaProducer", Producer)
    monkeypatch.setattr(topics_module, "KafkaAdminClient", Admin)
    return made


def test_kafka_options_reach_the_admin_client_and_the_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _record_clients(monkeypatch)
    password_file = tmp_path / "password"
    password_file.write_text(SECRET)
    result = runner.invoke(
        app,
        [
            "simulate",
            str(_scenario(tmp_path)),
            "--kafka",
            "kafka-1:9096",
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-512",
            "--kafka-sasl-username",
            "simulator",
            "--kafka-sasl-password-file",
            str(password_file),
        ],
        env=_env(MINDER_KAFKA__SSL_CHECK_HOSTNAME="false"),
    )
    assert result.exit_code == 0, result.output
    assert f"published {BATCHES} batches to kafka-1:9096" in result.stdout
    assert [kind for kind, _ in made] == ["admin", "producer"]
    for _, config in made:
        assert config["bootstrap_servers"] == "kafka-1:9096"
        assert config["security_protocol"] == "SASL_SSL"
        assert config["sasl_mechanism"] == "SCRAM-SHA-512"
        assert config["sasl_plain_username"] == "simulator"
        assert config["sasl_plain_password"] == SECRET
        assert config["ssl_check_hostname"] is False  # the variable still counts
        assert config["ssl_cafile"] is None  # the system's CAs
    assert SECRET not in result.output


def test_kafka_options_without_kafka_are_refused(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["simulate", "demo", "-o", str(tmp_path / "t.parquet"), "--kafka-ca-file", "ca.pem"],
        env=_env(),
    )
    assert result.exit_code == 2
    assert "--kafka-ca-file without --kafka: expected --kafka BOOTSTRAP too" in result.stderr
    assert not (tmp_path / "t.parquet").exists()


def test_a_bad_kafka_option_is_refused_before_simulating(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "simulate",
            str(_scenario(tmp_path)),
            "-o",
            str(tmp_path / "t.parquet"),
            "--kafka",
            "127.0.0.1:1",
            "--kafka-security-protocol",
            "SASL_PLAINTEXT",
        ],
        env=_env(MINDER_KAFKA__SASL_PASSWORD=SECRET),
    )
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "MINDER_KAFKA__SASL_MECHANISM='None': missing" in lines[0]
    assert SECRET not in result.output
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.kafka
@pytest.mark.slow
def test_plaintext_publishes_to_the_real_embedded_broker(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from minder.core.records import METRICS_TOPIC
        from minder.stream import EmbeddedBroker

    try:
        broker = EmbeddedBroker().start()
    except Exception as exc:
        pytest.skip(f"no embedded broker: {exc}")
    try:
        result = runner.invoke(
            app,
            [
                "simulate",
                str(_scenario(tmp_path)),
                "--kafka",
                broker.bootstrap,
                "--kafka-security-protocol",
                "plaintext",
            ],
            env=_env(),
        )
        assert result.exit_code == 0, result.output
        assert f"published {BATCHES} batches to {broker.bootstrap}" in result.stdout
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka import KafkaConsumer, TopicPartition
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        try:
            partitions = consumer.partitions_for_topic(METRICS_TOPIC) or set()
            consumer.assign([TopicPartition(METRICS_TOPIC, p) for p in partitions])
            consumer.seek_to_beginning()
            received = 0
            deadline = time.monotonic() + 15
            while received < BATCHES and time.monotonic() < deadline:
                received += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        finally:
            consumer.close()
        assert len(partitions) == 4  # created by simulate with MINDER_KAFKA__PARTITIONS
        assert received == BATCHES
    finally:
        broker.close()
