"""Real PyTorch flight-recorder dumps from a tiny gloo job (for the watcher's tests).

:func:`write_dumps` runs ``world`` CPU processes of torch.distributed (gloo) with the flight
recorder on (``TORCH_FR_BUFFER_SIZE``); each rank runs a few all-reduces, writes its dump to
``<out>/v1/<prefix><rank>`` (pickle) and ``<out>/v1/<prefix><rank>.json`` (JSON), runs two
more, writes ``<out>/v2/<prefix><rank>``, and exits without tearing down (``os._exit``), as a
process killed after a dump would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hang_jobs import gloo_env

PREFIX = "nccl_trace_rank_"

_RANK = r"""
import os, sys
import torch
import torch.distributed as dist

rank, world, out, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", rank=rank, world_size=world)
t = torch.ones(8)
for _ in range(3):
    dist.all_reduce(t)
dist.barrier()
c10d = torch._C._distributed_c10d
with open(os.path.join(out, "v1", f"{prefix}{rank}"), "wb") as f:
    f.write(c10d._dump_fr_trace())
with open(os.path.join(out, "v1", f"{prefix}{rank}.json"), "wb") as f:
    f.write(c10d._dump_fr_trace_json())
for _ in range(2):
    dist.all_reduce(t)
dist.barrier()
with open(os.path.join(out, "v2", f"{prefix}{rank}"), "wb") as f:
    f.write(c10d._dump_fr_trace())
os._exit(0)
"""


def write_dumps(out: Path, *, world: int = 2, prefix: str = PREFIX, timeout_s: float = 120) -> None:
    """Run the job; its dumps land in ``out/v1`` and ``out/v2``."""
    for version in ("v1", "v2"):
        (out / version).mkdir(parents=True, exist_ok=True)
    env = gloo_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), str(world), str(out), prefix],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    failed = []
    for rank, proc in enumerate(procs):
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        if proc.returncode != 0:
            failed.append(f"rank {rank} exited {proc.returncode}: {output.decode()[-2000:]}")
    if failed:
        raise RuntimeError("; ".join(failed))


if __name__ == "__main__":  # regenerate the checked-in fixtures
    write_dumps(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).parent / "fixtures" / "flight_recorder"
    )
