"""Every dashboard query returns data from the real system: broker, service, agents, simulator.

Started as real processes: the embedded Kafka broker (in this process), ``minder serve`` with
Slurm actions and self-checks in log-only mode (the self-check service runs and launches
nothing), four ``minder agent`` processes of the job ``trial`` (RDMA from
the captured 8-NIC sysfs tree, GPUs from a dcgm-exporter exposition served by this test, one
Hostname per agent), ``minder simulate --realtime --metrics-port`` of a 16-machine job ``sim``
with per-rank step signals whose NIC goes down 10 s in, and a real Prometheus scraping the
service (job ``minder``), the agents (job ``minder-agent``) and the simulated machines' /metrics
(job ``minder-simulator``) every second. The service exports the top 4 machine scores of each job
(``MINDER_DETECTION__TOP_K_SCORES=4``), so the machine picker must list every machine from
``minder_machine_score_all``. A what-if report is uploaded through the API, and one batch from
a node whose clock is an hour ahead is sent (the service refuses it: rejected batches).

Once every target is up, the fault is alerted and acted on (dry run), the simulated job has its
live slowdown S and every rank's lateness, and the newest counters have two scrapes, every panel, annotation and variable query of every committed dashboard runs
through Prometheus' HTTP API with the dashboards' variables filled in from live label values:
each query must return series (for a query of the job variable: for at least one live job; for
the metric variable: at least for its default metric; the hang culprits' table only runs: no
job of the stack hangs). ``promtool check metrics`` must accept a real scrape of the service and
of an agent.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_server import PrometheusServer, prometheus_server
from ttar import unpack_ttar

from collectors.sim.scenario import DEFAULT_METRICS, STRAGGLER_METRICS
from dashboards.queries import (
    annotation_queries,
    default_variables,
    panel_queries,
    substitute,
    variable_names,
    variable_options,
    variable_queries,
    variable_selector,
)
from minder.core.records import METRICS_TOPIC, NodeBatch
from minder.core.signing import FleetSigner, init_cluster_keys, load_cluster_keys, write_node_keys
from minder.stream import BatchProducer, EmbeddedBroker
from minder.stream.broker import free_port
from whatif.synth import SynthJob, synthesize
from whatif.trace import write_canonical

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]
JSON_DIR = ROOT / "dashboards" / "json"
RDMA_FIXTURE = ROOT / "tests" / "collectors" / "fixtures" / "rdma" / "mlx5_8nic.ttar"
MINDER = [sys.executable, "-m", "minder.cli"]

TRIAL_JOB = "trial"
SIM_JOB = "sim"
LIVE_JOBS = (TRIAL_JOB, SIM_JOB)
AGENTS = 4  # DetectionSettings.min_machines: fewer and the trial job is never scored
NODES = [f"{TRIAL_JOB}-n{k:04d}" for k in range(AGENTS)]
GPUS = 8
SIM_MACHINES = 16
SIM_METRICS = [*DEFAULT_METRICS, *(m for m in STRAGGLER_METRICS if m not in DEFAULT_METRICS)]
"""The default metrics and the per-rank step signals (live S, rank lateness)."""
SCENARIO = f"""\
description: dashboards live test, 16 machines with step signals, a NIC down 10 s in
seed: 7
duration_s: 180
jobs:
  - name: {SIM_JOB}
    machines: {SIM_MACHINES}
    machines_per_domain: 8
    step_time_s: 2.0
    metrics: {json.dumps(SIM_METRICS)}
faults:
  - type: nic_down
    machine: 5
    device: mlx5_1
    start_s: 10
"""
"""A NIC down is a rule alert (acted on) that does not stop the job's steps (an XID would stall
it, and the step signals with it)."""
STACK_TIMEOUT_S = 120.0
"""From the start of the processes to every readiness condition (alert, action, scrapes)."""

EMPTY_WITHOUT_A_HANG = frozenset({"panel 'Hang culprits'"})
"""Queries that must run but may return nothing here: no job of the stack hangs, and a job that
does not hang has no culprit series. Their data is checked against the synthetic exporter in
test_dashboards_queries_live.py, and the series themselves in tests/minder/service."""

READY = {
    "service target up": 'count(up{job="minder"} == 1) == 1',
    f"{AGENTS} agent targets up": f'count(up{{job="minder-agent"}} == 1) == {AGENTS}',
    "agents sending (two scrapes)": "count(rate(minder_agent_batches_sent_total[1m]))",
    "the simulated fault alerted": f'minder_open_alerts{{job_id="{SIM_JOB}", kind="rule"}} == 1',
    f"the {TRIAL_JOB} job scored": f'count(minder_machine_score{{job_id="{TRIAL_JOB}"}}) >= 4',
    f"every machine of {SIM_JOB} scored": (
        f'count(minder_machine_score_all{{job_id="{SIM_JOB}"}}) == {SIM_MACHINES}'
    ),
    "the simulator's /metrics scraped": 'count(up{job="minder-simulator"} == 1) == 1',
    f"the live S of {SIM_JOB}": f'minder_job_live_slowdown{{job_id="{SIM_JOB}"}}',
    f"the lateness of every rank of {SIM_JOB}": (
        f'count(minder_rank_lateness_seconds{{job_id="{SIM_JOB}"}}) == {SIM_MACHINES * 8}'
    ),
    "the fault acted on (two scrapes)": "count(rate(minder_actions_total[1m]))",
    "the alert stored (two scrapes)": "count(rate(minder_alert_deliveries_total[1m]))",
    "the future batch rejected (two scrapes)": "count(rate(minder_batches_rejected_total[1m]))",
    "the what-if report exported": "minder_whatif_slowdown",
    "the self-check series exported (two scrapes)": "count(rate(minder_selfchecks_total[1m])) == 5",
}
"""Conditions (PromQL that must return series) before the dashboards' queries run.

``rate()`` returns a series once Prometheus holds two samples of it in the window: a counter
born at 1 (the first action, the first rejected batch) has rate 0, but a rate."""

# dcgm-exporter fields (collectors/dcgm.py FIELDS) and a healthy level for each.
DCGM_LEVELS = {
    "DCGM_FI_DEV_GPU_UTIL": 92.0,
    "DCGM_FI_PROF_SM_ACTIVE": 0.81,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.42,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95,
    "DCGM_FI_PROF_DRAM_ACTIVE": 0.55,
    "DCGM_FI_DEV_POWER_USAGE": 610.0,
    "DCGM_FI_DEV_GPU_TEMP": 62.0,
    "DCGM_FI_DEV_SM_CLOCK": 1755.0,
    "DCGM_FI_DEV_FB_USED": 61_000.0,
    "DCGM_FI_PROF_PCIE_TX_BYTES": 4.1e9,
    "DCGM_FI_PROF_PCIE_RX_BYTES": 3.9e9,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 2.5e10,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": 2.4e10,
    "DCGM_FI_DEV_PCIE_LINK_GEN": 5.0,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16.0,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
}
_EXACT = {"DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH"}
_CODES = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_XID_ERRORS"}


def dcgm_exposition(node: str, index: int, now: float) -> str:
    """What dcgm-exporter serves on ``node``: every GPU, values a little different per agent."""
    lines: list[str] = []
    for name, level in DCGM_LEVELS.items():
        lines += [f"# HELP {name} {name}", f"# TYPE {name} gauge"]
        for gpu in range(GPUS):
            if name in _EXACT or name in _CODES:
                value = level
            else:
                wobble = 0.01 * math.sin(now / 3 + index + gpu / 4) + 0.004 * (index - 1.5)
                value = level * (1 + wobble)  # within 2 %: ratios stay below 1, util below 100
            labels = (
                f'gpu="{gpu}",UUID="GPU-8d3a1c2e-{index:04d}-4000-8000-0000000000{gpu:02d}",'
                f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",'
                'DCGM_FI_DRIVER_VERSION="550.54.15"'
            )
            if name == "DCGM_FI_DEV_XID_ERRORS":
                labels += ',err_code="0",err_msg="No Error"'
            lines.append(f"{name}{{{labels}}} {value:.6g}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def dcgm_exporters() -> Iterator[str]:
    """One HTTP server answering ``/<node>/metrics`` like that node's dcgm-exporter."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            node = self.path.strip("/").removesuffix("/metrics")
            if node not in NODES:
                self.send_error(404)
                return
            body = dcgm_exposition(node, NODES.index(node), time.time()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Process:
    """A subprocess of the stack and the file its output goes to."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    may_finish: bool = False
    """It ends by itself (the simulator): only a failure status is a problem."""

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _stop(process: Process) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    if process.popen.poll() is not None:
        return
    process.popen.send_signal(signal.SIGTERM)
    try:
        process.popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.popen.kill()
        process.popen.wait(timeout=10)


def _start(
    stack: contextlib.ExitStack,
    name: str,
    args: list[str],
    env: dict[str, str],
    logs: Path,
    *,
    may_finish: bool = False,
) -> Process:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [*MINDER, *args], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    process = Process(name, popen, log, may_finish)
    stack.callback(_stop, process)
    return process


def _wait_for(what: str, predicate: Callable[[], bool], deadline: float, *procs: Process) -> None:
    while not predicate():
        for process in procs:
            status = process.popen.poll()
            assert status is None or (status == 0 and process.may_finish), (
                f"{process.name} exited ({process.popen.returncode}) while waiting for {what}:\n"
                f"{process.tail()}"
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _series(prometheus: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    answer = prometheus.query(expr)
    assert answer["status"] == "success", f"{expr}\n{answer}"
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _has_series(prometheus: PrometheusServer, expr: str) -> bool:
    return bool(_series(prometheus, expr))


def _label_values(prometheus: PrometheusServer, selector: str, label: str) -> list[str]:
    answer = prometheus.get(f"/api/v1/label/{label}/values", {"match[]": selector})
    assert answer["status"] == "success", f"label_values({selector}, {label}): {answer}"
    return sorted(answer["data"])


def _promtool() -> str | None:
    for candidate in (shutil.which("promtool"), "/usr/bin/promtool"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _check_metrics(url: str) -> None:
    """``promtool check metrics`` on one real scrape of ``url``."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read()
    assert b"minder_" in text, url
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False
    )
    problems = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0, f"promtool check metrics {url}:\n{problems}"


# --- running the dashboards' queries --------------------------------------------------------


@dataclass
class Outcome:
    """One query of a dashboard, run once per variable combination."""

    where: str
    expr: str
    runs: int = 0
    with_data: int = 0
    jobs_with_data: set[str] = field(default_factory=set)
    metrics_without_data: list[str] = field(default_factory=list)
    failed: bool = False


@dataclass
class DashboardReport:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        runs = sum(o.runs for o in self.outcomes)
        hits = sum(o.with_data for o in self.outcomes)
        lines = [
            f"{self.name}: {len(self.outcomes)} queries, {runs} runs, {hits} with data, "
            f"{sum(not o.failed for o in self.outcomes)} of {len(self.outcomes)} queries pass"
        ]
        for o in self.outcomes:
            jobs = (
                f" jobs with data: {','.join(sorted(o.jobs_with_data))}" if o.jobs_with_data else ""
            )
            lines.append(f"  {o.where}: {o.with_data}/{o.runs} with data;{jobs}")
            if o.metrics_without_data:
                lines.append(
                    f"    metric options with no data: {', '.join(o.metrics_without_data)}"
                )
        return "\n".join(lines)


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    exprs = [(f"panel {t!r}", e) for t, e in panel_queries(dashboard)]
    exprs += [(f"annotation {n!r}", e) for n, e in annotation_queries(dashboard)]
    for name, text in variable_queries(dashboard):
        selector = variable_selector(text)
        if selector:
            exprs.append((f"variable {name!r}", selector))
    return exprs


def _live_variables(prometheus: PrometheusServer, dashboard: dict[str, Any]) -> dict[str, Any]:
    """Per live job, the query variables' values as Grafana resolves them from live data.

    ``job_id`` takes each live job (both must be among its ``label_values``), ``machine`` the
    first of its ``label_values`` for that job. Empty for a dashboard without query variables.
    """
    variables = dict(variable_queries(dashboard))
    if not variables:
        return {}
    assert set(variables) == {"job_id", "machine"}, variables
    selectors = {}
    for name, text in variables.items():
        selector = variable_selector(text)
        assert selector and text.rstrip().endswith(f", {name})"), text
        selectors[name] = selector
    jobs = _label_values(prometheus, selectors["job_id"], "job_id")
    assert set(LIVE_JOBS) <= set(jobs), f"job_id options {jobs}: expected {LIVE_JOBS}"
    result = {}
    for job in LIVE_JOBS:
        selector = substitute(selectors["machine"], {"job_id": job})
        machines = _label_values(prometheus, selector, "machine")
        assert len(machines) >= 4, f"machine options of job {job}: {machines}"
        if job == SIM_JOB:  # every machine, beyond the top 4 of minder_machine_score
            assert len(machines) == SIM_MACHINES, f"machine options of job {job}: {machines}"
        result[job] = {"job_id": job, "machine": machines[0]}
    return result


def _run_dashboard(
    prometheus: PrometheusServer, name: str, dashboard: dict[str, Any]
) -> DashboardReport:
    """Every query of ``dashboard``, for every live job, every metric option (see the module)."""
    report = DashboardReport(name)
    defaults = default_variables(dashboard)
    options = variable_options(dashboard)
    live = _live_variables(prometheus, dashboard)
    for where, expr in _exprs(dashboard):
        outcome = Outcome(where, expr)
        report.outcomes.append(outcome)
        used = variable_names(expr)
        jobs: list[str | None] = [None]
        if used & {"job_id", "machine"}:
            assert live, f"{name} {where}: uses the job variables, the dashboard has none"
            jobs = list(LIVE_JOBS)
        custom = sorted(used & set(options))
        assert custom in ([], ["metric"]), f"{name} {where}: unexpected variables {custom}"
        metric_values: list[str | None] = list(options["metric"]) if custom else [None]
        for metric in metric_values:
            tried: list[str] = []
            found = False
            for job in jobs:
                values = dict(defaults)
                if job is not None:
                    values.update(live[job])
                if metric is not None:
                    values["metric"] = metric
                promql = substitute(expr, values)
                tried.append(promql)
                answer = prometheus.query(promql)
                outcome.runs += 1
                if answer["status"] != "success":
                    outcome.failed = True
                    report.failures.append(f"{name} {where}: {promql}\n  {answer}")
                    continue
                if answer["data"]["result"]:
                    outcome.with_data += 1
                    found = True
                    if job is not None:
                        outcome.jobs_with_data.add(job)
            if found:
                continue
            if where in EMPTY_WITHOUT_A_HANG:
                continue
            if metric is None or metric == defaults.get("metric"):
                outcome.failed = True
                report.failures.append(f"{name} {where}: no series for any of {' | '.join(tried)}")
            else:
                outcome.metrics_without_data.append(metric)
    return report


# --- the test -------------------------------------------------------------------------------


def _scrape_configs(
    service_port: int, agent_ports: list[int], simulator_port: int
) -> list[dict[str, Any]]:
    return [
        {
            "job_name": "minder",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{service_port}"]}],
        },
        {
            "job_name": "minder-agent",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in agent_ports]}],
        },
        {
            "job_name": "minder-simulator",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{simulator_port}"]}],
        },
    ]


TOKEN = "live-stack-token"
"""The API token of the stack (changes need one)."""


def _submit_whatif(api: str, directory: Path) -> str:
    """Upload a synthetic trace (stage 3 slow) for the trial job; return the report id."""
    trace = synthesize(SynthJob(dp=2, pp=4, microbatches=4, steps=3, stage_factor={3: 1.6}))
    trace_path, meta_path = write_canonical(trace, directory / "trace-live.parquet")
    files = [
        ("files", (trace_path.name, trace_path.read_bytes())),
        ("meta", (meta_path.name, meta_path.read_bytes())),
    ]
    response = httpx.post(
        f"{api}/whatif",
        files=files,
        data={"job": TRIAL_JOB},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    report_id: str = response.json()["id"]
    return report_id


def _whatif_done(api: str, report_id: str) -> bool:
    auth = {"Authorization": f"Bearer {TOKEN}"}  # reads need the token too
    body = httpx.get(f"{api}/whatif/{report_id}", headers=auth, timeout=10).json()
    assert body["status"] != "failed", body
    return bool(body["status"] == "done")


def _send_batch_from_the_future(bootstrap: str, keys_file: Path) -> None:
    """A node whose clock is an hour ahead: the service refuses its batch (future_timestamp)."""
    batch = NodeBatch(
        job=SIM_JOB,
        node="clock-ahead",
        ts=time.time() + 3600,
        samples=[("gpu_util_ratio", "gpu0", 0.5)],
    )
    signer = FleetSigner(load_cluster_keys(keys_file)[-1])  # signed: a real node's clock
    with BatchProducer(bootstrap, topic=METRICS_TOPIC, signer=signer) as producer:
        producer.send(batch)
        producer.flush()


def test_every_dashboard_query_returns_data_from_the_running_stack(tmp_path: Path) -> None:
    began = time.monotonic()
    logs = tmp_path / "logs"
    logs.mkdir()
    sysfs = tmp_path / "sysfs"
    unpack_ttar(RDMA_FIXTURE, sysfs)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    service: Process | None = None
    processes: list[Process] = []
    with contextlib.ExitStack() as stack:
        try:
            broker = stack.enter_context(EmbeddedBroker(port=free_port()))
            dcgm = stack.enter_context(dcgm_exporters())
            # Every node signs (the service requires it): the agents with their node keys, the
            # simulator with the cluster key (MINDER_AUTH__KEYS_FILE).
            keys_file = tmp_path / "cluster.keys"
            write_node_keys(init_cluster_keys(keys_file, "live"), NODES, tmp_path / "node-keys")
            api_port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
            env.update(
                {
                    "MINDER_KAFKA__BOOTSTRAP": broker.bootstrap,
                    "MINDER_KAFKA__PARTITIONS": "2",
                    "MINDER_AUTH__KEYS_FILE": str(keys_file),
                    "MINDER_DATABASE__URL": f"sqlite:///{tmp_path / 'minder.db'}",
                    "MINDER_ACTIONS__TARGET": "slurm",
                    "MINDER_ACTIONS__SCONTROL": "/bin/false",
                    "MINDER_WHATIF__WORKDIR": str(tmp_path / "whatif"),
                    "MINDER_API__TOKEN": TOKEN,
                    "MINDER_DETECTION__TOP_K_SCORES": "4",
                    # log-only actions: the self-check service runs and exports its series,
                    # and launches nothing
                    "MINDER_SELFCHECK__ENABLED": "true",
                    "MINDER_SELFCHECK__REPORT_URL": f"http://127.0.0.1:{api_port}",
                    "COLUMNS": "200",
                }
            )
            service = _start(stack, "serve", ["serve", "--port", str(api_port)], env, logs)
            processes.append(service)
            deadline = time.monotonic() + STACK_TIMEOUT_S
            _wait_for(
                "the service's /ready",
                lambda: _http_ok(f"http://127.0.0.1:{api_port}/ready"),
                deadline,
                service,
            )
            agent_ports = [free_port() for _ in NODES]
            for node, port in zip(NODES, agent_ports, strict=True):
                options = {
                    "--job": TRIAL_JOB,
                    "--node": node,
                    "--kafka": broker.bootstrap,
                    "--metrics-port": str(port),
                    "--metrics-addr": "127.0.0.1",
                    "--spool-dir": str(tmp_path / "spool" / node),
                    "--ethtool-command": "off",
                    "--probe-address": "off",
                    "--sysfs-root": str(sysfs / "sys"),
                    "--dcgm-url": f"{dcgm}/{node}/metrics",
                    "--signing-key": str(tmp_path / "node-keys" / f"{node}.key"),
                }
                args = ["agent", "--no-nvml", *(x for pair in options.items() for x in pair)]
                processes.append(_start(stack, node, args, env, logs))
            simulator_port = free_port()
            simulator = _start(
                stack,
                "simulate",
                [
                    "simulate",
                    str(scenario),
                    "--kafka",
                    broker.bootstrap,
                    "--realtime",
                    "--metrics-port",
                    str(simulator_port),
                ],
                env,
                logs,
                may_finish=True,
            )
            processes.append(simulator)
            prometheus = stack.enter_context(
                prometheus_server(
                    tmp_path / "prometheus",
                    scrape_configs=_scrape_configs(api_port, agent_ports, simulator_port),
                )
            )
            api = f"http://127.0.0.1:{api_port}/api/v1"
            report_id = _submit_whatif(api, tmp_path)
            _send_batch_from_the_future(broker.bootstrap, keys_file)
            _wait_for("the what-if report", lambda: _whatif_done(api, report_id), deadline, service)
            for what, expr in READY.items():
                present = functools.partial(_has_series, prometheus, expr)
                _wait_for(what, present, deadline, *processes)
            ready_after = time.monotonic() - began

            _check_metrics(f"http://127.0.0.1:{api_port}/metrics")
            _check_metrics(f"http://127.0.0.1:{agent_ports[0]}/metrics")
            _check_metrics(f"http://127.0.0.1:{simulator_port}/metrics")

            reports = [
                _run_dashboard(prometheus, path.name, json.loads(path.read_text()))
                for path in sorted(JSON_DIR.glob("*.json"))
            ]
            print(f"\nstack ready after {ready_after:.0f} s")
            for report in reports:
                print(report.summary())
            failures = [f for report in reports for f in report.failures]
            assert failures == [], "queries without data:\n" + "\n".join(failures)
            assert len(reports) == 5
        except BaseException:
            if service is not None:
                print(f"--- minder serve stderr (tail) ---\n{service.tail(60)}", file=sys.stderr)
            for process in processes[1:]:
                if process.popen.poll() not in (None, 0):
                    print(f"--- {process.name} exited ---\n{process.tail(20)}", file=sys.stderr)
            raise
