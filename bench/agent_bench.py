"""Cost of the node agent on a fixture-backed 8-GPU, 8-NIC node at 1 Hz.

Usage::

    .venv/bin/python bench/agent_bench.py --seconds 60 [--kafka] [--json]

The node: 8 mlx5 RoCE ports in a generated sysfs tree (``tests/collectors/fixtures/rdma/
mlx5_8nic.ttar`` unpacked into a temporary directory), whose counters a separate *updater*
process advances every second; a fake ``ethtool -S`` (a ``/bin/sh`` script printing per-netdev
statistics files the updater rewrites; a command other than the default makes the ethtool
source run it, one process per netdev, so this measures the command path, not the in-process
SIOCETHTOOL ioctl that ``minder agent`` uses by default, which the fixture netdevs cannot serve);
8 GPUs answered by the recording fake of ``pynvml`` in
``tests/collectors/nvml_recording.py`` (ticked after each collection; left out, and said so, when
that file or ``pynvml`` is missing); the real host source (psutil); and the step probe, to which
the updater sends 2 steps per second for each of 8 ranks over UDP.

The agent runs as in production (:class:`minder.agent_runner.AgentRunner`: collector and sender
threads, encoding, on-disk spool), and with ``--kafka`` sends to an embedded Tansu broker through
the real sender; without it batches only go to the spool. ``/metrics`` is rendered every
``--scrape-every`` seconds (what a Prometheus scrape costs).

Printed (measured after a warm-up of ``--warmup`` seconds):

- CPU of the agent process as % of one core (user + system time / wall time), and separately
  the CPU of the ``ethtool`` child processes it ran; the updater, the probe client and the
  broker are other processes and are not counted;
- peak RSS of the agent process (``getrusage``);
- mean collect time per source (ms), samples per batch;
- encoded batch size per node-second, msgpack (the wire default) and JSON.

The fake NVML is Python code standing in for ctypes calls into ``libnvidia-ml``; on a real node
NVML's own cost replaces it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TTAR = REPO / "tests" / "collectors" / "fixtures" / "rdma" / "mlx5_8nic.ttar"
NVML_RECORDING = REPO / "tests" / "collectors" / "nvml_recording.py"
RANKS = 8
STEPS_PER_SECOND = 2

logger = logging.getLogger("agent_bench")


# -- the updater: a separate process, so its CPU is not the agent's ------------------------------


def _counter_files(sysfs: Path) -> list[Path]:
    root = sysfs / "class" / "infiniband"
    return sorted(
        p
        for p in root.glob("*/ports/*/*counters/*")
        if p.is_file() and p.name != "lifespan" and p.read_text().strip().isdigit()
    )


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a reader never sees a half-written counter


def updater(sysfs: Path, stats_dir: Path, probe: str, seconds: float) -> None:
    """Advance every counter once a second and send step times for 8 ranks."""
    sys.path.insert(0, str(REPO))
    from collectors.probe import StepProbe  # noqa: PLC0415

    files = _counter_files(sysfs)
    values = {p: int(p.read_text().strip()) for p in files}
    netdevs = sorted(p.name for p in stats_dir.iterdir())
    probes = [StepProbe(probe, rank=r) for r in range(RANKS)]
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < seconds:
        tick += 1
        for path in files:
            # data counters move fast (port_*_data counts 4-byte words), errors rarely
            step = 3_000_000_000 if path.name.endswith("_data") else 1_000 + tick % 7
            values[path] += step
            _write(path, f"{values[path]}\n")
        for netdev in netdevs:
            _write(stats_dir / netdev, _ethtool_text(tick))
        for _ in range(STEPS_PER_SECOND):
            for rank, client in enumerate(probes):
                client.step(0.5 + 0.001 * rank)
            time.sleep(1.0 / STEPS_PER_SECOND)


def _ethtool_text(tick: int) -> str:
    lines = ["NIC statistics:"]
    for p in range(8):
        lines.append(f"     rx_prio{p}_bytes: {tick * 10_000_000 * (p + 1)}")
        lines.append(f"     rx_prio{p}_packets: {tick * 10_000 * (p + 1)}")
        lines.append(f"     rx_prio{p}_pause: {tick * (120 if p == 3 else 0)}")
        lines.append(f"     tx_prio{p}_pause: {tick * (40 if p == 3 else 0)}")
    lines += [f"     rx_vport_unicast_bytes: {tick * 12345678}", "     rx_out_of_buffer: 0"]
    return "\n".join(lines) + "\n"


# -- the node ------------------------------------------------------------------------------------


def build_node(workdir: Path) -> tuple[Path, Path, Path]:
    """Unpack the sysfs tree, write the ethtool statistics and the fake ethtool command."""
    from collectors.ethtool import rdma_netdevs  # noqa: PLC0415
    from collectors.ttar import unpack_ttar  # noqa: PLC0415

    unpack_ttar(TTAR, workdir / "tree")
    sysfs = workdir / "tree" / "sys"
    stats = workdir / "ethtool"
    stats.mkdir()
    netdevs = rdma_netdevs(sysfs)
    if len(netdevs) != 8:
        raise SystemExit(f"expected 8 RDMA netdevs in {TTAR}, found {sorted(netdevs)}")
    for netdev in netdevs:
        (stats / netdev).write_text(_ethtool_text(0))
    ethtool = workdir / "fake-ethtool"
    # Like ethtool, a small native program: /bin/sh and cat, not a Python interpreter.
    ethtool.write_text(f'#!/bin/sh\nexec cat "{stats}/$2"\n')
    ethtool.chmod(0o755)
    return sysfs, stats, ethtool


def _fake_nvml() -> Any | None:
    if not NVML_RECORDING.exists():
        print(f"note: {NVML_RECORDING} missing: running without GPUs", file=sys.stderr)
        return None
    try:
        spec = importlib.util.spec_from_file_location("nvml_recording", NVML_RECORDING)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["nvml_recording"] = module
        spec.loader.exec_module(module)
        gpus = module.a100_node(
            8,
            per_tick={"nvlink_tx_kib": 20_000_000, "nvlink_rx_kib": 20_000_000, "pcie_replay": 0},
        )
        return module.FakeNvml(gpus)
    except Exception as exc:  # pynvml or the shared nvidia-smi dump missing
        print(f"note: NVML fake unavailable ({exc!r}): running without GPUs", file=sys.stderr)
        return None


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured duration")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--interval", type=float, default=1.0, help="collection interval")
    parser.add_argument("--kafka", action="store_true", help="send to an embedded Tansu broker")
    parser.add_argument("--scrape-every", type=float, default=15.0, help="render /metrics every")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--no-ethtool",
        action="store_true",
        help="leave the command-path ethtool source out (what the in-process ioctl path, the "
        "agent's default, costs is measured by tests/collectors/test_ethtool_ioctl.py)",
    )
    parser.add_argument("--updater", nargs=4, metavar=("SYSFS", "STATS", "PROBE", "SECONDS"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.updater:
        sysfs, stats, probe, seconds = args.updater
        updater(Path(sysfs), Path(stats), probe, float(seconds))
        return
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore", DeprecationWarning)

    from prometheus_client import generate_latest  # noqa: PLC0415

    from collectors.agent import Agent, AgentExporter  # noqa: PLC0415
    from collectors.ethtool import EthtoolSource  # noqa: PLC0415
    from collectors.host import HostSource  # noqa: PLC0415
    from collectors.nvml import NvmlSource  # noqa: PLC0415
    from collectors.probe import ProbeSource  # noqa: PLC0415
    from collectors.rdma import RdmaSource  # noqa: PLC0415
    from minder.agent_runner import AgentRunner  # noqa: PLC0415
    from minder.core.codec import WireFormat, encode_batch  # noqa: PLC0415
    from minder.core.records import METRICS_TOPIC, NodeBatch  # noqa: PLC0415
    from minder.stream.spool import Spool  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp(prefix="minder-agent-bench-"))
    broker = None
    updater_proc = None
    try:
        sysfs, stats, ethtool = build_node(workdir)
        nvml = _fake_nvml()
        probe = ProbeSource("127.0.0.1:0")
        probe_address = probe.address
        assert probe_address is not None, "the probe could not bind a UDP port"
        sources: list[Any] = []
        if nvml is not None:
            sources.append(NvmlSource(nvml))
        sources += [RdmaSource(sysfs)]
        if not args.no_ethtool:
            sources.append(EthtoolSource((str(ethtool), "-S"), sysfs_root=sysfs))
        sources += [HostSource(), probe]
        agent = Agent(
            sources,
            job="bench",
            node=socket.gethostname() or "node",
            labels={"group": "pp0"},
            interval_s=args.interval,
        )
        sender_factory = None
        if args.kafka:
            from minder.stream import EmbeddedBroker  # noqa: PLC0415
            from minder.stream.agent_sender import KafkaRecordSender  # noqa: PLC0415

            broker = EmbeddedBroker(topics={METRICS_TOPIC: 1}).start()
            bootstrap = broker.bootstrap

            def sender_factory() -> KafkaRecordSender:
                return KafkaRecordSender(bootstrap)

        recent: list[NodeBatch] = []

        def on_batch(batch: NodeBatch) -> None:
            if nvml is not None:
                nvml.tick()  # the GPUs' counters move on, like the sysfs ones
            recent.append(batch)
            del recent[:-5]

        spool = Spool(workdir / "spool", 256 * 2**20)
        runner = AgentRunner(agent, spool, sender_factory, on_batch=on_batch)
        exporter = AgentExporter(agent)
        exporter.set_sender(runner.sender_counters)
        total_s = args.warmup + args.seconds + 5
        command = [sys.executable, __file__, "--updater", str(sysfs), str(stats)]
        command += [probe_address, str(total_s)]
        updater_proc = subprocess.Popen(command)  # a fixed argument list, no shell
        time.sleep(0.5)
        runner.start()
        time.sleep(args.warmup)
        collections0 = agent.collections_total
        per_source0 = agent.collect_seconds_total()
        cpu0, children0 = _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)
        wall0 = time.monotonic()
        next_scrape = wall0 + args.scrape_every
        while (now := time.monotonic()) < wall0 + args.seconds:
            if now >= next_scrape:
                generate_latest(exporter.registry)
                next_scrape += args.scrape_every
            time.sleep(min(0.2, max(0.0, wall0 + args.seconds - now)))
        wall = time.monotonic() - wall0
        cpu = _cpu_seconds(resource.RUSAGE_SELF) - cpu0
        children = _cpu_seconds(resource.RUSAGE_CHILDREN) - children0
        collections = agent.collections_total - collections0
        per_source = agent.collect_seconds_total()
        runner.stop()
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        batch = recent[-1]
        sizes = {
            fmt.value: sum(len(encode_batch(b, fmt)) for b in recent) / len(recent)
            for fmt in WireFormat
        }
        result = {
            "seconds": round(wall, 1),
            "interval_s": args.interval,
            "collections": collections,
            "kafka": args.kafka,
            "gpus": 8 if nvml is not None else 0,
            "nics": 8,
            "samples_per_batch": len(batch.samples),
            "samples_by_source": _by_source(batch),
            "agent_cpu_percent_of_one_core": round(100 * cpu / wall, 3),
            "ethtool_children_cpu_percent": round(100 * children / wall, 3),
            "peak_rss_mib": round(peak_rss_mib, 1),
            "mean_collect_ms": {
                name: round(1000 * (per_source[name] - per_source0.get(name, 0.0)) / collections, 3)
                for name in per_source
            },
            "batches_sent": runner.stats.batches_sent,
            "spool_batches_left": len(spool),
            "source_problems": {f"{s}/{r}": n for (s, r), n in agent.error_counts().items()},
            "bytes_per_node_second": {k: round(v / args.interval) for k, v in sizes.items()},
        }
        agent.close()
        spool.close()
    finally:
        if updater_proc is not None:
            updater_proc.terminate()
            updater_proc.wait(timeout=10)
        if broker is not None:
            broker.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:32} {value}")


def _by_source(batch: Any) -> dict[str, int]:
    families = {"gpu": "gpu", "rdma": "nic", "pfc": "nic", "train": "probe"}
    counts: dict[str, int] = {}
    for metric, _device, _value in batch.samples:
        family = families.get(metric.split("_", 1)[0], "host")
        counts[family] = counts.get(family, 0) + 1
    return counts


if __name__ == "__main__":
    main()
