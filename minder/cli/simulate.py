"""``minder simulate``: a simulated cluster into a metric table or onto Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
    err,
    fail,
    load_scenario,
    load_settings_with_kafka,
    out,
    progress,
)

if TYPE_CHECKING:
    from collectors.sim.scenario import Scenario
    from minder.config import KafkaSettings


def simulate_command(
    scenario_file: Annotated[
        str, typer.Argument(help="scenario YAML, or the name of a bundled one (e.g. 'demo')")
    ],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="write the canonical table here")
    ] = None,
    labels: Annotated[
        Path | None, typer.Option(help="write the ground truth (job, machine, start/end, fault)")
    ] = None,
    kafka: Annotated[
        str | None, typer.Option(help="publish batches to this Kafka bootstrap instead")
    ] = None,
    realtime: Annotated[
        bool, typer.Option(help="with --kafka: publish at wall-clock pace, timestamps from now")
    ] = False,
    kafka_security_protocol: KafkaSecurityProtocolOption = None,
    kafka_ca_file: KafkaCaFileOption = None,
    kafka_cert_file: KafkaCertFileOption = None,
    kafka_key_file: KafkaKeyFileOption = None,
    kafka_sasl_mechanism: KafkaSaslMechanismOption = None,
    kafka_sasl_username: KafkaSaslUsernameOption = None,
    kafka_sasl_password_file: KafkaSaslPasswordFileOption = None,
    keys_file: Annotated[
        Path | None,
        typer.Option(
            help="with --kafka: sign each node's batches as its agent would, with node keys "
            "derived from this cluster key file (default: MINDER_AUTH__KEYS_FILE; none sends "
            "unsigned batches, which a service requiring signatures dead-letters)",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="with --kafka: serve the simulated machines' metrics as their agents would "
            "(minder_node_<metric>{job_id, machine, device}) on this port's /metrics, for "
            "Prometheus (0: a free port, printed)",
            show_default=False,
        ),
    ] = None,
    metrics_addr: Annotated[
        str,
        typer.Option(
            help="with --metrics-port: the address /metrics listens on (0.0.0.0 to let a "
            "remote Prometheus scrape)"
        ),
    ] = "127.0.0.1",
) -> None:
    """Simulate a cluster from a scenario file: write the metric table or publish to Kafka.

    With --kafka, the connection (TLS, SASL) comes from the --kafka-* options and the
    MINDER_KAFKA__* variables; the SASL password only from MINDER_KAFKA__SASL_PASSWORD or
    --kafka-sasl-password-file.
    """
    from collectors.sim.labels import write_scenario_labels  # noqa: PLC0415
    from collectors.sim.output import write_scenario_table  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    flags = KafkaFlags(
        security_protocol=kafka_security_protocol,
        ca_file=kafka_ca_file,
        cert_file=kafka_cert_file,
        key_file=kafka_key_file,
        sasl_mechanism=kafka_sasl_mechanism,
        sasl_username=kafka_sasl_username,
        sasl_password_file=kafka_sasl_password_file,
    )
    if kafka is None and (flags.given() or keys_file is not None or metrics_port is not None):
        given = ", ".join(
            [
                *flags.given(),
                *(["--keys-file"] if keys_file is not None else []),
                *([f"--metrics-port {metrics_port}"] if metrics_port is not None else []),
            ]
        )
        raise fail(f"{given} without --kafka: expected --kafka BOOTSTRAP too")
    scenario = load_scenario(scenario_file)
    if output is None and kafka is None:
        raise fail("nothing to do: give -o FILE and/or --kafka BOOTSTRAP")
    settings = None
    if kafka is not None:  # checked before simulating: a bad option must not wait for that
        settings = load_settings_with_kafka(flags, bootstrap=kafka)
    try:
        if output is not None:
            with err.status(f"simulating {scenario.duration_s} s of {scenario.machines} machines"):
                path = write_scenario_table(scenario, output)
            out.print(f"wrote {path}")
        if labels is not None:
            out.print(f"wrote {write_scenario_labels(scenario, labels)}")
        if settings is not None:
            sent = _publish(
                scenario,
                settings.kafka,
                realtime,
                keys_file or settings.auth.keys_file,
                None if metrics_port is None else (metrics_addr, metrics_port),
            )
            out.print(f"published {sent} batches to {kafka}")
    except (MinderError, OSError) as exc:
        raise fail(exc) from None


def _publish(
    scenario: Scenario,
    kafka: KafkaSettings,
    realtime: bool,
    keys_file: Path | None,
    metrics: tuple[str, int] | None = None,
) -> int:
    """:func:`minder.stream.simulation.publish_scenario`, with its warning, the metrics URL and
    a progress bar printed."""
    from minder.stream.simulation import publish_scenario  # noqa: PLC0415

    def unsigned() -> None:
        err.print(
            "warning: publishing UNSIGNED batches (no --keys-file or MINDER_AUTH__KEYS_FILE): a "
            "service that requires signatures (the default) dead-letters them"
        )

    def metrics_url(url: str) -> None:
        out.print(f"metrics of the simulated machines: {url}")

    bar = progress()
    task = bar.add_task("publishing", total=scenario.duration_s)
    try:
        return publish_scenario(
            scenario,
            kafka,
            realtime,
            keys_file,
            metrics,
            on_unsigned=unsigned,
            on_metrics_url=metrics_url,
            on_start=bar.start,
            on_second=lambda: bar.advance(task),
        )
    finally:
        bar.stop()
