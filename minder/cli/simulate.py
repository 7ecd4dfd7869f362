"""``minder simulate``: a simulated cluster into a metric table or onto Kafka."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from minder.cli.common import (
    err,
    fail,
    load_scenario,
    load_settings,
    out,
    progress,
    scenario_machines,
)

if TYPE_CHECKING:
    from collectors.sim.scenario import Scenario


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
) -> None:
    """Simulate a cluster from a scenario file: write the metric table or publish to Kafka."""
    from collectors.sim.labels import write_scenario_labels  # noqa: PLC0415
    from collectors.sim.output import write_scenario_table  # noqa: PLC0415
    from minder.core.errors import MinderError  # noqa: PLC0415

    scenario = load_scenario(scenario_file)
    if output is None and kafka is None:
        raise fail("nothing to do: give -o FILE and/or --kafka BOOTSTRAP")
    try:
        if output is not None:
            with err.status(
                f"simulating {scenario.duration_s} s of {scenario_machines(scenario)} machines"
            ):
                path = write_scenario_table(scenario, output)
            out.print(f"wrote {path}")
        if labels is not None:
            out.print(f"wrote {write_scenario_labels(scenario, labels)}")
        if kafka is not None:
            sent = _publish(scenario, kafka, realtime)
            out.print(f"published {sent} batches to {kafka}")
    except (MinderError, OSError) as exc:
        raise fail(exc) from None


def _publish(scenario: Scenario, bootstrap: str, realtime: bool) -> int:
    from collectors.sim.output import iter_batches  # noqa: PLC0415
    from minder.stream.producer import BatchProducer  # noqa: PLC0415
    from minder.stream.topics import ensure_topics  # noqa: PLC0415

    settings = load_settings()
    ensure_topics(bootstrap, {settings.kafka.metrics_topic: settings.kafka.partitions})
    sent = 0
    start = time.time() + 1.0 if realtime else None
    with (
        BatchProducer(bootstrap, topic=settings.kafka.metrics_topic) as producer,
        progress() as bar,
    ):
        task = bar.add_task("publishing", total=scenario.duration_s)
        for ts, batches in iter_batches(scenario, start_ts=start):
            if realtime and ts > time.time():
                time.sleep(ts - time.time())
            for batch in batches:
                producer.send(batch)
            sent += len(batches)
            bar.advance(task)
        producer.flush()
    return sent
