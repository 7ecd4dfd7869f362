"""``minder serve``: the detection service and its HTTP API."""

from __future__ import annotations

import contextlib
import signal
import threading
from enum import StrEnum
from types import FrameType
from typing import Annotated

import typer

from minder.cli.common import (
    KafkaCaFileOption,
    KafkaCertFileOption,
    KafkaFlags,
    KafkaKeyFileOption,
    KafkaSaslMechanismOption,
    KafkaSaslPasswordFileOption,
    KafkaSaslUsernameOption,
    KafkaSecurityProtocolOption,
    fail,
    load_settings_with_kafka,
    status,
)


class SourceChoice(StrEnum):
    """Where ``minder serve`` reads metrics from: :data:`minder.service.source.SOURCES` written
    out, so that --help need not import it (tests/minder/cli/test_cli_imports.py checks that they
    agree)."""

    kafka = "kafka"
    prometheus = "prometheus"
    both = "both"


def serve_command(
    embedded_broker: Annotated[
        bool,
        typer.Option(
            "--embedded-broker",
            help="start a Kafka-protocol broker (Tansu, in memory) in this process for a "
            "one-machine trial; agents and `minder simulate --kafka` connect to its address",
        ),
    ] = False,
    broker_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="with --embedded-broker: its port on 127.0.0.1; 0 picks a free one (printed)",
        ),
    ] = 9092,
    host: Annotated[
        str | None, typer.Option(help="API address (default MINDER_API__HOST, 127.0.0.1)")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="API port (default MINDER_API__PORT, 8080)"),
    ] = None,
    source: Annotated[
        SourceChoice | None,
        typer.Option(
            help="metrics from the agents over Kafka, from Prometheus (MINDER_PROMETHEUS__URL: "
            "dcgm-exporter, node_exporter), or both; default kafka, or prometheus when "
            "MINDER_PROMETHEUS__URL is set and MINDER_KAFKA__BOOTSTRAP is not",
            show_default=False,
        ),
    ] = None,
    kafka_security_protocol: KafkaSecurityProtocolOption = None,
    kafka_ca_file: KafkaCaFileOption = None,
    kafka_cert_file: KafkaCertFileOption = None,
    kafka_key_file: KafkaKeyFileOption = None,
    kafka_sasl_mechanism: KafkaSaslMechanismOption = None,
    kafka_sasl_username: KafkaSaslUsernameOption = None,
    kafka_sasl_password_file: KafkaSaslPasswordFileOption = None,
) -> None:
    """Run the detection service and its HTTP API (settings from MINDER_* variables).

    It needs a Kafka broker (MINDER_KAFKA__BOOTSTRAP, default 127.0.0.1:9092): the agents' metrics
    come from it, and alerts are published on it whatever the source; without one it stops at
    once and says so. For a trial on one machine, --embedded-broker starts one. With --source
    prometheus the metrics come from MINDER_PROMETHEUS__URL instead, polled every
    MINDER_PROMETHEUS__STEP_S seconds. SIGTERM and Ctrl-C stop it cleanly. Kafka with TLS or
    SASL: the --kafka-* options or MINDER_KAFKA__* variables (docs/operations.md, Kafka
    security); the SASL password only from MINDER_KAFKA__SASL_PASSWORD or a password file.
    """
    from minder.core.errors import MinderError  # noqa: PLC0415
    from minder.logging_setup import configure_logging  # noqa: PLC0415

    flags = KafkaFlags(
        security_protocol=kafka_security_protocol,
        ca_file=kafka_ca_file,
        cert_file=kafka_cert_file,
        key_file=kafka_key_file,
        sasl_mechanism=kafka_sasl_mechanism,
        sasl_username=kafka_sasl_username,
        sasl_password_file=kafka_sasl_password_file,
    )
    settings = load_settings_with_kafka(flags)
    if embedded_broker and settings.kafka.security_protocol != "PLAINTEXT":
        raise fail(
            f"--embedded-broker with Kafka security protocol {settings.kafka.security_protocol}: "
            "expected PLAINTEXT (the embedded broker has no TLS or SASL); drop the --kafka-* "
            "options and MINDER_KAFKA__SECURITY_PROTOCOL"
        )
    if host is not None:
        settings.api.host = host
    if port is not None:
        settings.api.port = port
    configure_logging(settings.log_level, settings.log.format)
    from minder.service.source import resolve_source  # noqa: PLC0415

    source = SourceChoice(resolve_source(settings, None if source is None else source.value))
    use_kafka = source is not SourceChoice.prometheus
    if source is not SourceChoice.kafka and settings.prometheus.url is None:
        raise fail(
            f"--source {source.value} needs MINDER_PROMETHEUS__URL: expected the Prometheus "
            "server's base URL, e.g. http://prometheus:9090"
        )
    if use_kafka:  # a missing or bad key file first: it is the operator's to fix
        from minder.core.signing import service_cluster_keys  # noqa: PLC0415

        try:
            service_cluster_keys(settings.auth.keys_file, required=settings.auth.mode == "required")
        except MinderError as exc:
            raise fail(exc) from None
    publish = settings.kafka.publish_alerts
    needs_broker = use_kafka or bool(publish)
    if not embedded_broker and needs_broker:
        # Before importing the service (seconds): a missing broker is said in one line at once.
        from minder.stream.topics import check_reachable  # noqa: PLC0415

        try:
            check_reachable(settings.kafka.bootstrap)
        except MinderError as exc:
            raise fail(exc) from None
    from minder.service.stack import Stack, build_stack  # noqa: PLC0415

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(signal.signal, signal.SIGTERM, previous)
        try:
            if embedded_broker:
                from minder.stream.broker import EmbeddedBroker  # noqa: PLC0415

                broker = cleanup.enter_context(EmbeddedBroker(port=broker_port or None))
                settings.kafka.bootstrap = broker.bootstrap
                status(f"embedded Kafka broker (Tansu, in memory) on {broker.bootstrap}")
            stack: Stack = build_stack(settings, source=source.value)
            cleanup.callback(stack.stop)
            stack.start()
        except MinderError as exc:
            raise fail(exc) from None
        kafka_line = f"Kafka {settings.kafka.bootstrap} ({settings.kafka.describe_security()}"
        inputs = (
            [kafka_line + (")" if use_kafka else ", alerts)")]
            if needs_broker or embedded_broker
            else []
        )
        if source is not SourceChoice.kafka:
            inputs.append(
                f"metrics from Prometheus {settings.prometheus.url} every "
                f"{settings.prometheus.step_s:g} s"
            )
        status(
            f"Minder is serving on {stack.api_url} (API /api/v1, docs /docs, metrics /metrics, "
            f"{', '.join(inputs)}; {settings.api.describe_access()}); Ctrl-C or SIGTERM stops it"
        )
        try:
            while not stop.wait(0.5):
                # The API thread ended (out of files, a crash of its loop): exit non-zero so
                # that systemd (Restart=on-failure) or Kubernetes starts the service again.
                if (failure := stack.api_failure()) is not None:
                    raise fail(f"the API stopped serving ({failure}); exiting so that it restarts")
        except KeyboardInterrupt:
            pass
        status("stopping")
