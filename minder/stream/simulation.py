"""A simulated cluster onto Kafka (``minder simulate --kafka``): each second's batches of a
scenario, signed as the agents sign them, optionally at wall-clock pace and with the simulated
machines' metrics served for Prometheus as their agents would serve them.

:func:`publish_scenario` reports through callbacks; the CLI prints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from collectors.sim.scenario import Scenario
    from minder.config import KafkaSettings


def publish_scenario(
    scenario: Scenario,
    kafka: KafkaSettings,
    realtime: bool,
    keys_file: Path | None,
    metrics: tuple[str, int] | None = None,
    *,
    on_unsigned: Callable[[], None] | None = None,
    on_metrics_url: Callable[[str], None] | None = None,
    on_start: Callable[[], None] | None = None,
    on_second: Callable[[], None] | None = None,
) -> int:
    """Publish ``scenario``'s batches to ``kafka``'s metrics topic (created if missing); return
    how many were sent.

    ``realtime``: at wall-clock pace, timestamps from now. ``keys_file``: sign each node's
    batches with node keys derived from this cluster key file (none: unsigned). ``metrics``:
    ``(address, port)`` to serve the simulated machines' metrics on (port 0: a free one).

    Callbacks: ``on_unsigned()`` when the batches go unsigned, ``on_metrics_url(url)`` once the
    metrics are served, ``on_start()`` when publishing begins, ``on_second()`` after each
    simulated second.

    Raises
    ------
    MinderError
        The metrics cannot be served there, or the broker or key file fails.
    """
    from collectors.sim.exporter import SimulationExporter  # noqa: PLC0415
    from collectors.sim.output import iter_batches  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415
    from minder.core.signing import FleetSigner, load_cluster_keys  # noqa: PLC0415
    from minder.stream.producer import BatchProducer  # noqa: PLC0415
    from minder.stream.topics import ensure_topics  # noqa: PLC0415

    client_options = kafka.client_options()
    ensure_topics(
        kafka.bootstrap, {kafka.metrics_topic: kafka.partitions}, client_options=client_options
    )
    sent = 0
    start = time.time() + 1.0 if realtime else None
    signer = None if keys_file is None else FleetSigner(load_cluster_keys(keys_file)[-1])
    if signer is None and on_unsigned is not None:
        on_unsigned()
    exporter = None
    if metrics is not None:
        exporter = SimulationExporter()
        addr, port = metrics
        try:
            bound = exporter.serve(port, addr)
        except OSError as exc:
            raise MinderError(
                f"--metrics-addr {addr} --metrics-port {port}: cannot listen there "
                f"({exc.strerror or exc}); expected a free port on a local address, or 0"
            ) from None
        if on_metrics_url is not None:
            on_metrics_url(f"http://{addr}:{bound}/metrics")
    with (
        contextlib.closing(exporter) if exporter is not None else contextlib.nullcontext(),
        BatchProducer(
            kafka.bootstrap,
            topic=kafka.metrics_topic,
            client_options=client_options,
            signer=signer,
        ) as producer,
    ):
        if on_start is not None:
            on_start()
        for ts, batches in iter_batches(scenario, start_ts=start):
            if realtime and ts > time.time():
                time.sleep(ts - time.time())
            for batch in batches:
                producer.send(batch)
            if exporter is not None:
                exporter.update(batches)
            sent += len(batches)
            if on_second is not None:
                on_second()
        producer.flush()
    return sent
