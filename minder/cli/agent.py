"""``minder agent``: the per-node collector (registered by ``minder/cli/app.py``).

Collects one batch per interval from the node's sources (GPU via NVML or dcgm-exporter, RDMA
sysfs, ``ethtool -S`` PFC counters, host, NCCL Inspector, the step probe), serves the last batch
and the agent's own counters on ``/metrics``, and sends the batches to Kafka through a bounded
on-disk spool (:mod:`minder.agent_runner`). A clean stop (SIGTERM, SIGINT) sends a last
*goodbye* batch (a ``leave`` event: the node leaves its job on purpose) unless ``--no-goodbye``.
``--once`` prints one batch and sends nothing.

It also watches the node's PyTorch flight-recorder dumps (``--fr-prefix``, by default where the
training processes would write them: ``$TORCH_FR_DUMP_TEMP_FILE``, else
``/tmp/nccl_trace_rank_``) and sends a summary of each new one in its batches
(:mod:`collectors.fr_watch`); ``--no-fr`` turns that off.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.markup import escape
from rich.table import Table

from collectors.labels import discover_identity, parse_label
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
from minder.core.errors import MinderError, ValidationError
from minder.core.wire import AGENT_FORMAT, WireFormat

if TYPE_CHECKING:  # the agent and its sources are imported when it runs, not for --help
    from collectors.agent import Agent
    from collectors.base import Source
    from collectors.fr_watch import FrWatcher
    from minder.core.records import NodeBatch
    from minder.core.signing import Signer

logger = logging.getLogger(__name__)


DEFAULT_SPOOL_MAX_BYTES = 256 * 2**20
DEFAULT_METRICS_PORT = 9478
DEFAULT_PROBE_ADDRESS = "127.0.0.1:9477"


DEFAULT_FR_POLL_S = 5.0
"""collectors.fr_watch.DEFAULT_POLL_S, written out for --help (like the ethtool timeout)."""

DEFAULT_ETHTOOL_TIMEOUT_S = 0.25
"""collectors.ethtool.DEFAULT_TIMEOUT_S, written out so that --help need not import the
collectors (tests/minder/cli/test_cli_imports.py checks that they agree)."""


def default_spool_dir() -> Path:
    """``$XDG_STATE_HOME/minder/agent-spool`` (``~/.local/state/minder/agent-spool``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "minder" / "agent-spool"


def build_sources(
    *,
    sysfs_root: str | os.PathLike[str] = "/sys",
    ethtool_command: Sequence[str] | None = ("ethtool", "-S"),
    dcgm_url: str | None = None,
    nccl_dir: str | os.PathLike[str] | None = None,
    probe_address: str | None = DEFAULT_PROBE_ADDRESS,
    nvml: bool = True,
    pfc_priority: int = 3,
    ethtool_timeout_s: float | None = None,
) -> list[Source]:
    """Construct the node's sources, GPU first (it wins a duplicate ``(metric, device)``).

    Parameters
    ----------
    sysfs_root
        Root of ``/sys`` for the RDMA and ethtool sources (a captured tree in tests).
    ethtool_command
        Program and arguments that print ``ethtool -S``-style statistics for the netdev appended;
        None leaves the PFC source out.
    dcgm_url
        Scrape this dcgm-exporter instead of reading NVML.
    nccl_dir
        NCCL Inspector output directory; None leaves the NCCL source out.
    probe_address
        ``host:port`` the step probe listens on; None leaves it out.
    nvml
        Read the GPUs through NVML (when ``dcgm_url`` is not given).
    pfc_priority
        PFC priority whose pause counters are read.
    ethtool_timeout_s
        Deadline of the ethtool commands of one collect; None: the source's default.

    Raises
    ------
    ValidationError
        A source refused its settings or could not start (the message names the source).
    """
    # Imported here: each source module pulls its own dependencies (psutil, pynvml, sockets).
    from collectors.dcgm import DcgmSource  # noqa: PLC0415
    from collectors.ethtool import EthtoolSource  # noqa: PLC0415
    from collectors.host import HostSource  # noqa: PLC0415
    from collectors.nccl import NcclSource  # noqa: PLC0415
    from collectors.nvml import NvmlSource  # noqa: PLC0415
    from collectors.probe import ProbeSource  # noqa: PLC0415
    from collectors.rdma import RdmaSource  # noqa: PLC0415

    plan: list[tuple[str, Callable[[], Source]]] = []
    if dcgm_url:
        plan.append(("dcgm", lambda: DcgmSource(dcgm_url)))
    elif nvml:
        plan.append(("nvml", NvmlSource))
    plan.append(("rdma", lambda: RdmaSource(sysfs_root)))
    if ethtool_command:
        command = tuple(ethtool_command)
        timeout = DEFAULT_ETHTOOL_TIMEOUT_S if ethtool_timeout_s is None else ethtool_timeout_s
        plan.append(
            (
                "ethtool",
                lambda: EthtoolSource(
                    command, sysfs_root=sysfs_root, priority=pfc_priority, timeout_s=timeout
                ),
            )
        )
    plan.append(("host", HostSource))
    if nccl_dir is not None:
        plan.append(("nccl", lambda: NcclSource(nccl_dir)))
    if probe_address:
        plan.append(("probe", lambda: ProbeSource(probe_address)))
    sources: list[Source] = []
    for name, make in plan:
        try:
            sources.append(make())
        except (MinderError, ValueError, OSError) as exc:
            for built in sources:
                built.close()
            raise ValidationError(f"source {name} cannot start: {exc}") from exc
    return sources


def build_fr_watcher(prefix: str | None, node: str, poll_s: float = DEFAULT_FR_POLL_S) -> FrWatcher:
    """The flight-recorder watcher of ``minder agent``: dumps ``<prefix><rank>`` (default: the
    training processes' default, :func:`collectors.flight_recorder.dump_prefix_from_env`).

    Raises
    ------
    ValidationError
        ``prefix`` names no file prefix (it ends with ``/``) or ``poll_s`` is not positive.
    """
    from collectors.fr_watch import FrWatcher  # noqa: PLC0415

    return FrWatcher(prefix or None, node=node, poll_s=poll_s)


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
    from collectors.agent import Agent  # noqa: PLC0415

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
    try:
        overrides: dict[str, str] = dict(parse_label(text) for text in label or [])
        if job:
            overrides["job"] = job
        if node:
            overrides["node"] = node
        identity = discover_identity(os.environ, overrides)
        command = None if ethtool_command.strip().lower() == "off" else shlex.split(ethtool_command)
        from minder.core.signing import node_signer  # noqa: PLC0415

        signer = None if once else node_signer(signing_key, identity.node)
    except (ValidationError, ValueError) as exc:  # ValueError: shlex on unbalanced quotes
        raise fail(exc) from None
    try:
        sources = build_sources(
            sysfs_root=sysfs_root,
            ethtool_command=command,
            dcgm_url=dcgm_url,
            nccl_dir=nccl_dir,
            probe_address=None if probe_address.strip().lower() == "off" else probe_address,
            nvml=not no_nvml,
            pfc_priority=pfc_priority,
            ethtool_timeout_s=ethtool_timeout,
        )
    except ValidationError as exc:
        raise fail(exc) from None
    try:
        watcher = build_fr_watcher(fr_prefix, identity.node, fr_poll) if fr else None
    except ValidationError as exc:
        for source in sources:
            source.close()
        raise fail(exc) from None
    agent = Agent(
        sources,
        job=identity.job,
        node=identity.node,
        labels=identity.labels,
        interval_s=interval,
        # --once sends nothing: dumps are left for the agent that runs
        flight_recorder=None if once else watcher,
    )
    try:
        if once:
            _print_once(agent, interval, output_format)
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
        _run(agent, kafka, spool_dir or default_spool_dir(), spool_max_bytes, metrics_port,
             metrics_addr, goodbye=goodbye, flags=flags, fmt=wire_format,
             signer=signer)  # fmt: skip
    finally:
        agent.close()


def _print_once(agent: Agent, interval: float, output_format: OutputFormat) -> None:
    # Rates and counts need two readings: prime every counter, wait one interval, read again.
    agent.collect_once(time.time())
    time.sleep(interval)
    batch = agent.collect_once(time.time())
    problems = {k: v for k, v in agent.error_counts().items() if v}
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


def _run(
    agent: Agent,
    kafka: str | None,
    spool_dir: Path,
    spool_max_bytes: int,
    metrics_port: int,
    metrics_addr: str,
    *,
    goodbye: bool = True,
    flags: KafkaFlags | None = None,
    fmt: WireFormat = AGENT_FORMAT,
    signer: Signer | None = None,
) -> None:
    from collectors.agent import AgentExporter  # noqa: PLC0415
    from minder.agent_runner import AgentRunner  # noqa: PLC0415
    from minder.stream.agent_sender import KafkaRecordSender  # noqa: PLC0415
    from minder.stream.spool import Spool  # noqa: PLC0415

    # A bad MINDER_* variable or --kafka-* option: one line, secrets hidden.
    settings = load_settings_with_kafka(flags or KafkaFlags(), bootstrap=kafka)
    bootstrap = settings.kafka.bootstrap
    topic = settings.kafka.metrics_topic
    client_id = f"{settings.kafka.client_id}-agent"
    client_options = settings.kafka.client_options()
    try:
        spool = Spool(spool_dir, spool_max_bytes)
    except ValidationError as exc:  # names the directory or file
        raise fail(exc) from None
    except OSError as exc:
        raise fail(f"cannot open the spool {spool_dir}: {exc}") from None
    try:
        # settings check before the threads start
        KafkaRecordSender(bootstrap, topic=topic, client_options=client_options)
    except ValidationError as exc:
        spool.close()
        raise fail(exc) from None
    exporter = AgentExporter(agent)
    try:
        runner = AgentRunner(
            agent,
            spool,
            lambda: KafkaRecordSender(
                bootstrap,
                topic=topic,
                client_id=client_id,
                client_options=client_options,
                signer=signer,
            ),
            goodbye=goodbye,
            fmt=fmt,
        )
        exporter.set_sender(runner.sender_counters)
        if metrics_port:
            try:
                exporter.serve(metrics_port, metrics_addr)
            except OSError as exc:
                raise fail(
                    f"cannot serve /metrics on {metrics_addr}:{metrics_port}: {exc}"
                ) from None
        err.print(
            f"minder agent {escape(agent.job)}/{escape(agent.node)}: "
            f"{', '.join(s.name for s in agent.sources)} every {agent.interval_s:g} s -> "
            f"{escape(bootstrap)} ({topic}, {escape(settings.kafka.describe_security())}); "
            f"spool {spool_dir}"
            + (f"; metrics :{metrics_port}/metrics" if metrics_port else "")
            + (
                f"; flight-recorder dumps {escape(agent.flight_recorder.prefix)}<rank>"
                if agent.flight_recorder is not None
                else "; no flight-recorder dumps"
            )
            + ("" if goodbye else "; no goodbye")
            + (f"; signed (key {signer.key.kid})" if signer else "; UNSIGNED (no --signing-key)")
            + "; Ctrl-C stops"
        )
        runner.run()
    finally:
        exporter.shutdown()
        spool.close()
