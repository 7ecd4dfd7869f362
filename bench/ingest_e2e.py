"""End-to-end ingest: simulator batches, encoded by the agent, through a real broker (Tansu) into
``minder serve`` worker processes.

Usage::

    python bench/ingest_e2e.py --baseline-root /tmp/wt-base14          # this tree, then baseline
    python bench/ingest_e2e.py --machines 2000 --seconds 4 --live-seconds 20 --workers 1,2

For each code tree measured (``--code-root``, by default the tree this file is in, then
``--baseline-root`` when given, without the scale-out phase unless ``--baseline-scale``), with
that tree first on ``PYTHONPATH`` for the producer and for the workers (checked: the bench
refuses to go on if ``minder`` is imported from elsewhere):

1. **drain**: a topic is filled with ``--seconds`` seconds of one job of ``--machines`` machines
   (8 GPUs, 8 NICs, host metrics and ranks: 182 samples a batch, the simulator's values), each
   batch encoded by that tree's own agent (:class:`minder.agent.runner.AgentRunner`, so the
   encoding is whatever the agent sends, schema 1 or 2); then one ``minder serve`` drains it.
   Reported: batches per worker CPU-second (the worker process's CPU time, all threads, from
   psutil, between the first and the last scrape of its ``/metrics`` that saw batches).
2. **scale-out**: ``--scale-jobs`` jobs sharing ``--machines`` machines, on as many partitions,
   job names picked so every partition holds the same number of jobs; drained by 1, 2, 4 …
   (``--workers``) workers in one consumer group. Reported: the drain rate (batches per wall
   second, between the first scrape at which every worker had partitions and the end) and its
   ratio against one worker, and batches per CPU-second of all workers.
3. **live**: one worker in its group first, then the producer sends ``--live-machines`` batches
   (``auto``: as many as the producer's measured cost per batch lets it send in 0.8 s of one
   core) every second for ``--live-seconds`` s. Reported: the service's own processing lag
   (``minder_processing_lag_seconds``: wall time minus the newest batch time it ingested,
   scraped every ``--scrape-s``) at p50/p99/max, the consumer backlog, how long the worker took
   to catch up once the producer stopped, the worker's share of a core and the producer's
   slip behind its schedule (a producer that slips did not sustain the rate).

``/metrics`` of every worker is scraped every ``--scrape-s`` (0.5 s: as a Prometheus would) in
every phase. Prints one JSON object (``--out`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kafka import KafkaProducer
from kafka.partitioner.default import murmur2

HERE = Path(__file__).resolve()
DEFAULT_ROOT = HERE.parents[1]
GPUS, NICS = 8, 8


# ---------------------------------------------------------------------------------------------
# Producer (runs in a subprocess, with the measured tree first on sys.path)
# ---------------------------------------------------------------------------------------------


class _CapturedSpool:
    """Stands in for the agent's on-disk spool: keeps the framed records it is given."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def append(self, record: bytes) -> None:
        self.records.append(record)


class _ReplayAgent:
    """Stands in for the node agent's collection: returns the simulator's batch of the node."""

    interval_s = 1.0
    sources: tuple[()] = ()

    def __init__(self, job: str, node: str) -> None:
        self.job, self.node = job, node
        self.next: Any = None

    def collect_once(self, now: float) -> Any:
        return self.next


class AgentEncoders:
    """One agent runner per node, each with its own encoder state (a packed layout is announced
    once per agent): the batches are encoded exactly as ``minder agent`` encodes them."""

    def __init__(self) -> None:
        try:  # the measured tree, once on the path: minder/agent/runner.py, or before it
            runner_module = importlib.import_module("minder.agent.runner")
        except ImportError:  # minder/agent_runner.py
            runner_module = importlib.import_module("minder.agent_runner")
        self._runner_type = runner_module.AgentRunner
        self._unframe = runner_module.unframe
        self._runners: dict[tuple[str, str], tuple[Any, _ReplayAgent, _CapturedSpool]] = {}

    def encode(self, batch: Any) -> tuple[bytes, bytes]:
        """``(key, payload)`` of ``batch`` as its node's agent sends it."""
        key = (batch.job, batch.node)
        entry = self._runners.get(key)
        if entry is None:
            agent, spool = _ReplayAgent(batch.job, batch.node), _CapturedSpool()
            runner = self._runner_type(agent, spool, None, interval_s=1.0, goodbye=False)  # type: ignore[arg-type]
            entry = self._runners[key] = (runner, agent, spool)
        runner, agent, spool = entry
        agent.next = batch
        runner.collect_and_spool()
        record = spool.records.pop()
        job, payload = self._unframe(record)
        return job.encode(), payload


def scenario(jobs: dict[str, int], seconds: int, start_ts: float) -> Any:
    """The simulated jobs (``name -> machines``) of the ingest benches: 8 GPUs and 8 NICs a
    machine, 8 pipeline stages from 64 machines on, 16 machines a domain."""
    from collectors.sim.scenario import Scenario  # noqa: PLC0415  (the measured tree, once on the path)

    return Scenario.model_validate(
        {
            "seed": 14,
            "duration_s": seconds,
            "start_ts": start_ts,
            "jobs": [
                {
                    "name": name,
                    "machines": machines,
                    "gpus_per_machine": GPUS,
                    "nics_per_machine": NICS,
                    "pp_stages": 8 if machines >= 64 else 1,
                    "machines_per_domain": 16,
                }
                for name, machines in jobs.items()
            ],
        }
    )


def _kafka_producer(bootstrap: str) -> Any:
    return KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=5,
        batch_size=1 << 20,
        max_request_size=8 << 20,
        enable_idempotence=False,  # Tansu refuses idempotent produce requests
        allow_auto_create_topics=False,
    )


def produce(args: argparse.Namespace) -> None:
    """The producer subcommand: fill a topic, or send live at 1 Hz; prints one JSON line."""
    import minder  # noqa: PLC0415  (the measured tree, once on the path)
    from collectors.sim.output import iter_batches  # noqa: PLC0415  (the measured tree, once on the path)

    jobs = dict(_parse_jobs(args.jobs))
    encoders = AgentEncoders()
    signer = _signer()
    producer = _kafka_producer(args.bootstrap)
    out: dict[str, Any] = {"minder_file": minder.__file__, "mode": args.mode}
    cpu0 = time.process_time()
    gen_cpu = enc_cpu = 0.0
    sent = bytes_sent = 0
    if args.mode == "fill":
        start = time.time() - args.seconds - 3.0
        stream = iter_batches(scenario(jobs, args.seconds, start))
        while True:
            t = time.process_time()
            item = next(stream, None)
            gen_cpu += time.process_time() - t
            if item is None:
                break
            t = time.process_time()
            for batch in item[1]:
                key, payload = encoders.encode(batch)
                headers = None if signer is None else [signer.header(batch.node, payload)]
                producer.send(args.topic, value=payload, key=key, headers=headers)
                bytes_sent += len(payload)
                sent += 1
            enc_cpu += time.process_time() - t
        producer.flush(300)
        slips: list[float] = []
    else:
        # The simulator's values of a few seconds, cycled with the live clock's timestamps.
        cached = min(args.seconds, 10)
        t = time.process_time()
        seconds = [b for _, b in iter_batches(scenario(jobs, cached, 0.0))]
        gen_cpu = time.process_time() - t
        slips = []
        began = math.ceil(time.time())
        for i in range(args.seconds):
            tick = began + i
            delay = tick - time.time()
            if delay > 0:
                time.sleep(delay)
            slips.append(max(0.0, time.time() - tick))
            t = time.process_time()
            for batch in seconds[i % cached]:
                live = dataclasses.replace(batch, ts=float(tick))
                key, payload = encoders.encode(live)
                headers = None if signer is None else [signer.header(live.node, payload)]
                producer.send(args.topic, value=payload, key=key, headers=headers)
                bytes_sent += len(payload)
                sent += 1
            producer.flush(60)
            enc_cpu += time.process_time() - t
            slips[-1] = max(slips[-1], time.time() - tick - 1.0)
    producer.close(10)
    out.update(
        sent=sent,
        bytes_per_batch=round(bytes_sent / max(sent, 1)),
        cpu_s=round(time.process_time() - cpu0, 3),
        sim_cpu_s=round(gen_cpu, 3),
        encode_send_cpu_s=round(enc_cpu, 3),
        encode_send_us_per_batch=round(1e6 * enc_cpu / max(sent, 1), 1),
        max_slip_s=round(max(slips), 3) if slips else None,
    )
    print(json.dumps(out), flush=True)


def _parse_jobs(text: str) -> list[tuple[str, int]]:
    jobs = []
    for item in text.split(","):
        name, _, count = item.partition("=")
        jobs.append((name, int(count)))
    return jobs


# ---------------------------------------------------------------------------------------------
# Orchestration (this tree's interpreter; the measured code runs only in the subprocesses)
# ---------------------------------------------------------------------------------------------


def balanced_job_names(jobs: int, partitions: int, prefix: str = "job") -> list[str]:
    """``jobs`` names that kafka-python's default partitioner spreads evenly over
    ``partitions`` (as a job id keys its batches)."""
    per = math.ceil(jobs / partitions)
    counts = [0] * partitions
    names: list[str] = []
    i = 0
    while len(names) < jobs:
        name = f"{prefix}{i:03d}"
        i += 1
        partition = (murmur2(name.encode()) & 0x7FFFFFFF) % partitions
        if counts[partition] < per:
            counts[partition] += 1
            names.append(name)
    return names


_KEYS_DIR = tempfile.mkdtemp(prefix="ingest-keys-")


def _keys_file() -> str:
    """A cluster key file for the run: workers that verify signatures read it, the producer
    signs with it (a tree older than signatures ignores both)."""
    path = Path(_KEYS_DIR) / "cluster.keys"
    if not path.exists():
        from minder.core.signing import init_cluster_keys  # noqa: PLC0415

        init_cluster_keys(path, "bench")
    return str(path)


def _env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
    env["PYTHONPATH"] = str(root)
    env["MINDER_AUTH__KEYS_FILE"] = _keys_file()
    env.update(extra or {})
    return env


def _signer() -> Any:
    """Signs as each node's agent would, when the measured tree has signatures (else None)."""
    keys_file = os.environ.get("MINDER_AUTH__KEYS_FILE")
    try:
        from minder.core.signing import FleetSigner, load_cluster_keys  # noqa: PLC0415
    except ImportError:
        return None
    return None if not keys_file else FleetSigner(load_cluster_keys(Path(keys_file))[-1])


def check_root(root: Path) -> str:
    """The file ``minder`` is imported from with ``root`` first on the path (must be in it)."""
    found = subprocess.run(
        [sys.executable, "-c", "import minder, collectors; print(minder.__file__)"],
        env=_env(root),
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"error: with PYTHONPATH={root}, minder is imported from {found}")
    return found


def run_producer(
    root: Path, bootstrap: str, topic: str, jobs: dict[str, int], seconds: int, mode: str
) -> subprocess.Popen[str]:
    spec = ",".join(f"{name}={count}" for name, count in jobs.items())
    command = [sys.executable, str(HERE), "produce", "--bootstrap", bootstrap, "--topic", topic]
    command += ["--jobs", spec, "--seconds", str(seconds), "--mode", mode]
    return subprocess.Popen(
        command, env=_env(root), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def producer_result(process: subprocess.Popen[str], root: Path, timeout: float) -> dict[str, Any]:
    stdout, stderr = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise SystemExit(f"error: the producer failed ({process.returncode}):\n{stderr[-3000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    if not Path(result["minder_file"]).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"error: the producer imported minder from {result['minder_file']}")
    return result


_SERIES = {
    "minder_batches_consumed_total": "batches",
    "minder_processing_lag_seconds": "lag_s",
    "minder_assigned_partitions": "assigned",
    "minder_consumer_lag_messages": "backlog",
    # the state writer's machines and seconds; the job-seconds evaluated and their CPU seconds
    "minder_state_machines_written_total": "state_machines",
    "minder_state_write_seconds_sum": "state_write_s",
    "minder_state_captures_superseded_total": "state_superseded",
    "minder_evaluation_seconds_count": "evaluations",
    "minder_evaluation_seconds_sum": "evaluation_cpu_s",
}
"""The worker's ``/metrics`` series the bench reads, and the keys it gives them."""


def read_series(text: str) -> dict[str, float]:
    """The :data:`_SERIES` of a ``/metrics`` page, each summed over its labels; a series the
    page lacks (an older tree's) is 0."""
    values = dict.fromkeys(_SERIES.values(), 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        key = _SERIES.get(name)
        if key is not None:
            values[key] += float(line.split()[-1])
    return values


@dataclass
class Worker:
    """One ``minder serve`` process of the measured tree."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    ps: Any = None
    samples: list[dict[str, float]] = field(default_factory=list)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def scrape(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        values = read_series(text)
        values["cpu_s"] = self.cpu_s()
        values["t"] = time.monotonic()
        return values


def start_workers(
    root: Path,
    count: int,
    bootstrap: str,
    topic: str,
    partitions: int,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
) -> list[Worker]:
    from minder.stream.broker import free_port  # noqa: PLC0415  (the measured tree, once on the path)

    group = f"bench-{uuid.uuid4().hex[:8]}"
    workers = []
    for i in range(count):
        port = free_port()
        log = workdir / f"{group}-{i}.log"
        env = _env(
            root,
            {
                "MINDER_KAFKA__BOOTSTRAP": bootstrap,
                "MINDER_KAFKA__METRICS_TOPIC": topic,
                "MINDER_KAFKA__DEADLETTER_TOPIC": f"{topic}.dead",
                "MINDER_KAFKA__ALERTS_TOPIC": f"{topic}.alerts",
                "MINDER_KAFKA__GROUP_ID": group,
                "MINDER_KAFKA__PARTITIONS": str(partitions),
                "MINDER_DATABASE__URL": f"sqlite:///{workdir / f'{group}-{i}.db'}",
                **(extra_env or {}),
            },
        )
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "minder.cli", "serve", "--port", str(port)],
                env=env,
                cwd=root,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        workers.append(Worker(process, port, log, psutil.Process(process.pid)))
    deadline = time.monotonic() + 120
    for worker in workers:
        while True:
            if worker.process.poll() is not None:
                raise SystemExit(f"error: a worker exited:\n{worker.log.read_text()[-3000:]}")
            try:
                worker.scrape()
                break
            except OSError:
                if time.monotonic() > deadline:
                    tail = worker.log.read_text()[-3000:]
                    raise SystemExit(f"error: worker not up:\n{tail}") from None
                time.sleep(0.2)
    return workers


def stop_workers(workers: list[Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            worker.process.terminate()
    for worker in workers:
        try:
            worker.process.wait(30)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(10)


def scrape_all(workers: list[Worker]) -> list[dict[str, float]]:
    return [worker.scrape() for worker in workers]


def drain(
    root: Path,
    broker: Any,
    topic: str,
    partitions: int,
    expected: int,
    n_workers: int,
    workdir: Path,
    scrape_s: float,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Drain ``topic`` (holding ``expected`` batches) with ``n_workers`` workers in one group."""
    workers = start_workers(
        root, n_workers, broker.bootstrap, topic, partitions, workdir, extra_env
    )
    broker_ps = psutil.Process(broker.pid)
    first: list[dict[str, float]] | None = None
    broker_cpu0 = 0.0
    last = scrape_all(workers)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            time.sleep(scrape_s)
            last = scrape_all(workers)
            total = sum(s["batches"] for s in last)
            everyone = all(s["assigned"] > 0 for s in last)
            if first is None and everyone and total > 0:
                first = last
                times = broker_ps.cpu_times()
                broker_cpu0 = times.user + times.system
            if total >= expected and sum(s["backlog"] for s in last) == 0:
                break
    finally:
        times = broker_ps.cpu_times()
        broker_cpu1 = times.user + times.system
        stop_workers(workers)
    total = sum(s["batches"] for s in last)
    if first is None or total < expected:
        raise SystemExit(
            f"error: {n_workers} worker(s) drained {total:.0f} of {expected} batches in "
            f"{timeout_s:g} s:\n{workers[0].log.read_text()[-3000:]}"
        )
    batches = total - sum(s["batches"] for s in first)
    cpu = sum(b["cpu_s"] - a["cpu_s"] for a, b in zip(first, last, strict=True))
    wall = max(s["t"] for s in last) - min(s["t"] for s in first)
    return {
        "workers": n_workers,
        "batches_measured": int(batches),
        "batches_per_cpu_s": round(batches / cpu) if cpu > 0 else None,
        "batches_per_wall_s": round(batches / wall) if wall > 0 else None,
        "worker_cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "broker_cpu_s": round(broker_cpu1 - broker_cpu0, 2),
        "per_worker_batches": [int(s["batches"]) for s in last],
        # The engine submits a job's capture every few data seconds and the state writer writes
        # the newest of each job (superseded: a newer one came before the writer got to it).
        # Write seconds are wall time, waits for the GIL included; evaluation CPU seconds are
        # the process's, so they count its other threads' work during an evaluation too.
        "state_machines_written": int(_delta(first, last, "state_machines")),
        "state_write_s": round(_delta(first, last, "state_write_s"), 2),
        "state_captures_superseded": int(_delta(first, last, "state_superseded")),
        "evaluations": int(_delta(first, last, "evaluations")),
        "evaluation_cpu_s": round(_delta(first, last, "evaluation_cpu_s"), 2),
    }


def _delta(first: list[dict[str, float]], last: list[dict[str, float]], key: str) -> float:
    return sum(b[key] - a[key] for a, b in zip(first, last, strict=True))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def live(
    root: Path,
    broker: Any,
    machines: int,
    seconds: int,
    partitions: int,
    workdir: Path,
    scrape_s: float,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One worker; the producer sends ``machines`` batches every second for ``seconds`` s."""
    from minder.stream import ensure_topics  # noqa: PLC0415  (the measured tree, once on the path)

    topic = f"bench.live.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, {topic: partitions, f"{topic}.dead": 1})
    workers = start_workers(root, 1, broker.bootstrap, topic, partitions, workdir, extra_env)
    worker = workers[0]
    try:
        deadline = time.monotonic() + 60
        while worker.scrape()["assigned"] < partitions:
            if time.monotonic() > deadline:
                raise SystemExit("error: the live worker got no partitions in 60 s")
            time.sleep(0.2)
        producer = run_producer(root, broker.bootstrap, topic, {"live": machines}, seconds, "live")
        samples: list[dict[str, float]] = []
        start = worker.scrape()
        while producer.poll() is None:
            time.sleep(scrape_s)
            samples.append(worker.scrape())
        produced = producer_result(producer, root, 60)
        stopped = time.monotonic()
        end = samples[-1] if samples else start
        catch_up_deadline = stopped + 120
        while end["backlog"] > 0 or end["batches"] < produced["sent"]:
            if time.monotonic() > catch_up_deadline:
                break
            time.sleep(scrape_s)
            end = worker.scrape()
        caught_up_s = time.monotonic() - stopped
    finally:
        stop_workers(workers)
    # The first seconds hold the group's first fetches: from the third second on.
    steady = [s["lag_s"] for s in samples if s["t"] - start["t"] > 3.0 and s["batches"] > 0]
    busy = samples[-1] if samples else start
    return {
        "machines": machines,
        "seconds": seconds,
        "batches_sent": produced["sent"],
        "batches_ingested": int(end["batches"]),
        "lag_p50_s": round(percentile(steady, 50), 3),
        "lag_p99_s": round(percentile(steady, 99), 3),
        "lag_max_s": round(max(steady, default=math.nan), 3),
        "backlog_at_end": int(busy["backlog"]),
        "caught_up_after_s": round(caught_up_s, 2),
        "worker_core_share": round(
            (busy["cpu_s"] - start["cpu_s"]) / max(busy["t"] - start["t"], 1e-9), 3
        ),
        "producer": produced,
    }


def say(message: str) -> None:
    """Progress on stderr (the result is the JSON on stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure_tree(
    root: Path,
    broker: Any,
    args: argparse.Namespace,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    *,
    scale: bool = True,
    live_machines: int | None = None,
) -> dict[str, Any]:
    """Every phase on the tree at ``root``; ``live_machines`` overrides ``--live-machines``."""
    from minder.stream import ensure_topics  # noqa: PLC0415  (this tree, once on the path)

    result: dict[str, Any] = {"root": str(root), "minder_file": check_root(root)}
    if extra_env:
        result["worker_env"] = extra_env
    # 1. one job of --machines machines, one worker
    topic = f"bench.one.{uuid.uuid4().hex[:8]}"
    ensure_topics(broker.bootstrap, {topic: args.partitions, f"{topic}.dead": 1})
    jobs = {"big": args.machines}
    fill = producer_result(
        run_producer(root, broker.bootstrap, topic, jobs, args.seconds, "fill"), root, 900
    )
    result["fill"] = fill
    say(f"{root}: filled {fill['sent']} batches ({fill['bytes_per_batch']} B each); draining")
    expected = fill["sent"]
    result["drain"] = drain(
        root,
        broker,
        topic,
        args.partitions,
        expected,
        1,
        workdir,
        args.scrape_s,
        args.timeout_s,
        extra_env,
    )
    say(f"{root}: drain {result['drain']}")
    # 2. several jobs over as many partitions, 1, 2, 4 … workers
    if args.workers and scale:
        names = balanced_job_names(args.scale_jobs, args.scale_jobs)
        per_job = max(1, args.machines // args.scale_jobs)
        topic = f"bench.scale.{uuid.uuid4().hex[:8]}"
        ensure_topics(broker.bootstrap, {topic: args.scale_jobs, f"{topic}.dead": 1})
        jobs = dict.fromkeys(names, per_job)
        scale_fill = producer_result(
            run_producer(root, broker.bootstrap, topic, jobs, args.seconds, "fill"), root, 900
        )
        say(f"{root}: scale-out topic filled with {scale_fill['sent']} batches")
        runs = [
            drain(
                root,
                broker,
                topic,
                args.scale_jobs,
                scale_fill["sent"],
                n,
                workdir,
                args.scrape_s,
                args.timeout_s,
                extra_env,
            )
            for n in args.workers
        ]
        one = next((r for r in runs if r["workers"] == 1), runs[0])
        for run in runs:
            rate, base = run["batches_per_wall_s"], one["batches_per_wall_s"]
            run["wall_rate_vs_1"] = round(rate / base, 2) if rate and base else None
        result["scale"] = {"jobs": len(names), "machines_per_job": per_job, "runs": runs}
    # 3. live at 1 Hz
    if args.live_seconds > 0:
        if live_machines is not None:
            machines = live_machines
        elif args.live_machines == "auto":
            us = fill["encode_send_us_per_batch"]
            machines = int(min(args.machines, 0.8e6 / us)) // 100 * 100 or 100
        else:
            machines = int(args.live_machines)
        say(f"{root}: live at {machines} machines for {args.live_seconds} s")
        result["live"] = live(
            root,
            broker,
            machines,
            args.live_seconds,
            args.partitions,
            workdir,
            args.scrape_s,
            extra_env,
        )
        say(f"{root}: live {result['live']}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    prod = sub.add_parser("produce", help="(internal) the producer subprocess")
    prod.add_argument("--bootstrap", required=True)
    prod.add_argument("--topic", required=True)
    prod.add_argument("--jobs", required=True, help="name=machines,…")
    prod.add_argument("--seconds", type=int, required=True)
    prod.add_argument("--mode", choices=["fill", "live"], required=True)
    parser.add_argument("--code-root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument(
        "--baseline-root", type=Path, default=None, help="a tree measured after --code-root"
    )
    parser.add_argument(
        "--baseline-scale", action="store_true", help="run the scale-out phase on the baseline too"
    )
    parser.add_argument("--machines", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=6, help="data seconds in each filled topic")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--scale-jobs", type=int, default=8)
    parser.add_argument(
        "--workers", default="1,2,4", help="worker counts of the scale-out phase ('' skips it)"
    )
    parser.add_argument("--live-seconds", type=int, default=60)
    parser.add_argument("--live-machines", default="auto", help="a count, or auto")
    parser.add_argument("--scrape-s", type=float, default=0.5)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per drain")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a MINDER_* setting of the --code-root tree's workers (not the baseline's)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if str(DEFAULT_ROOT) not in sys.path:
        sys.path.append(str(DEFAULT_ROOT))  # after PYTHONPATH: a measured tree there comes first
    if args.command == "produce":
        produce(args)
        return
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if args.live_machines != "auto" and not args.live_machines.isdigit():
        parser.error(f"--live-machines {args.live_machines!r}: expected a count or auto")
    worker_env = {}
    for item in args.worker_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("MINDER_"):
            parser.error(f"--worker-env {item!r}: expected MINDER_…=VALUE")
        worker_env[key] = value
    if args.machines < 1 or args.seconds < 1 or args.scale_jobs < 1:
        parser.error("--machines, --seconds and --scale-jobs must be at least 1")

    from minder.stream import EmbeddedBroker  # noqa: PLC0415  (the measured tree, once on the path)

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    report: dict[str, Any] = {
        "machines": args.machines,
        "seconds": args.seconds,
        "samples_per_batch": 182,
        "scrape_s": args.scrape_s,
        "trees": {},
    }
    with tempfile.TemporaryDirectory(prefix="ingest-e2e-") as tmp, EmbeddedBroker() as broker:
        # This tree first: the baseline's live run takes the rate chosen for it.
        current = measure_tree(args.code_root.resolve(), broker, args, Path(tmp), worker_env)
        report["trees"]["current"] = current
        if args.baseline_root is not None:
            report["trees"]["baseline"] = measure_tree(
                args.baseline_root.resolve(),
                broker,
                args,
                Path(tmp),
                scale=args.baseline_scale,
                live_machines=current["live"]["machines"] if "live" in current else None,
            )
    trees = report["trees"]
    if "baseline" in trees:
        base, cur = trees["baseline"]["drain"], trees["current"]["drain"]
        if base["batches_per_cpu_s"] and cur["batches_per_cpu_s"]:
            report["current_vs_baseline"] = {
                "drain_batches_per_cpu_s": round(
                    cur["batches_per_cpu_s"] / base["batches_per_cpu_s"], 2
                )
            }
        if "live" in trees["baseline"] and "live" in trees["current"]:
            report.setdefault("current_vs_baseline", {})["live_lag_p99_s"] = [
                trees["current"]["live"]["lag_p99_s"],
                trees["baseline"]["live"]["lag_p99_s"],
            ]
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
