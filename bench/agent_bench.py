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

The agent runs as in production (:class:`minder.agent.runner.AgentRunner`: collector and sender
threads, encoding, on-disk spool), and with ``--kafka`` sends to an embedded Tansu broker through
the real sender; without it batches only go to the spool. ``/metrics`` is rendered every
``--scrape-every`` seconds (what a Prometheus scrape costs).

Printed (measured after a warm-up of ``--warmup`` seconds):

- CPU of the agent process as % of one core (user + system time / wall time), and separately
  the CPU of the ``ethtool`` child processes it ran; the updater, the probe client and the
  broker are other processes and are not counted;
- peak RSS of the agent process (``getrusage``), and whether numpy was loaded by then (the
  codec, which the encodings compared below come from in every tree, loads numpy: it is
  imported only after that);
- mean collect time per source (ms), samples per batch;
- bytes on the wire per node-second: every batch the runner encodes in the measured window is
  counted as it leaves the runner's own encoder (from schema 2 on a stateful
  :class:`~minder.core.codec.BatchEncoder`, which inlines the node's layout only in the first
  batch, on a change and once every few batches or seconds; before it ``encode_batch``), so the
  figure is the real sequence of batches as the agent sends it; beside it, for comparison,
  the same batches in schema 1 (msgpack and JSON, stateless, encoded after the window from the
  last few batches) and, where the tree has it, schema 2 with the layout inlined in every batch
  (the one-off ``encode_batch(b, WireFormat.PACKED)``, an upper bound); and the CPU the
  encoder took per batch (thread CPU time around each call, so it is part of the agent's CPU).

With ``--baseline-root DIR`` (a ``git worktree`` of older code) the bench runs itself as child
processes, ``--rounds`` times alternately on that tree and on this one (``PYTHONPATH`` set to each
root; every run checks and prints the ``minder`` package it imported), and prints each run, the
mean per tree and the ratios current / baseline, with the load average before and after::

    .venv/bin/python bench/agent_bench.py --seconds 50 --kafka --no-ethtool \
        --baseline-root /tmp/wt-base --rounds 2

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
import threading
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

    if str(REPO / "tests") not in sys.path:
        sys.path.append(str(REPO / "tests"))  # the ttar unpacker is a test helper
    from ttar import unpack_ttar  # noqa: PLC0415

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
    parser.add_argument(
        "--baseline-root",
        type=Path,
        help="also measure the code in this directory (a git worktree of older code), alternating "
        "with this tree in child processes",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per tree with --baseline-root")
    parser.add_argument("--updater", nargs=4, metavar=("SYSFS", "STATS", "PROBE", "SECONDS"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.updater:
        sysfs, stats, probe, seconds = args.updater
        updater(Path(sysfs), Path(stats), probe, float(seconds))
        return
    if args.rounds < 1:
        parser.error(f"--rounds is {args.rounds!r}: expected at least 1")
    if args.baseline_root is not None:
        compare(args)
        return
    result = measure(args)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:32} {value}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run of the agent in this process, with whatever ``minder`` it imports."""
    logging.basicConfig(level=logging.ERROR)
    warnings.simplefilter("ignore", DeprecationWarning)

    from prometheus_client import generate_latest  # noqa: PLC0415

    import minder  # noqa: PLC0415
    from collectors.agent import Agent, AgentExporter  # noqa: PLC0415
    from collectors.ethtool import EthtoolSource  # noqa: PLC0415
    from collectors.host import HostSource  # noqa: PLC0415
    from collectors.nvml import NvmlSource  # noqa: PLC0415
    from collectors.probe import ProbeSource  # noqa: PLC0415
    from collectors.rdma import RdmaSource  # noqa: PLC0415
    from minder.core.records import METRICS_TOPIC, NodeBatch  # noqa: PLC0415
    from minder.stream.spool import Spool  # noqa: PLC0415

    try:  # the run loop's module: minder/agent/runner.py, before it minder/agent_runner.py
        runner_module: Any = importlib.import_module("minder.agent.runner")
    except ImportError:
        runner_module = importlib.import_module("minder.agent_runner")

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
        runner = runner_module.AgentRunner(agent, spool, sender_factory, on_batch=on_batch)
        wire = _WireCounter()
        encoder = getattr(runner, "encoder", None)
        if encoder is not None:  # schema 2 trees: the runner's stateful BatchEncoder
            encoder.encode = wire.wrap(encoder.encode)
        else:  # before schema 2: the runner called the module's encode_batch(batch, fmt)
            runner_module.encode_batch = wire.wrap(runner_module.encode_batch)
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
        wire0 = wire.snapshot()
        inlined0 = None if encoder is None else encoder.stats.layouts_inlined
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
        wire1 = wire.snapshot()
        wire_batches, wire_bytes, wire_cpu_ns = (b - a for a, b in zip(wire0, wire1, strict=True))
        inlined = None if encoder is None else encoder.stats.layouts_inlined - (inlined0 or 0)
        runner.stop()
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        numpy_loaded = "numpy" in sys.modules
        if wire_batches < 1:
            raise SystemExit(f"no batch was encoded in {wall:.1f} s: the agent is not running")
        batch = recent[-1]
        # Imported only now: the codec (the module that has these in older trees too) loads
        # numpy, which the agent itself does not (from issue 14 on), so importing it earlier
        # would count numpy in the peak RSS.
        from minder.core.codec import WireFormat, encode_batch  # noqa: PLC0415

        # schema 1 is stateless: the last few batches stand for all of them
        sizes = {
            f"schema1_{fmt.value}": sum(len(encode_batch(b, fmt)) for b in recent) / len(recent)
            for fmt in WireFormat
            if fmt.value in ("msgpack", "json")
        }
        if "packed" in {fmt.value for fmt in WireFormat}:
            packed = WireFormat("packed")
            sizes["schema2_layout_in_every_batch"] = sum(
                len(encode_batch(b, packed)) for b in recent
            ) / len(recent)
        result = {
            "minder": str(Path(minder.__file__).resolve().parent),
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
            "numpy_loaded_by_agent": numpy_loaded,
            "mean_collect_ms": {
                name: round(1000 * (per_source[name] - per_source0.get(name, 0.0)) / collections, 3)
                for name in per_source
            },
            "batches_sent": runner.stats.batches_sent,
            "spool_batches_left": len(spool),
            "source_problems": {f"{s}/{r}": n for (s, r), n in agent.error_counts().items()},
            "wire_format": str(getattr(runner, "fmt", "msgpack")),
            "wire_batches": wire_batches,
            "wire_layouts_inlined": inlined,
            "wire_bytes_per_node_second": round(wire_bytes / wire_batches / args.interval),
            "wire_encode_cpu_us_per_batch": round(wire_cpu_ns / wire_batches / 1000, 1),
            "compare_bytes_per_node_second": {
                k: round(v / args.interval) for k, v in sizes.items()
            },
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
    return result


class _WireCounter:
    """Counts the batches and bytes an encoding function returns (the collector thread calls it;
    the main thread reads whole snapshots)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = 0
        self.bytes = 0
        self.cpu_ns = 0

    def wrap(self, encode: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> bytes:
            t0 = time.thread_time_ns()
            data: bytes = encode(*args, **kwargs)
            cpu_ns = time.thread_time_ns() - t0
            with self._lock:
                self.batches += 1
                self.bytes += len(data)
                self.cpu_ns += cpu_ns
            return data

        return counted

    def snapshot(self) -> tuple[int, int, int]:
        """Batches, bytes and encoding CPU nanoseconds (of the calling thread) so far."""
        with self._lock:
            return self.batches, self.bytes, self.cpu_ns


# -- baseline against current, alternating child processes ---------------------------------------

_COMPARED = (
    "agent_cpu_percent_of_one_core",
    "peak_rss_mib",
    "wire_bytes_per_node_second",
    "wire_encode_cpu_us_per_batch",
)


def compare(args: argparse.Namespace) -> None:
    """Run the bench on the baseline tree and on this one, alternately, and print both."""
    base = args.baseline_root.resolve()
    if not (base / "minder" / "__init__.py").is_file():
        raise SystemExit(f"--baseline-root {base}: expected a tree with minder/__init__.py")
    command = [sys.executable, str(Path(__file__).resolve()), "--json"]
    command += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    command += ["--interval", str(args.interval), "--scrape-every", str(args.scrape_every)]
    command += ["--kafka"] * args.kafka + ["--no-ethtool"] * args.no_ethtool
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    for round_ in range(args.rounds):
        for tree, root in (("baseline", base), ("current", REPO)):
            env = dict(os.environ, PYTHONPATH=str(root))
            load_before = os.getloadavg()
            out = subprocess.run(command, env=env, check=False, capture_output=True, text=True)
            if out.returncode != 0:
                last = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
                raise SystemExit(f"{tree} run (PYTHONPATH={root}) exited {out.returncode}: {last}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            if Path(result["minder"]) != root / "minder":
                raise SystemExit(f"{tree} run imported minder from {result['minder']}: "
                                 f"expected {root / 'minder'}")  # fmt: skip
            result["loadavg_before"] = [round(x, 2) for x in load_before]
            result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
            runs[tree].append(result)
            print(f"round {round_ + 1} {tree:8} {json.dumps(result)}", flush=True)
    means = {
        tree: {key: sum(r[key] for r in results) / len(results) for key in _COMPARED}
        for tree, results in runs.items()
    }
    summary = {
        "mean": {tree: {k: round(v, 3) for k, v in m.items()} for tree, m in means.items()},
        "current_over_baseline": {
            key: round(means["current"][key] / means["baseline"][key], 3) for key in _COMPARED
        },
    }
    print(json.dumps(summary) if args.json else json.dumps(summary, indent=1))


def _by_source(batch: Any) -> dict[str, int]:
    families = {"gpu": "gpu", "rdma": "nic", "pfc": "nic", "train": "probe"}
    counts: dict[str, int] = {}
    for metric, _device, _value in batch.samples:
        family = families.get(metric.split("_", 1)[0], "host")
        counts[family] = counts.get(family, 0) + 1
    return counts


if __name__ == "__main__":
    main()
