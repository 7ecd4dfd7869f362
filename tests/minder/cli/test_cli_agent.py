"""``minder agent``: ``--once`` against a captured sysfs tree and a fake ethtool, errors, and a
short real run against the embedded broker."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from minder.cli.agent import agent_command
from minder.core.codec import batch_from_dict
from minder.core.metrics import validate_sample

SHARED = (
    Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "sysfs-infiniband-fixtures"
)

app = typer.Typer()
app.command(name="agent")(agent_command)


@app.callback()
def _root() -> None:
    """Registered like minder/cli/app.py does, so `agent` stays a subcommand."""


runner = CliRunner()


def _sysfs(tmp_path: Path) -> Path:
    """The node_exporter sysfs tree, with an Ethernet netdev under mlx4_0 for ethtool."""
    from ttar import unpack_ttar

    archive = SHARED / "node_exporter_sys_class_infiniband.ttar"
    if not archive.exists():
        pytest.skip(f"shared sysfs fixtures absent: {archive}")
    unpack_ttar(archive, tmp_path / "tree")
    root = tmp_path / "tree" / "sys"
    netdev = root / "class" / "infiniband" / "mlx4_0" / "device" / "net" / "eth1"
    netdev.mkdir(parents=True)
    (netdev / "dev_port").write_text("0\n")
    (netdev / "type").write_text("1\n")
    return root


def _fake_ethtool(tmp_path: Path) -> Path:
    """`ethtool -S <netdev>`: mlx5-style PFC counters that grow with every call."""
    script = tmp_path / "fake-ethtool"
    state = tmp_path / "ethtool-calls"
    script.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"state = pathlib.Path({str(state)!r})\n"
        "n = int(state.read_text()) + 1 if state.exists() else 1\n"
        "state.write_text(str(n))\n"
        "assert sys.argv[1:] == ['-S', 'eth1'], sys.argv\n"
        "print('NIC statistics:')\n"
        "print(f'     rx_prio3_pause: {1000 + 50 * n}')\n"
        "print(f'     tx_prio3_pause: {2000 + 10 * n}')\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _base_args(tmp_path: Path) -> list[str]:
    return [
        "agent",
        "--once",
        "--interval",
        "0.2",
        "--no-nvml",
        "--probe-address",
        "off",
        "--sysfs-root",
        str(_sysfs(tmp_path)),
        "--ethtool-command",
        f"{_fake_ethtool(tmp_path)} -S",
        # The fake is a Python script: its start-up on a loaded machine is no hung ethtool.
        "--ethtool-timeout",
        "10",
    ]


def _clean_env() -> dict[str, str]:
    # The runner replaces os.environ: keep scheduler variables of the machine out of the test.
    return {k: "" for k in os.environ if k.startswith(("SLURM", "MINDER_", "NODE_NAME", "POD_"))}


def test_once_json_has_rdma_pfc_host_samples_and_identity(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            *_base_args(tmp_path),
            "--job",
            "j42",
            "--node",
            "n0017",
            "--label",
            "group=pp3",
            "--label",
            "domain=leaf-12",
            "--format",
            "json",
        ],
        env={**_clean_env(), "MINDER_LABEL_RACK": "r3"},
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["schema"], data["job"], data["node"]) == (1, "j42", "n0017")
    assert data["labels"] == {"rack": "r3", "group": "pp3", "domain": "leaf-12"}
    assert data["interval_s"] == 0.2
    samples = {(m, d): v for m, d, v in data["samples"]}
    for m, d, v in data["samples"]:
        validate_sample(m, d, v)
    rdma = {k for k in samples if k[0].startswith("rdma_")}
    assert ("rdma_port_up", "mlx4_0") in rdma
    assert ("rdma_port_up", "i40iw0") in rdma
    assert ("rdma_port_up", "mlx4_0:2") in rdma  # second port of a two-port device
    assert ("rdma_rx_bytes_per_second", "mlx4_0") in rdma  # a rate: needed the priming read
    # The second reading of the fake ethtool grew by 50 and 10 in one --interval.
    assert samples[("pfc_rx_pause_per_second", "mlx4_0")] == pytest.approx(50 / 0.2, rel=0.5)
    assert samples[("pfc_tx_pause_per_second", "mlx4_0")] == pytest.approx(10 / 0.2, rel=0.5)
    assert ("cpu_util_ratio", "") in samples
    assert batch_from_dict(data).node == "n0017"  # the wire decoder accepts it


def test_once_table_lists_samples(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [*_base_args(tmp_path), "--job", "j1", "--node", "n1"],
        env=_clean_env(),
    )
    assert result.exit_code == 0, result.output
    assert "rdma_port_up" in result.stdout
    assert "mlx4_0" in result.stdout
    assert "j1 / n1" in result.stdout


def test_identity_from_the_environment(tmp_path: Path) -> None:
    env = {**_clean_env(), "SLURM_JOB_ID": "777", "SLURMD_NODENAME": "gpu-3"}
    result = runner.invoke(app, [*_base_args(tmp_path), "--format", "json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["job"], data["node"]) == ("777", "gpu-3")


def test_missing_job_exits_2_naming_the_variables(tmp_path: Path) -> None:
    result = runner.invoke(app, ["agent", "--once", "--no-nvml"], env=_clean_env())
    assert result.exit_code == 2
    assert "MINDER_JOB" in result.stderr and "SLURM_JOB_ID" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label", "group"], "expected KEY=VALUE"),
        (["--label", "node=x"], "reserved"),
        (["--interval", "0"], "--interval is 0"),
        (["--pfc-priority", "9"], "--pfc-priority is 9"),
        (["--metrics-port", "70000"], "--metrics-port is 70000"),
        (["--probe-address", "nonsense"], "source probe cannot start"),
        (["--ethtool-command", "'unbalanced"], "quotation"),
        (["--ethtool-timeout", "0"], "--ethtool-timeout is 0"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(
        app, ["agent", "--once", "--no-nvml", "--job", "j", *args], env=_clean_env()
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def _spool_args(tmp_path: Path, spool_dir: Path) -> list[str]:
    """Run (not --once) with no source that needs the machine, up to the opening of the spool."""
    return [
        "agent",
        "--job",
        "j",
        "--node",
        "n",
        "--no-nvml",
        "--probe-address",
        "off",
        "--ethtool-command",
        "off",
        "--sysfs-root",
        str(tmp_path / "no-sys"),
        "--metrics-port",
        "0",
        "--kafka",
        "127.0.0.1:1",
        "--spool-dir",
        str(spool_dir),
    ]


def _one_line(text: str) -> str:
    """The console wraps long paths: compare without the line breaks and spaces it adds."""
    return "".join(text.split())


def test_unreadable_spool_segment_exits_2_naming_it(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool"
    segment = spool_dir / "seg-00000000000000000000.spool"
    segment.mkdir(parents=True)  # unreadable as a file, even for root: EISDIR
    result = runner.invoke(app, _spool_args(tmp_path, spool_dir), env=_clean_env())
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert str(segment) in _one_line(result.stderr)
    assert "cannot open the spool" in result.stderr


def test_os_error_opening_the_spool_exits_2_naming_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import minder.stream.spool as spool_module

    def refuse(directory: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(directory / "head"))

    monkeypatch.setattr(spool_module, "Spool", refuse)
    spool_dir = tmp_path / "locked-spool"
    result = runner.invoke(app, _spool_args(tmp_path, spool_dir), env=_clean_env())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = _one_line(result.stderr)
    assert f"cannotopenthespool{spool_dir}" in flat and "Permissiondenied" in flat


@pytest.mark.kafka
@pytest.mark.slow
def test_agent_runs_sends_to_kafka_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from minder.core.records import METRICS_TOPIC, NodeBatch
        from minder.stream import BatchConsumer, EmbeddedBroker, free_port

    from minder.core.signing import ClusterKey, Verifier, format_node_key
    from minder.stream.auth import BatchAuthenticator

    cluster_key = ClusterKey.generate("agent-test")
    key_file = tmp_path / "nk.key"
    key_file.write_text(format_node_key(cluster_key.node_key("nk")))
    key_file.chmod(0o600)
    metrics_port = free_port()
    # A rank's flight-recorder dump on the node: its summary rides in a signed batch.
    dumps = tmp_path / "fr"
    dumps.mkdir()
    fixture = Path(__file__).resolve().parents[2] / "collectors" / "fixtures" / "flight_recorder"
    (dumps / "nccl_trace_rank_1").write_bytes((fixture / "v1" / "nccl_trace_rank_1").read_bytes())
    try:
        broker = EmbeddedBroker(topics={METRICS_TOPIC: 1, "minder.deadletter.v1": 1}).start()
    except Exception as exc:
        pytest.skip(f"no embedded broker: {exc}")
    try:
        args = [
            "agent",
            "--job",
            "jk",
            "--node",
            "nk",
            "--interval",
            "0.1",
            "--no-nvml",
            "--probe-address",
            "off",
            "--ethtool-command",
            "off",
            "--sysfs-root",
            str(tmp_path / "no-sys"),
            "--kafka",
            broker.bootstrap,
            "--spool-dir",
            str(tmp_path / "spool"),
            "--metrics-port",
            str(metrics_port),
            "--metrics-addr",
            "127.0.0.1",
            "--signing-key",
            str(key_file),
            "--fr-prefix",
            f"{dumps}/nccl_trace_rank_",
            "--fr-poll",
            "0.05",
        ]
        scraped: list[str] = []

        def scrape_then_stop() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    url = f"http://127.0.0.1:{metrics_port}/metrics"
                    with urllib.request.urlopen(url, timeout=2) as response:
                        body = response.read().decode()
                    if (
                        "minder_agent_batches_sent_total" in body
                        and "minder_agent_batches_sent_total 0.0" not in body
                        and "minder_node_cpu_util_ratio" in body  # from the 2nd collection
                        and 'minder_agent_flight_recorder_summaries_total{job_id="jk",machine="nk"} '
                        "1.0"
                        in body
                    ):
                        scraped.append(body)
                        break
                except OSError:
                    pass
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=scrape_then_stop, daemon=True).start()
        result = runner.invoke(app, args, env=_clean_env())
        assert result.exit_code == 0, result.output
        assert scraped, "the agent never reported a delivered batch on /metrics"
        assert 'minder_node_cpu_util_ratio{device="",job_id="jk",machine="nk"}' in scraped[0]
        assert 'minder_agent_info{job_id="jk",machine="nk"} 1.0' in scraped[0]

        # the service's check: only batches signed with nk's own key get through
        auth = BatchAuthenticator(Verifier([cluster_key]))
        consumer = BatchConsumer(
            broker.bootstrap,
            group_id=f"cli-agent-{uuid.uuid4().hex[:6]}",
            session_timeout_ms=3000,
            heartbeat_interval_ms=500,
            authenticator=auth,
        )
        received: list[NodeBatch] = []
        try:
            deadline = time.monotonic() + 20
            while not any(b.flight_recorder for b in received) and time.monotonic() < deadline:
                consumer.poll_once(received.extend, timeout_ms=200)
        finally:
            consumer.close()
        assert received and {(b.job, b.node) for b in received} == {("jk", "nk")}
        [summary] = [s for b in received for s in b.flight_recorder]
        assert (summary.rank, summary.node, summary.source) == (1, "nk", "nccl_trace_rank_1")
        assert auth.verified == len(received) and sum(auth.failures.values()) == 0
    finally:
        broker.close()


def test_a_key_made_for_another_node_stops_the_agent_in_one_line(tmp_path: Path) -> None:
    from minder.core.signing import ClusterKey, format_node_key

    key_file = tmp_path / "other.key"
    key_file.write_text(format_node_key(ClusterKey.generate("k").node_key("other-node")))
    key_file.chmod(0o600)
    args = ["agent", "--job", "j", "--node", "this-node", "--signing-key", str(key_file)]
    result = runner.invoke(app, [*args, "--kafka", "127.0.0.1:1"], env=_clean_env())
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "other-node" in lines[0] and "this-node" in lines[0], result.output


# -- Kafka security options ----------------------------------------------------------------

AGENT_SECRET = "agent-secret-not-for-output"


def _record_agent_clients(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Replace the agent's runner by one that makes its Kafka sender once and sends one record,
    and kafka-python's producer by a recorder of its keyword arguments: a fake, because no TLS or
    SASL broker runs here (the embedded Tansu is plaintext only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.errors import KafkaTimeoutError

        import minder.agent.runner as runner_module
        import minder.stream.agent_sender as sender_module
    made: list[dict[str, object]] = []

    class Producer:
        def __init__(self, **config: object) -> None:
            made.append(config)

        def send(self, *args: object, **kwargs: object) -> None:
            raise KafkaTimeoutError("no broker in this test")

        def flush(self, *args: object, **kwargs: object) -> None:
            return None

        def close(self, *args: object, **kwargs: object) -> None:
            return None

    class OneSend:
        def __init__(self, agent: object, spool: object, make_sender: object, **_: object) -> None:
            self.make_sender = make_sender

        def sender_counters(self) -> None:
            return None

        def run(self) -> None:
            sender = self.make_sender()  # type: ignore[operator]
            sender.send([("j", b"{}")], timeout_s=0.2)
            sender.close()

    monkeypatch.setattr(sender_module, "KafkaProducer", Producer)
    monkeypatch.setattr(runner_module, "AgentRunner", OneSend)
    return made


def test_kafka_options_reach_the_agents_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _record_agent_clients(monkeypatch)
    password_file = tmp_path / "sasl-password"
    password_file.write_text(AGENT_SECRET + "\n")
    args = [
        *_spool_args(tmp_path, tmp_path / "spool"),
        "--kafka-security-protocol",
        "sasl_plaintext",
        "--kafka-sasl-mechanism",
        "SCRAM-SHA-256",
        "--kafka-sasl-username",
        "agent-7",
        "--kafka-sasl-password-file",
        str(password_file),
    ]
    result = runner.invoke(app, args, env={**_clean_env(), "COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert len(made) == 1
    config = made[0]
    assert config["bootstrap_servers"] == "127.0.0.1:1"  # --kafka
    assert {k: config[k] for k in config if k.startswith(("security", "sasl"))} == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "agent-7",
        "sasl_plain_password": AGENT_SECRET,  # the file's first line, without its line break
    }
    assert "SASL_PLAINTEXT, SCRAM-SHA-256 as 'agent-7'" in result.stderr
    assert AGENT_SECRET not in result.output


def test_kafka_password_from_the_environment_and_options_over_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _record_agent_clients(monkeypatch)
    env = {
        **_clean_env(),
        "MINDER_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "MINDER_KAFKA__SASL_MECHANISM": "PLAIN",
        "MINDER_KAFKA__SASL_USERNAME": "from-env",
        "MINDER_KAFKA__SASL_PASSWORD": AGENT_SECRET,
    }
    args = [*_spool_args(tmp_path, tmp_path / "spool"), "--kafka-sasl-username", "from-flag"]
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert made[0]["security_protocol"] == "SASL_SSL"
    assert made[0]["sasl_plain_username"] == "from-flag"
    assert made[0]["sasl_plain_password"] == AGENT_SECRET
    assert made[0]["ssl_check_hostname"] is True
    assert AGENT_SECRET not in result.output


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (
            ["--kafka-security-protocol", "SASL_SSL"],
            {},
            "MINDER_KAFKA__SASL_MECHANISM='None': missing: expected PLAIN, SCRAM-SHA-256 or "
            "SCRAM-SHA-512 with security protocol SASL_SSL",
        ),
        (
            ["--kafka-sasl-mechanism", "PLAIN"],
            {},
            "--kafka-sasl-mechanism='PLAIN': expected no SASL setting with security protocol "
            "PLAINTEXT",
        ),
        (
            ["--kafka-security-protocol", "SSL", "--kafka-ca-file", "/nonexistent/ca.pem"],
            {},
            "--kafka-ca-file='/nonexistent/ca.pem': does not exist or is not readable",
        ),
        (["--kafka-security-protocol", "tls"], {}, "--kafka-security-protocol='TLS': input"),
        (
            ["--kafka-sasl-password-file", "/nonexistent/password"],
            {},
            "--kafka-sasl-password-file /nonexistent/password: cannot be read",
        ),
        (
            [],
            {"MINDER_KAFKA__SASL_PASSWORD": AGENT_SECRET},
            "MINDER_KAFKA__SASL_PASSWORD=<hidden>: expected no SASL setting",
        ),
    ],
)
def test_bad_kafka_options_exit_2_in_one_line_without_secrets(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    result = runner.invoke(
        app,
        [*_spool_args(tmp_path, tmp_path / "spool"), *args],
        env={**_clean_env(), **env, "COLUMNS": "400"},
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0]
    assert AGENT_SECRET not in result.output
    assert not (tmp_path / "spool").exists()  # refused before anything started


def test_wire_format_choices_are_the_codec_formats() -> None:
    import inspect
    import typing

    from minder.cli.agent import agent_command
    from minder.core.codec import AGENT_FORMAT, WireFormat

    assert inspect.signature(agent_command).parameters["wire_format"].default is AGENT_FORMAT
    hint = typing.get_type_hints(agent_command, include_extras=True)["wire_format"]
    assert typing.get_args(hint)[0] is WireFormat


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fr-prefix", "/var/tmp/"], "expected DIRECTORY/NAME_PREFIX"),
        (["--fr-poll", "0"], "--fr-poll is 0"),
    ],
)
def test_bad_flight_recorder_options_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(
        app, ["agent", "--once", "--no-nvml", "--job", "j", *args], env=_clean_env()
    )
    assert result.exit_code == 2, result.output
    assert _one_line(message) in _one_line(result.stderr)
