"""``minder agent``: the per-node collector (registered by ``minder/cli/app.py``).

Parses the options, then calls :func:`minder.agent.assembly.collect_once` (``--once``: print one
batch, send nothing) or :func:`minder.agent.assembly.run_agent` (collect every interval, serve
``/metrics``, send the batches to Kafka through the on-disk spool; a clean stop sends a last
*goodbye* batch unless ``--no-goodbye``), and prints what it got. What the agent does is
documented there and in :mod:`minder.agent.runner`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from minder.cli.common import (
    KafkaCaFileOption,
    KafkaCertFileOption,
    KafkaFlags,
    KafkaKeyFileOption,
    KafkaSaslMechanismOption,
    KafkaSaslPasswordFileOption,
    KafkaSaslUsernameOption,
    KafkaSecurityProtocolOption,
    OutputFormat,
    err,
    fail,
    load_settings_with_kafka,
    out,
)
from minder.core.errors import ValidationError
from minder.core.wire import AGENT_FORMAT, WireFormat

if TYPE_CHECKING:  # the agent and its sources are imported when it runs, not for --help
    from minder.agent.assembly import Started
    from minder.core.records import NodeBatch

# The defaults of minder.agent.assembly, collectors.fr_watch and collectors.ethtool, written out
# so that --help need not import them (tests/minder/cli/test_cli_imports.py checks that they
# agree).
DEFAULT_SPOOL_MAX_BYTES = 256 * 2**20
DEFAULT_METRICS_PORT = 9478
DEFAULT_PROBE_ADDRESS = "127.0.0.1:9477"
DEFAULT_FR_POLL_S = 5.0
DEFAULT_ETHTOOL_TIMEOUT_S = 0.25


def agent_command(
    job: Annotated[
        str | None,
        typer.Option(help="job id (default: $MINDER_JOB, then $SLURM_JOB_ID)", show_default=False),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            help="node name (default: $MINDER_NODE, $SLURMD_NODENAME, $NODE_NAME, $MY_NODE_NAME, "
            "the host name)",
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            help="KEY=VALUE placement/role label, repeatable (e.g. group=pp3, domain=leaf-12); "
            "adds to $MINDER_LABEL_<KEY>",
            show_default=False,
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="collection interval, seconds")] = 1.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="collect one batch (after one priming interval, so rates exist), print it, "
            "send nothing",
        ),
    ] = False,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="--once output: table or json")
    ] = OutputFormat.table,
    kafka: Annotated[
        str | None,
        typer.Option(
            help="Kafka bootstrap host:port (default: settings, MINDER_KAFKA__BOOTSTRAP)",
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
    spool_dir: Annotated[
        Path | None,
        typer.Option(
            help="where unsent batches wait (default: $XDG_STATE_HOME/minder/agent-spool)",
            show_default=False,
        ),
    ] = None,
    spool_max_bytes: Annotated[
        int, typer.Option(help="spool bound; beyond it the oldest batches are dropped")
    ] = DEFAULT_SPOOL_MAX_BYTES,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            envvar="MINDER_AGENT_SIGNING_KEY",
            help="this node's key file (`minder keys node`); default: the systemd credential "
            "'minder-node-key'. Without one, batches go unsigned and a service that requires "
            "signatures dead-letters them",
            show_default=False,
        ),
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(help="port of the local Prometheus /metrics (0 = off)")
    ] = DEFAULT_METRICS_PORT,
    metrics_addr: Annotated[
        str,
        typer.Option(
            help="address /metrics listens on (0.0.0.0 to let a remote Prometheus scrape)"
        ),
    ] = "127.0.0.1",
    sysfs_root: Annotated[Path, typer.Option(help="root of sysfs (RDMA, netdevs)")] = Path("/sys"),
    ethtool_command: Annotated[
        str, typer.Option(help="command printing ethtool -S statistics ('off' to disable)")
    ] = "ethtool -S",
    ethtool_timeout: Annotated[
        float,
        typer.Option(
            help="deadline of the ethtool commands of one interval, seconds (a netdev whose "
            "command times out is retried with backoff)"
        ),
    ] = DEFAULT_ETHTOOL_TIMEOUT_S,
    dcgm_url: Annotated[
        str | None,
        typer.Option(help="scrape this dcgm-exporter /metrics URL instead of reading NVML"),
    ] = None,
    nccl_dir: Annotated[
        Path | None, typer.Option(help="NCCL Inspector output directory (off when not given)")
    ] = None,
    probe_address: Annotated[
        str, typer.Option(help="host:port of the step probe listener ('off' to disable)")
    ] = DEFAULT_PROBE_ADDRESS,
    no_nvml: Annotated[
        bool, typer.Option("--no-nvml", help="do not read the GPUs through NVML")
    ] = False,
    pfc_priority: Annotated[int, typer.Option(help="PFC priority of the RDMA traffic")] = 3,
    goodbye: Annotated[
        bool,
        typer.Option(
            "--goodbye/--no-goodbye",
            help="on a clean stop (SIGTERM, SIGINT) send a last batch saying the node leaves its "
            "job, so the service drops it instead of reporting it silent (it is back at its next "
            "batch); --no-goodbye makes every stop look like silence",
        ),
    ] = True,
    fr: Annotated[
        bool,
        typer.Option(
            "--fr/--no-fr",
            help="watch the node's PyTorch flight-recorder dumps and send a summary of each new "
            "one in the batches (the service names the ranks a hung job waits on)",
        ),
    ] = True,
    fr_prefix: Annotated[
        str | None,
        typer.Option(
            envvar="MINDER_AGENT_FR_PREFIX",
            help="path prefix of the dumps, DIRECTORY/NAME_PREFIX (the files are "
            "NAME_PREFIX<rank>): what the training processes have in TORCH_FR_DUMP_TEMP_FILE; "
            "default: that variable (or TORCH_NCCL_DEBUG_INFO_TEMP_FILE) in the agent's "
            "environment, else /tmp/nccl_trace_rank_",
            show_default=False,
        ),
    ] = None,
    fr_poll: Annotated[
        float, typer.Option(help="seconds between two looks at the dump directory")
    ] = DEFAULT_FR_POLL_S,
    wire_format: Annotated[
        WireFormat,
        typer.Option(
            help="encoding of the batches: packed (schema 2: layout id and float32 values) or, "
            "for detection services older than schema 2, msgpack or json (schema 1)"
        ),
    ] = AGENT_FORMAT,
) -> None:
    """Run the node agent: collect every interval, serve /metrics, send batches to Kafka.

    Kafka with TLS or SASL: the --kafka-* options or the MINDER_KAFKA__* variables
    (docs/operations.md, Kafka security); the SASL password comes from MINDER_KAFKA__SASL_PASSWORD
    or --kafka-sasl-password-file, never from the command line.
    """
    if not interval > 0:
        raise fail(f"--interval is {interval!r}: expected seconds > 0")
    if spool_max_bytes <= 0:
        raise fail(f"--spool-max-bytes is {spool_max_bytes!r}: expected bytes > 0")
    if not 0 <= metrics_port <= 65535:
        raise fail(f"--metrics-port is {metrics_port!r}: expected 0 (off) to 65535")
    if not 0 <= pfc_priority <= 7:
        raise fail(f"--pfc-priority is {pfc_priority!r}: expected 0 to 7")
    if not ethtool_timeout > 0:
        raise fail(f"--ethtool-timeout is {ethtool_timeout!r}: expected seconds > 0")
    if not 0 < fr_poll < math.inf:
        raise fail(f"--fr-poll is {fr_poll!r}: expected seconds > 0")
    from minder.agent.assembly import (  # noqa: PLC0415
        AgentOptions,
        SendOptions,
        collect_once,
        run_agent,
    )

    options = AgentOptions(
        job=job,
        node=node,
        labels=tuple(label or ()),
        interval_s=interval,
        sysfs_root=sysfs_root,
        ethtool_command=ethtool_command,
        ethtool_timeout_s=ethtool_timeout,
        dcgm_url=dcgm_url,
        nccl_dir=nccl_dir,
        probe_address=probe_address,
        nvml=not no_nvml,
        pfc_priority=pfc_priority,
        fr=fr,
        fr_prefix=fr_prefix,
        fr_poll_s=fr_poll,
        signing_key=signing_key,
    )
    if once:
        try:
            collected = collect_once(options)
        except ValidationError as exc:
            raise fail(exc) from None
        _print_batch(collected.batch, collected.problems, output_format)
        return
    flags = KafkaFlags(
        security_protocol=kafka_security_protocol,
        ca_file=kafka_ca_file,
        cert_file=kafka_cert_file,
        key_file=kafka_key_file,
        sasl_mechanism=kafka_sasl_mechanism,
        sasl_username=kafka_sasl_username,
        sasl_password_file=kafka_sasl_password_file,
    )
    # A bad MINDER_* variable or --kafka-* option: one line, secrets hidden.
    settings = load_settings_with_kafka(flags, bootstrap=kafka)
    sending = SendOptions(
        kafka=settings.kafka,
        spool_dir=spool_dir,
        spool_max_bytes=spool_max_bytes,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        goodbye=goodbye,
        wire_format=wire_format,
    )
    try:
        run_agent(options, sending, _print_started)
    except ValidationError as exc:
        raise fail(exc) from None


def _print_batch(
    batch: NodeBatch, problems: Mapping[tuple[str, str], int], output_format: OutputFormat
) -> None:
    if problems:
        listed = ", ".join(
            f"{source}/{reason}={n}" for (source, reason), n in sorted(problems.items())
        )
        err.print(f"source problems: {escape(listed)}")
    if output_format is OutputFormat.json:
        from minder.core.codec import batch_to_dict  # noqa: PLC0415

        sys.stdout.write(
            orjson.dumps(batch_to_dict(batch, columns=False), option=orjson.OPT_INDENT_2).decode()
            + "\n"
        )
        sys.stdout.flush()
        return
    out.print(batch_table(batch))


def batch_table(batch: NodeBatch) -> Table:
    """A readable table of one batch: metric, device, value (and the events below)."""
    labels = ", ".join(f"{k}={v}" for k, v in batch.labels.items()) or "no labels"
    table = Table(
        title=f"{batch.job} / {batch.node} ({labels})",
        caption=f"{len(batch.samples)} samples, {len(batch.events)} events, ts {batch.ts:.3f}",
    )
    table.add_column("metric")
    table.add_column("device")
    table.add_column("value", justify="right")
    for metric, device, value in batch.samples:
        table.add_row(metric, device or "-", f"{value:.6g}")
    for event in batch.events:
        code = "" if event.code is None else f" {event.code}"
        table.add_row(f"event {event.kind.value}{code}", event.device or "-", event.message)
    return table


def _print_started(started: Started) -> None:
    metrics_port = started.metrics_port
    err.print(
        f"minder agent {escape(started.job)}/{escape(started.node)}: "
        f"{', '.join(started.sources)} every {started.interval_s:g} s -> "
        f"{escape(started.bootstrap)} ({started.topic}, {escape(started.security)}); "
        f"spool {started.spool_dir}"
        + (f"; metrics :{metrics_port}/metrics" if metrics_port else "")
        + (
            f"; flight-recorder dumps {escape(started.fr_prefix)}<rank>"
            if started.fr_prefix is not None
            else "; no flight-recorder dumps"
        )
        + ("" if started.goodbye else "; no goodbye")
        + (
            f"; signed (key {started.signing_kid})"
            if started.signing_kid is not None
            else "; UNSIGNED (no --signing-key)"
        )
        + "; Ctrl-C stops"
    )
