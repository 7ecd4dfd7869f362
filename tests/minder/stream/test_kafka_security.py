"""Kafka with TLS and SASL: the settings, their checks, and how they reach every kafka-python client.

No TLS or SASL broker runs here (the embedded Tansu is plaintext only), so the constructors of the
kafka-python classes are replaced by recorders where a test needs to see their arguments; the
real classes still check the option names (``CONNECTION_OPTIONS`` comes from their defaults), and
a SASL client against the real plaintext broker shows the options reach the wire.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.errors import KafkaError, KafkaTimeoutError

import minder.stream.agent_sender as agent_sender_module
import minder.stream.consumer as consumer_module
import minder.stream.deadletter as deadletter_module
import minder.stream.producer as producer_module
import minder.stream.topics as topics_module
from minder.config import KafkaSettings, Settings, SettingsError
from minder.core.errors import BrokerError, ValidationError
from minder.core.records import NodeBatch
from minder.stream import (
    CONNECTION_OPTIONS,
    AlertPublisher,
    BatchConsumer,
    BatchProducer,
    EmbeddedBroker,
    JsonPublisher,
    check_reachable,
    ensure_topics,
    free_port,
    read_dead_letters,
)
from minder.stream.agent_sender import KafkaRecordSender

SECRET = "hunter2-not-for-logs"
KEY_PASSWORD = "key-pw-not-for-logs"


@pytest.fixture(autouse=True)
def _no_minder_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("MINDER_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed certificate (CA and client certificate at once) and its encrypted key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make test certificates")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "client.pem", directory / "client.key"
    request = (
        f"req -x509 -newkey rsa:2048 -days 1 -subj /CN=minder-test -passout pass:{KEY_PASSWORD}"
    )
    subprocess.run(
        [openssl, *request.split(), "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    not_pem = directory / "not.pem"
    not_pem.write_text("this is no certificate\n")
    return {"ca": cert, "cert": cert, "key": key, "not_pem": not_pem}


def _sasl_ssl_env(tls_files: dict[str, Path]) -> dict[str, str]:
    return {
        "MINDER_KAFKA__BOOTSTRAP": "kafka-1:9093,kafka-2:9093",
        "MINDER_KAFKA__SECURITY_PROTOCOL": "sasl_ssl",  # case does not matter
        "MINDER_KAFKA__SSL_CAFILE": str(tls_files["ca"]),
        "MINDER_KAFKA__SSL_CERTFILE": str(tls_files["cert"]),
        "MINDER_KAFKA__SSL_KEYFILE": str(tls_files["key"]),
        "MINDER_KAFKA__SSL_PASSWORD": KEY_PASSWORD,
        "MINDER_KAFKA__SASL_MECHANISM": "scram_sha_512",
        "MINDER_KAFKA__SASL_USERNAME": "minder-svc",
        "MINDER_KAFKA__SASL_PASSWORD": SECRET,
    }


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> KafkaSettings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings.load().kafka


# -- settings -----------------------------------------------------------------------------


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    assert KafkaSettings().client_options() == {"security_protocol": "PLAINTEXT"}
    assert KafkaSettings().describe_security() == "PLAINTEXT"


def test_sasl_ssl_from_the_environment_gives_kafka_python_keywords(
    monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Path]
) -> None:
    kafka = _load(monkeypatch, _sasl_ssl_env(tls_files))
    assert kafka.client_options() == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(tls_files["ca"]),
        "ssl_certfile": str(tls_files["cert"]),
        "ssl_keyfile": str(tls_files["key"]),
        "ssl_password": KEY_PASSWORD,
        "ssl_check_hostname": True,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "minder-svc",
        "sasl_plain_password": SECRET,
    }
    # Every key is a keyword that KafkaProducer, KafkaConsumer and KafkaAdminClient all take.
    assert set(kafka.client_options()) <= CONNECTION_OPTIONS
    shown = f"{kafka!r} {kafka.describe_security()}"
    assert SECRET not in shown and KEY_PASSWORD not in shown
    assert kafka.describe_security() == (
        "SASL_SSL, SCRAM-SHA-512 as 'minder-svc', client certificate"
    )


def test_sasl_plaintext_leaves_tls_out_and_ssl_leaves_sasl_out(
    monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Path]
) -> None:
    sasl = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=SECRET,
    )
    assert sasl.client_options() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": SECRET,
    }
    tls = _load(
        monkeypatch,
        {
            "MINDER_KAFKA__SECURITY_PROTOCOL": "SSL",
            "MINDER_KAFKA__SSL_CAFILE": str(tls_files["ca"]),
            "MINDER_KAFKA__SSL_CHECK_HOSTNAME": "false",
        },
    )
    assert tls.client_options() == {
        "security_protocol": "SSL",
        "ssl_cafile": str(tls_files["ca"]),
        "ssl_certfile": None,
        "ssl_keyfile": None,
        "ssl_password": None,
        "ssl_check_hostname": False,
    }
    assert tls.describe_security() == "SSL, hostname not checked"


BAD_SETTINGS = [
    (
        {"MINDER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"},
        [
            "MINDER_KAFKA__SASL_MECHANISM='None': missing: expected PLAIN, SCRAM-SHA-256 or "
            "SCRAM-SHA-512 with security protocol SASL_SSL",
            "MINDER_KAFKA__SASL_USERNAME='None': missing",
            "MINDER_KAFKA__SASL_PASSWORD=<hidden>: missing",
        ],
    ),
    (
        {
            "MINDER_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "MINDER_KAFKA__SASL_MECHANISM": "PLAIN",
            "MINDER_KAFKA__SASL_USERNAME": "u",
        },
        ["MINDER_KAFKA__SASL_PASSWORD=<hidden>: missing: expected the SASL password"],
    ),
    (
        {"MINDER_KAFKA__SASL_MECHANISM": "SCRAM-SHA-256", "MINDER_KAFKA__SASL_PASSWORD": SECRET},
        [
            "MINDER_KAFKA__SASL_MECHANISM='SCRAM-SHA-256': expected no SASL setting with "
            "security protocol PLAINTEXT",
            "MINDER_KAFKA__SASL_PASSWORD=<hidden>: expected no SASL setting",
        ],
    ),
    (
        {"MINDER_KAFKA__SECURITY_PROTOCOL": "TLS"},
        [
            "MINDER_KAFKA__SECURITY_PROTOCOL='TLS': input should be 'PLAINTEXT', 'SSL', "
            "'SASL_PLAINTEXT' or 'SASL_SSL'"
        ],
    ),
    (
        {
            "MINDER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
            "MINDER_KAFKA__SASL_MECHANISM": "GSSAPI",
            "MINDER_KAFKA__SASL_USERNAME": "u",
            "MINDER_KAFKA__SASL_PASSWORD": SECRET,
        },
        ["MINDER_KAFKA__SASL_MECHANISM='GSSAPI': input should be 'PLAIN'"],
    ),
    (
        {"MINDER_KAFKA__SECURITY_PROTOCOL": "SSL", "MINDER_KAFKA__SSL_CAFILE": "/nonexistent.pem"},
        [
            "MINDER_KAFKA__SSL_CAFILE='/nonexistent.pem': does not exist or is not readable: "
            "expected a readable PEM file"
        ],
    ),
]


@pytest.mark.parametrize(("env", "expected"), BAD_SETTINGS)
def test_bad_security_settings_are_one_line_naming_value_and_expectation(
    env: dict[str, str], expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SettingsError) as raised:
        _load(monkeypatch, env)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("bad setting ")
    for fragment in expected:
        assert fragment in message
    assert SECRET not in message


def test_tls_files_are_checked_for_what_they_hold(
    monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Path]
) -> None:
    ssl = {"MINDER_KAFKA__SECURITY_PROTOCOL": "SSL"}
    cases = [
        (
            {"MINDER_KAFKA__SSL_CAFILE": str(tls_files["not_pem"])},
            f"MINDER_KAFKA__SSL_CAFILE='{tls_files['not_pem']}': cannot be loaded",
        ),
        (
            {  # an encrypted key and a wrong password: refused now, not at every connection
                "MINDER_KAFKA__SSL_CERTFILE": str(tls_files["cert"]),
                "MINDER_KAFKA__SSL_KEYFILE": str(tls_files["key"]),
                "MINDER_KAFKA__SSL_PASSWORD": SECRET,
            },
            f"MINDER_KAFKA__SSL_CERTFILE='{tls_files['cert']}': cannot be loaded",
        ),
        (
            {  # no password at all: OpenSSL would prompt on the terminal; refused instead
                "MINDER_KAFKA__SSL_CERTFILE": str(tls_files["cert"]),
                "MINDER_KAFKA__SSL_KEYFILE": str(tls_files["key"]),
            },
            "expected PEM client certificate with its key",
        ),
        (
            {"MINDER_KAFKA__SSL_KEYFILE": str(tls_files["key"])},
            "MINDER_KAFKA__SSL_CERTFILE='None': missing: expected the client certificate",
        ),
        (
            {"MINDER_KAFKA__SECURITY_PROTOCOL": "PLAINTEXT", "MINDER_KAFKA__SSL_CAFILE": "/x"},
            "MINDER_KAFKA__SSL_CAFILE='/x': expected no TLS setting with security protocol "
            "PLAINTEXT",
        ),
    ]
    for env, expected in cases:
        with monkeypatch.context() as scoped, pytest.raises(SettingsError) as raised:
            _load(scoped, {**ssl, **env})
        message = str(raised.value)
        assert expected in message and "\n" not in message, message
        assert SECRET not in message and KEY_PASSWORD not in message


# -- every client gets them ---------------------------------------------------------------


class _Recorder:
    """Replaces the kafka-python classes where minder.stream imports them and records the
    keyword arguments of each construction. A fake because no TLS/SASL broker can run here."""

    def __init__(self) -> None:
        self.made: list[tuple[str, dict[str, Any]]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        producer, consumer, admin = self.cls("producer"), self.cls("consumer"), self.cls("admin")
        for module in (producer_module, consumer_module, agent_sender_module):
            monkeypatch.setattr(module, "KafkaProducer", producer)
        for module in (consumer_module, deadletter_module):
            monkeypatch.setattr(module, "KafkaConsumer", consumer)
        monkeypatch.setattr(topics_module, "KafkaAdminClient", admin)

    def cls(self, kind: str) -> type:
        made = self.made

        class Client:
            def __init__(self, **config: Any) -> None:
                made.append((kind, config))

            def send(self, *args: Any, **kwargs: Any) -> None:
                raise KafkaTimeoutError("no broker in this test")

            def subscribe(self, *args: Any, **kwargs: Any) -> None:
                return None

            def list_topics(self) -> list[str]:
                return []

            def create_topics(self, *args: Any, **kwargs: Any) -> None:
                return None

            def partitions_for_topic(self, topic: str) -> None:
                return None

            def flush(self, *args: Any, **kwargs: Any) -> None:
                return None

            def close(self, *args: Any, **kwargs: Any) -> None:
                return None

        return Client


def test_the_settings_reach_every_kafka_python_client(
    monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Path]
) -> None:
    kafka = _load(monkeypatch, _sasl_ssl_env(tls_files))
    options = kafka.client_options()
    recorder = _Recorder()
    recorder.install(monkeypatch)

    BatchProducer.from_settings(kafka).close()  # the metrics producer (simulate, benches)
    AlertPublisher.from_settings(kafka).close()  # the alert publisher
    JsonPublisher(kafka.bootstrap, "t", client_options=options).close()
    BatchConsumer.from_settings(kafka).close()  # the worker's consumer and its dead letters
    sender = KafkaRecordSender(kafka.bootstrap, client_options=options)  # the node agent
    result = sender.send([("job", b"{}")], timeout_s=0.1)
    sender.close()
    ensure_topics(kafka.bootstrap, {"t": 1}, client_options=options)  # the admin client
    assert read_dead_letters(kafka.bootstrap, client_options=options) == []

    assert result.delivered == 0 and "no broker" in (result.error or "")
    kinds = [kind for kind, _ in recorder.made]
    assert kinds == [
        "producer",
        "producer",
        "producer",
        "consumer",
        "producer",
        "producer",
        "admin",
        "consumer",
    ]
    for kind, config in recorder.made:
        assert {k: config.get(k) for k in options} == options, kind
        assert config["bootstrap_servers"] == "kafka-1:9093,kafka-2:9093"
    dead_letter_producer = recorder.made[4][1]
    assert dead_letter_producer["client_id"] == "minder-deadletter"


def test_plaintext_settings_add_only_the_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = _Recorder()
    recorder.install(monkeypatch)
    BatchConsumer.from_settings(KafkaSettings()).close()
    for _, config in recorder.made:
        assert config["security_protocol"] == "PLAINTEXT"
        assert not any(k.startswith(("ssl_", "sasl_")) for k in config)


def test_client_options_take_only_connection_settings() -> None:
    # Refused before any connection: a producer setting would break the consumer.
    with pytest.raises(ValidationError, match=r"Kafka client options \['acks'\]"):
        BatchProducer("127.0.0.1:1", client_options={"acks": 0})
    with pytest.raises(ValidationError, match="group_id"):
        ensure_topics("127.0.0.1:1", {"t": 1}, client_options={"group_id": "g"})
    with pytest.raises(ValidationError, match="linger_ms"):
        BatchConsumer("127.0.0.1:1", client_options={"linger_ms": 1})
    with pytest.raises(ValidationError, match="acks"):
        KafkaRecordSender("127.0.0.1:1", client_options={"acks": 1})


def test_the_admin_client_log_hides_the_passwords(caplog: pytest.LogCaptureFixture) -> None:
    # The real KafkaAdminClient logs its whole configuration at DEBUG before connecting.
    options = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": SECRET,
    }
    caplog.set_level(logging.DEBUG, logger="kafka")
    with pytest.raises(BrokerError) as raised:
        ensure_topics(f"127.0.0.1:{free_port()}", {"t": 1}, timeout_s=0.3, client_options=options)
    assert "Starting KafkaAdminClient" in caplog.text
    assert "'sasl_plain_password': '<hidden>'" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(raised.value)


# -- reachability -------------------------------------------------------------------------


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections and never answers: a TLS or SASL listener, to a client
    that says nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


def test_reachability_is_a_tcp_connect_that_suits_any_listener(silent_listener: str) -> None:
    began = time.monotonic()
    check_reachable(silent_listener, timeout_s=2.0)  # no Kafka request: no TLS, no SASL needed
    assert time.monotonic() - began < 1.0
    closed = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError, match=closed):
        check_reachable(closed, timeout_s=1.0)


# -- against the real (plaintext) broker ----------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_plaintext_settings_work_end_to_end_and_sasl_reaches_the_wire(
    broker: EmbeddedBroker, make_batch: Any
) -> None:
    suffix = uuid.uuid4().hex[:8]
    kafka = KafkaSettings(
        bootstrap=broker.bootstrap,
        metrics_topic=f"sec.metrics.{suffix}",
        deadletter_topic=f"sec.deadletter.{suffix}",
        group_id=f"sec-{suffix}",
        session_timeout_ms=3000,
        heartbeat_interval_ms=500,
    )
    topics = {kafka.metrics_topic: 1, kafka.deadletter_topic: 1}
    # A SASL client speaks SaslHandshake first; the plaintext broker does not follow, so the
    # client cannot bootstrap: the options reach kafka-python's connection, not just its config.
    sasl = KafkaSettings(
        bootstrap=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password=SECRET,
    )
    with pytest.raises(BrokerError, match="cannot reach the Kafka brokers") as raised:
        ensure_topics(kafka.bootstrap, topics, timeout_s=1.5, client_options=sasl.client_options())
    assert SECRET not in str(raised.value)

    # The same calls in plaintext, built from the settings as the service builds them.
    assert ensure_topics(kafka.bootstrap, topics, client_options=kafka.client_options()) == sorted(
        topics
    )
    sent = make_batch("j-sec", "n1", 1_700_000_000.0)
    with BatchProducer.from_settings(kafka) as producer:
        producer.send(sent)
        producer.flush(10)
    received: list[NodeBatch] = []
    with BatchConsumer.from_settings(kafka) as consumer:
        deadline = time.monotonic() + 20
        while not received and time.monotonic() < deadline:
            consumer.poll_once(received.extend, timeout_ms=200)
    assert [(b.job, b.node, b.ts) for b in received] == [("j-sec", "n1", sent.ts)]


def test_an_unreachable_sasl_broker_is_a_broker_error_without_the_password() -> None:
    options = KafkaSettings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=SECRET,
    ).client_options()
    bootstrap = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerError) as raised:
        BatchProducer(bootstrap, bootstrap_timeout_ms=300, client_options=options)
    assert bootstrap in str(raised.value) and SECRET not in str(raised.value)
    assert isinstance(raised.value.__cause__, KafkaError)


# -- minder serve -------------------------------------------------------------------------


def test_serve_options_reach_the_settings_the_service_is_built_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls_files: dict[str, Path]
) -> None:
    import typer
    from typer.testing import CliRunner

    import minder.logging_setup
    import minder.service.source as source_module
    from minder.cli import app

    seen: list[Settings] = []

    def stop_here(settings: Settings, chosen: object) -> None:
        seen.append(settings)  # what build_stack would get
        raise typer.Exit(0)

    monkeypatch.setattr(minder.logging_setup, "configure_logging", lambda *_, **__: None)
    monkeypatch.setattr(source_module, "resolve_source", stop_here)
    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")
    monkeypatch.setenv("MINDER_KAFKA__SASL_USERNAME", "from-env")
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--kafka-security-protocol",
            "SASL_SSL",
            "--kafka-ca-file",
            str(tls_files["ca"]),
            "--kafka-cert-file",
            str(tls_files["cert"]),
            "--kafka-key-file",
            str(tls_files["key"]),
            "--kafka-sasl-mechanism",
            "SCRAM-SHA-256",
            "--kafka-sasl-password-file",
            str(password_file),
        ],
        env={"MINDER_KAFKA__SSL_PASSWORD": KEY_PASSWORD, "COLUMNS": "400"},
    )
    assert result.exit_code == 0, result.output
    assert seen[0].kafka.client_options() == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(tls_files["ca"]),
        "ssl_certfile": str(tls_files["cert"]),
        "ssl_keyfile": str(tls_files["key"]),
        "ssl_password": KEY_PASSWORD,
        "ssl_check_hostname": True,
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "from-env",
        "sasl_plain_password": SECRET,
    }
    assert SECRET not in result.output and KEY_PASSWORD not in result.output


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ["--embedded-broker", "--kafka-security-protocol", "SSL"],
            {},
            "--embedded-broker with Kafka security protocol SSL: expected PLAINTEXT",
        ),
        (
            ["--kafka-security-protocol", "SASL_SSL", "--kafka-sasl-mechanism", "PLAIN"],
            {"MINDER_KAFKA__SASL_PASSWORD": SECRET},
            "MINDER_KAFKA__SASL_USERNAME='None': missing",
        ),
        (
            ["--kafka-security-protocol", "SSL", "--kafka-key-file", "/nonexistent/key.pem"],
            {},
            "--kafka-key-file='/nonexistent/key.pem': does not exist",
        ),
        (
            ["--kafka-security-protocol", "SSL"],
            {"MINDER_KAFKA__SASL_PASSWORD": SECRET},
            "MINDER_KAFKA__SASL_PASSWORD=<hidden>: expected no SASL setting with security "
            "protocol SSL",
        ),
    ],
)
def test_bad_serve_options_are_one_line(
    args: list[str], env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from minder.cli import app

    result = CliRunner().invoke(app, ["serve", *args], env={**env, "COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0]
    assert SECRET not in result.output
