"""Peak RSS and CPU of the real ``minder agent`` command: the CLI, its settings, the sources, the
spool and the sender, as deployed (``bench/agent_bench.py`` measures the agent's loop in a
process of its own, without the CLI).

Usage::

    python bench/agent_command.py --seconds 30 --rounds 2 [--baseline-root /tmp/wt-base14]

Each tree (this one, then ``--baseline-root`` when given, alternating per round) runs ``minder
agent`` for ``--seconds`` against the 8-NIC RDMA sysfs fixture (no NVML on this machine), a real
Tansu broker, its own ``/metrics`` and step-probe ports, and is stopped with SIGTERM. Peak RSS
and CPU (user + system, start-up included) come from ``wait4``. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE / "tests"))  # the ttar unpacker is a test helper

from ttar import unpack_ttar  # noqa: E402

from minder.core.records import METRICS_TOPIC  # noqa: E402
from minder.stream import EmbeddedBroker, free_port  # noqa: E402

FIXTURE = HERE / "tests" / "collectors" / "fixtures" / "rdma" / "mlx5_8nic.ttar"
LAUNCH = (
    "import sys, minder; print(minder.__file__, file=sys.stderr); "
    "from minder.cli import main; main()"
)


def run_once(tree: Path, seconds: float, bootstrap: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="agent-command-") as tmp:
        work = Path(tmp)
        unpack_ttar(FIXTURE, work / "tree")
        args = [
            sys.executable, "-c", LAUNCH, "agent", "--job", "j", "--node", "n", "--no-nvml",
            "--sysfs-root", str(work / "tree" / "sys"), "--spool-dir", str(work / "spool"),
            "--probe-address", f"127.0.0.1:{free_port()}", "--metrics-port", str(free_port()),
            "--kafka", bootstrap,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINDER_")}
        env["PYTHONPATH"] = str(tree)
        load = os.getloadavg()
        with open(work / "stderr", "w+b") as stderr:  # a file: a pipe could fill and block
            proc = subprocess.Popen(
                args, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=stderr
            )
            time.sleep(seconds)
            proc.send_signal(signal.SIGTERM)
            _, status, usage = os.wait4(proc.pid, 0)
            stderr.seek(0)
            imported = stderr.readline().decode(errors="replace").rstrip("\n")
    expected = str(tree / "minder" / "__init__.py")
    if imported != expected:
        raise SystemExit(f"minder was imported from {imported[:200]!r}, expected {expected}")
    return {
        "tree": str(tree),
        "seconds": seconds,
        "exit": os.waitstatus_to_exitcode(status),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "cpu_percent_incl_startup": round(100 * (usage.ru_utime + usage.ru_stime) / seconds, 3),
        "loadavg": [round(x, 2) for x in load],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-root", type=Path, default=None)
    args = parser.parse_args()
    trees = [HERE, *([args.baseline_root.resolve()] if args.baseline_root else [])]
    broker = EmbeddedBroker(topics={METRICS_TOPIC: 1}).start()
    try:
        for round_ in range(args.rounds):
            for tree in trees:
                result = run_once(tree, args.seconds, broker.bootstrap)
                print(json.dumps({"round": round_ + 1, **result}), flush=True)
    finally:
        broker.close()


if __name__ == "__main__":
    main()
