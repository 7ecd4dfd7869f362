"""Perfetto / Chrome trace-event export of replayed timelines (actual, original, ideal).

Each worker is a process (``dp D · stage P``), each stream a thread (compute, the four p2p
streams, DP collectives, other); steps are laid back to back in replay time. Open the file in
https://ui.perfetto.dev or ``chrome://tracing``.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from minder.core.errors import ValidationError
from whatif import optypes
from whatif.model import JobModel
from whatif.scenarios import Replayer, Scenario

KINDS = ("actual", "original", "ideal")
"""Replays that can be exported: with recorded launch delays, without them, with ideal durations."""

_STREAMS = {
    optypes.FORWARD_COMPUTE: (0, "compute"),
    optypes.BACKWARD_COMPUTE: (0, "compute"),
    optypes.OPTIMIZER: (0, "compute"),
    optypes.GC: (0, "compute"),
    optypes.FORWARD_SEND: (1, "pp forward-send"),
    optypes.FORWARD_RECV: (2, "pp forward-recv"),
    optypes.BACKWARD_SEND: (3, "pp backward-send"),
    optypes.BACKWARD_RECV: (4, "pp backward-recv"),
    optypes.PARAMS_ALL_GATHER: (5, "dp comm"),
    optypes.GRADS_REDUCE_SCATTER: (5, "dp comm"),
    optypes.SEPARATE_GRADS_ALL_REDUCE: (5, "dp comm"),
    optypes.ALL_TO_ALL: (7, "all-to-all"),
}
_OTHER_STREAM = (6, "other comm")
_STEP_GAP_S = 0.001


def timeline_events(
    model: JobModel,
    kind: str = "actual",
    *,
    steps: Sequence[int] | None = None,
    dp_ranks: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The trace-event JSON object of one replay.

    Parameters
    ----------
    model
        The job model.
    kind
        One of :data:`KINDS`.
    steps
        Step ids to export (default: all).
    dp_ranks
        DP ranks to export (default: all).
    """
    if kind not in KINDS:
        raise ValidationError(f"timeline kind {kind!r} is not one of {list(KINDS)}")
    step_idx = _select(model.steps, steps, "step")
    dp_idx = _select(np.arange(model.dp_size), dp_ranks, "dp rank")
    tpl = model.template
    scenario = {
        "actual": Scenario("actual", launch_delay=True),
        "original": Scenario("original"),
        "ideal": Scenario("ideal", keep=np.zeros((tpl.n_ops, 1), dtype=bool)),
    }[kind]
    start, end = Replayer(model).timeline(scenario)
    start, end = start[:, step_idx][:, :, dp_idx], end[:, step_idx][:, :, dp_idx]
    step_time = end.max(axis=(0, 2))
    offset = np.concatenate([[0.0], np.cumsum(step_time + _STEP_GAP_S)[:-1]])
    start_us = (start + offset[None, :, None]) * 1e6
    dur_us = (end - start) * 1e6
    events: list[dict[str, Any]] = []
    stages = range(model.pp_size)
    for d in dp_idx:
        for p in stages:
            pid = int(p) * model.dp_size + int(d)
            rank = int(model.worker_rank[p, d]) if model.worker_rank.size else -1
            label = f"dp {d} · stage {p}" + (f" (rank {rank})" if rank >= 0 else "")
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
            events.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
            )
            for tid, name in {*_STREAMS.values(), _OTHER_STREAM}:
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": name},
                    }
                )
    for op in range(tpl.n_ops):
        name = str(tpl.optype[op])
        tid = _STREAMS.get(name, _OTHER_STREAM)[0]
        cat = "comm" if tpl.is_comm[op] else "compute"
        p = int(tpl.stage[op])
        for si, s in enumerate(step_idx):
            for di, d in enumerate(dp_idx):
                events.append(
                    {
                        "ph": "X",
                        "name": name,
                        "cat": cat,
                        "pid": p * model.dp_size + int(d),
                        "tid": tid,
                        "ts": round(float(start_us[op, si, di]), 3),
                        "dur": round(float(dur_us[op, si, di]), 3),
                        "args": {"step": int(model.steps[s]), "seq_id": int(tpl.seq_id[op])},
                    }
                )
    return {
        "displayTimeUnit": "ms",
        "traceEvents": events,
        "metadata": {"replay": kind, "steps": [int(model.steps[s]) for s in step_idx]},
    }


def _select(values: np.ndarray, wanted: Sequence[int] | None, what: str) -> np.ndarray:
    if wanted is None:
        return np.arange(len(values))
    index = {int(v): i for i, v in enumerate(values)}
    missing = [w for w in wanted if int(w) not in index]
    if missing:
        shown = ", ".join(str(int(v)) for v in values[:10])
        raise ValidationError(f"{what}(s) {missing} not in the trace (it has {shown}…)")
    return np.array([index[int(w)] for w in wanted], dtype=np.int64)


def write_timeline(data: dict[str, Any], path: str | Path) -> Path:
    """Write trace-event JSON to ``path`` (gzipped when it ends in ``.gz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = orjson.dumps(data)
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path
