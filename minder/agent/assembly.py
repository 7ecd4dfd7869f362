"""The node agent built from its options, and its two ways to run: ``--once`` and for good.

:func:`collect_once` collects one batch (after one priming interval, so rates exist) and sends
nothing. :func:`run_agent` collects one batch per interval from the node's sources (GPU via NVML
or dcgm-exporter, RDMA sysfs, ``ethtool -S`` PFC counters, host, NCCL Inspector, the step probe),
serves the last batch and the agent's own counters on ``/metrics``, and sends the batches to
Kafka through a bounded on-disk spool (:mod:`minder.agent.runner`). A clean stop (SIGTERM,
SIGINT) sends a last *goodbye* batch (a ``leave`` event: the node leaves its job on purpose)
unless ``goodbye`` is off.

It also watches the node's PyTorch flight-recorder dumps (``fr_prefix``, by default where the
training processes would write them: ``$TORCH_FR_DUMP_TEMP_FILE``, else
``/tmp/nccl_trace_rank_``) and sends a summary of each new one in its batches
(:mod:`collectors.fr_watch`).

Every problem found before the agent runs (identity, options, a source that cannot start, the
spool, the Kafka settings, the ``/metrics`` port) is a :class:`~minder.core.errors.ValidationError`
that names it in one line.
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minder.core.errors import MinderError, ValidationError
from minder.core.wire import AGENT_FORMAT, WireFormat

if TYPE_CHECKING:  # the agent and its sources are imported when it runs
    from collectors.agent import Agent
    from collectors.base import Source
    from collectors.fr_watch import FrWatcher
    from minder.config import KafkaSettings
    from minder.core.records import NodeBatch
    from minder.core.signing import Signer

logger = logging.getLogger(__name__)

DEFAULT_SPOOL_MAX_BYTES = 256 * 2**20
DEFAULT_METRICS_PORT = 9478
DEFAULT_PROBE_ADDRESS = "127.0.0.1:9477"


def default_spool_dir() -> Path:
    """``$XDG_STATE_HOME/minder/agent-spool`` (``~/.local/state/minder/agent-spool``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "minder" / "agent-spool"


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """What the node's agent collects, and who it is (``minder agent``'s options).

    Attributes
    ----------
    job, node
        Override the discovered job id and node name (:func:`collectors.labels.discover_identity`).
    labels
        ``KEY=VALUE`` placement/role labels, over ``$MINDER_LABEL_<KEY>``.
    interval_s
        Collection interval.
    sysfs_root
        Root of ``/sys`` for the RDMA and ethtool sources.
    ethtool_command
        Command printing ``ethtool -S`` statistics, shell-quoted; ``off`` leaves the PFC source out.
    ethtool_timeout_s
        Deadline of the ethtool commands of one interval.
    dcgm_url
        Scrape this dcgm-exporter instead of reading NVML.
    nccl_dir
        NCCL Inspector output directory; None leaves the NCCL source out.
    probe_address
        ``host:port`` of the step probe listener; ``off`` leaves it out.
    nvml
        Read the GPUs through NVML (when ``dcgm_url`` is not given).
    pfc_priority
        PFC priority of the RDMA traffic.
    fr, fr_prefix, fr_poll_s
        Watch the flight-recorder dumps ``<fr_prefix><rank>`` every ``fr_poll_s`` seconds.
    signing_key
        This node's key file; None: the systemd credential, else batches go unsigned.
    """

    job: str | None = None
    node: str | None = None
    labels: Sequence[str] = ()
    interval_s: float = 1.0
    sysfs_root: Path = Path("/sys")
    ethtool_command: str = "ethtool -S"
    ethtool_timeout_s: float | None = None
    dcgm_url: str | None = None
    nccl_dir: Path | None = None
    probe_address: str = DEFAULT_PROBE_ADDRESS
    nvml: bool = True
    pfc_priority: int = 3
    fr: bool = True
    fr_prefix: str | None = None
    fr_poll_s: float | None = None
    signing_key: Path | None = None


@dataclass(frozen=True, slots=True)
class SendOptions:
    """Where the running agent sends its batches, and what it serves.

    Attributes
    ----------
    kafka
        The Kafka settings (bootstrap, topic, client id, TLS/SASL), checked.
    spool_dir
        Where unsent batches wait; None: :func:`default_spool_dir`.
    spool_max_bytes
        Spool bound; beyond it the oldest batches are dropped.
    metrics_port, metrics_addr
        The local Prometheus ``/metrics`` (port 0: off).
    goodbye
        Send a goodbye batch at a clean stop.
    wire_format
        Encoding of the batches.
    """

    kafka: KafkaSettings
    spool_dir: Path | None = None
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    metrics_port: int = DEFAULT_METRICS_PORT
    metrics_addr: str = "127.0.0.1"
    goodbye: bool = True
    wire_format: WireFormat = AGENT_FORMAT


@dataclass(frozen=True, slots=True)
class Started:
    """What a started agent does, for the line ``minder agent`` prints before it runs."""

    job: str
    node: str
    sources: tuple[str, ...]
    interval_s: float
    bootstrap: str
    topic: str
    security: str
    spool_dir: Path
    metrics_port: int
    fr_prefix: str | None
    goodbye: bool
    signing_kid: str | None


@dataclass(frozen=True, slots=True)
class OneBatch:
    """What :func:`collect_once` collected: the batch, and the sources' problems by
    ``(source, reason)`` (those seen at least once)."""

    batch: NodeBatch
    problems: Mapping[tuple[str, str], int]


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
    from collectors.ethtool import DEFAULT_TIMEOUT_S, EthtoolSource  # noqa: PLC0415
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
        timeout = DEFAULT_TIMEOUT_S if ethtool_timeout_s is None else ethtool_timeout_s
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


def build_fr_watcher(prefix: str | None, node: str, poll_s: float | None = None) -> FrWatcher:
    """The flight-recorder watcher of ``minder agent``: dumps ``<prefix><rank>`` (default: the
    training processes' default, :func:`collectors.flight_recorder.dump_prefix_from_env`) every
    ``poll_s`` seconds (default: :data:`collectors.fr_watch.DEFAULT_POLL_S`).

    Raises
    ------
    ValidationError
        ``prefix`` names no file prefix (it ends with ``/``) or ``poll_s`` is not positive.
    """
    from collectors.fr_watch import DEFAULT_POLL_S, FrWatcher  # noqa: PLC0415

    return FrWatcher(prefix or None, node=node, poll_s=DEFAULT_POLL_S if poll_s is None else poll_s)


def _assemble(options: AgentOptions, *, send: bool) -> tuple[Agent, Signer | None]:
    """The node's agent (and its signer when it will ``send``); raise ValidationError naming the
    first problem: the identity, a label, the ethtool command, the key, a source, the watcher."""
    from collectors.agent import Agent  # noqa: PLC0415
    from collectors.labels import discover_identity, parse_label  # noqa: PLC0415

    try:
        overrides: dict[str, str] = dict(parse_label(text) for text in options.labels)
        if options.job:
            overrides["job"] = options.job
        if options.node:
            overrides["node"] = options.node
        identity = discover_identity(os.environ, overrides)
        off = options.ethtool_command.strip().lower() == "off"
        command = None if off else shlex.split(options.ethtool_command)
    except ValueError as exc:  # shlex on unbalanced quotes
        raise ValidationError(str(exc)) from None
    signer: Signer | None = None
    if send:
        from minder.core.signing import node_signer  # noqa: PLC0415

        signer = node_signer(options.signing_key, identity.node)
    probe = options.probe_address
    sources = build_sources(
        sysfs_root=options.sysfs_root,
        ethtool_command=command,
        dcgm_url=options.dcgm_url,
        nccl_dir=options.nccl_dir,
        probe_address=None if probe.strip().lower() == "off" else probe,
        nvml=options.nvml,
        pfc_priority=options.pfc_priority,
        ethtool_timeout_s=options.ethtool_timeout_s,
    )
    try:
        watcher = (
            build_fr_watcher(options.fr_prefix, identity.node, options.fr_poll_s)
            if options.fr
            else None
        )
    except ValidationError:
        for source in sources:
            source.close()
        raise
    agent = Agent(
        sources,
        job=identity.job,
        node=identity.node,
        labels=identity.labels,
        interval_s=options.interval_s,
        # --once sends nothing: dumps are left for the agent that runs
        flight_recorder=watcher if send else None,
    )
    return agent, signer


def collect_once(options: AgentOptions) -> OneBatch:
    """Collect one batch and send nothing: every counter is read, then read again one interval
    later (rates and counts need two readings).

    Raises
    ------
    ValidationError
        The agent cannot be built (see the module's docstring).
    """
    agent, _ = _assemble(options, send=False)
    try:
        agent.collect_once(time.time())
        time.sleep(options.interval_s)
        batch = agent.collect_once(time.time())
        problems = {k: v for k, v in agent.error_counts().items() if v}
        return OneBatch(batch, problems)
    finally:
        agent.close()


def run_agent(
    options: AgentOptions, sending: SendOptions, on_started: Callable[[Started], None]
) -> None:
    """Run the node's agent until SIGTERM or SIGINT: collect every interval, serve ``/metrics``,
    send the batches to Kafka through the spool. ``on_started`` is told what runs, just before.

    Raises
    ------
    ValidationError
        The agent cannot be built, the spool cannot be opened, the Kafka settings are refused
        by the sender, or ``/metrics`` cannot be served.
    """
    agent, signer = _assemble(options, send=True)
    try:
        _run(agent, sending, signer, on_started)
    finally:
        agent.close()


def _run(
    agent: Agent,
    sending: SendOptions,
    signer: Signer | None,
    on_started: Callable[[Started], None],
) -> None:
    from collectors.agent import AgentExporter  # noqa: PLC0415
    from minder.agent.runner import AgentRunner  # noqa: PLC0415
    from minder.stream.agent_sender import KafkaRecordSender  # noqa: PLC0415
    from minder.stream.spool import Spool  # noqa: PLC0415

    kafka = sending.kafka
    bootstrap = kafka.bootstrap
    topic = kafka.metrics_topic
    client_id = f"{kafka.client_id}-agent"
    client_options = kafka.client_options()
    spool_dir = sending.spool_dir or default_spool_dir()
    try:
        spool = Spool(spool_dir, sending.spool_max_bytes)  # a ValidationError names the file
    except OSError as exc:
        raise ValidationError(f"cannot open the spool {spool_dir}: {exc}") from None
    try:
        # settings check before the threads start
        KafkaRecordSender(bootstrap, topic=topic, client_options=client_options)
    except ValidationError:
        spool.close()
        raise
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
            goodbye=sending.goodbye,
            fmt=sending.wire_format,
        )
        exporter.set_sender(runner.sender_counters)
        port, addr = sending.metrics_port, sending.metrics_addr
        if port:
            try:
                exporter.serve(port, addr)
            except OSError as exc:
                raise ValidationError(f"cannot serve /metrics on {addr}:{port}: {exc}") from None
        on_started(
            Started(
                job=agent.job,
                node=agent.node,
                sources=tuple(s.name for s in agent.sources),
                interval_s=agent.interval_s,
                bootstrap=bootstrap,
                topic=topic,
                security=kafka.describe_security(),
                spool_dir=spool_dir,
                metrics_port=port,
                fr_prefix=None if agent.flight_recorder is None else agent.flight_recorder.prefix,
                goodbye=sending.goodbye,
                signing_kid=None if signer is None else signer.key.kid,
            )
        )
        runner.run()
    finally:
        exporter.shutdown()
        spool.close()
