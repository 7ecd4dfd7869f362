"""The Kineto (PyTorch profiler) importer: real traces load, synthetic jobs round-trip."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import KINETO, need
from whatif_kineto_writer import write_kineto

from minder.core.errors import TraceError
from whatif import JobMeta, Trace, analyze, load_trace
from whatif.kineto import NCCL_KERNEL, read_rank
from whatif.synth import SynthJob, synthesize

_BIG = pytest.mark.slow  # 1.5–3 MB gzipped, a few seconds each to parse
REAL = [
    pytest.param("df_index_resolver_df_index_resolver.json.gz", marks=_BIG),
    "nccl_parser_config_nccl_data.json.gz",
    "negative_queue_length_values_check_rank0.json.gz",
    pytest.param("trace_diff_control_control.json.gz", marks=_BIG),
    pytest.param("trace_diff_test_test.json.gz", marks=_BIG),
    "trace_filter_sampled_rank-0.json.gz",
    "trace_filter_sampled_rank-1.json.gz",
]


def _nccl_kernels(path: Path) -> int:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "kernel" and NCCL_KERNEL.match(e["name"]))


@pytest.mark.parametrize("name", REAL)
def test_real_traces_load(name: str) -> None:
    path = need(KINETO / name)
    trace = load_trace(path)
    ops = trace.ops.to_frame()
    assert len(ops) > 0
    assert set(ops["optype"].astype(str)) >= {"forward-compute", "backward-compute"}
    assert (ops["duration"] >= 0).all()
    assert ops["step"].nunique() >= 2
    # Every NCCL kernel is a comm op, kept (and counted) inside compute, or dropped with a count.
    comm = int(
        ops["optype"]
        .isin(
            [
                "params-all-gather",
                "grads-reduce-scatter",
                "separate-grads-all-reduce",
                "optimizer-clip-main-grad",
                "forward-send",
                "forward-recv",
                "backward-send",
                "backward-recv",
                "all-to-all",
            ]
        )
        .sum()
    )

    def counted(word: str) -> int:
        return sum(
            int(n.split(f"{word} ")[1].split(" ")[0]) for n in trace.notes if f": {word} " in n
        )

    assert comm + counted("kept") + counted("dropped") >= _nccl_kernels(path)


def test_real_two_rank_job_matches_collectives() -> None:
    files = [
        need(KINETO / "trace_filter_sampled_rank-0.json.gz"),
        need(KINETO / "trace_filter_sampled_rank-1.json.gz"),
    ]
    trace = load_trace(files)
    assert trace.meta.dp_size == 2
    assert set(trace.ops["rank"]) == {0, 1}
    # The all-to-alls (SendRecv kernels inside nccl:all_to_all) are matched like all-reduce.
    assert any(
        "matched 10 collective(s) across ranks (alltoall ×4, allreduce ×4, allgather ×2)" in n
        for n in trace.notes
    )
    assert (trace.ops.to_frame()["optype"] == "all-to-all").sum() == 8
    assert trace.rank_stats is not None and list(trace.rank_stats["rank"]) == [0, 1]
    report = analyze(trace)
    assert report.verdict.cause in {
        "unreliable",
        "none",
        "undetermined",
        "worker",
        "communication",
        "stage",
        "sequence_length",
    }


def test_real_nccl_kernel_names_old_and_new() -> None:
    assert NCCL_KERNEL.match("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert NCCL_KERNEL.match("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert not NCCL_KERNEL.match("void at::native::vectorized_elementwise_kernel")


def _job() -> Trace:
    return synthesize(
        SynthJob(
            dp=2,
            pp=4,
            microbatches=4,
            steps=3,
            with_layernorm=False,
            with_embedding=False,
            with_gc=False,
            stage_factor={3: 1.5},
        )
    )


@pytest.mark.parametrize(
    ("directions", "new_names", "gz"),
    [(True, True, True), (False, False, False)],
)
def test_synthetic_job_round_trips(
    tmp_path: Path, directions: bool, new_names: bool, gz: bool
) -> None:
    original = _job()
    write_kineto(
        original, tmp_path, with_directions=directions, new_nccl_names=new_names, gzip_files=gz
    )
    back = load_trace(tmp_path, meta=JobMeta(dp_size=2, pp_size=4))
    keys = ["step", "dp_rank", "stage", "optype", "seq_id"]
    a, b = original.ops.to_frame(), back.ops.to_frame()
    a = a.assign(optype=a["optype"].astype(str)).sort_values(keys)
    b = b.assign(optype=b["optype"].astype(str)).sort_values(keys)
    assert len(a) == len(b)
    pd.testing.assert_frame_equal(a[keys].reset_index(drop=True), b[keys].reset_index(drop=True))
    shift = original.ops["start_ts"].min()
    np.testing.assert_allclose(
        b["start_ts"].to_numpy() + shift, a["start_ts"].to_numpy(), atol=1e-9
    )
    np.testing.assert_allclose(b["duration"].to_numpy(), a["duration"].to_numpy(), atol=1e-9)
    # Tensor-parallel all-reduces inside forward stay inside compute, and say so.
    assert any("kept 12 collective(s) inside compute (allreduce ×12)" in n for n in back.notes)
    assert analyze(back).slowdown == pytest.approx(analyze(original).slowdown, rel=1e-9)


def test_mismatched_collectives_are_refused(tmp_path: Path) -> None:
    write_kineto(_job(), tmp_path, gzip_files=False)
    path = tmp_path / "rank-4.json"
    data = json.loads(path.read_text())
    for event in data["traceEvents"]:
        if event.get("args", {}).get("Collective name") == "allgather":
            event["name"] = "ncclDevKernel_ReduceScatter_RING_LL_Sum_bf16"
            event["args"]["Collective name"] = "reduce_scatter"
            break
    path.write_text(json.dumps(data))
    with pytest.raises(
        TraceError,
        match=r"process group 'dp_stage2' in step 0 differs across "
        r"ranks \(rank 4: reducescatter, rank 5: allgather\)",
    ):
        load_trace(tmp_path, meta=JobMeta(dp_size=2, pp_size=4))


def test_unmatched_p2p_in_a_kineto_job_is_refused(tmp_path: Path) -> None:
    write_kineto(_job(), tmp_path, gzip_files=False)
    path = tmp_path / "rank-0.json"
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    first_send = next(
        i for i, e in enumerate(events) if e.get("args", {}).get("Collective name") == "send"
    )
    del events[first_send]
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="unmatched send/recv pairs in process group"):
        load_trace(tmp_path, meta=JobMeta(dp_size=2, pp_size=4))


def test_bad_files_are_refused(tmp_path: Path) -> None:
    no_events = tmp_path / "rank-0.json"
    no_events.write_text('{"schemaVersion": 1}')
    with pytest.raises(TraceError, match="no 'traceEvents' list"):
        read_rank(no_events)
    broken = tmp_path / "rank-1.json"
    broken.write_text("{not json")
    with pytest.raises(TraceError, match="cannot read a Kineto JSON trace"):
        read_rank(broken)
    anonymous = tmp_path / "trace.json"
    anonymous.write_text('{"traceEvents": []}')
    with pytest.raises(TraceError, match="cannot tell which rank"):
        read_rank(anonymous)


def test_duplicate_ranks_are_refused(tmp_path: Path) -> None:
    paths = write_kineto(_job(), tmp_path / "a", gzip_files=False)
    copy = tmp_path / "a" / "rank-0-again.json"
    copy.write_text(paths[0].read_text())
    with pytest.raises(TraceError, match="rank 0 appears twice"):
        load_trace(tmp_path / "a", meta=JobMeta(dp_size=2, pp_size=4))


def test_tp_ranks_beyond_the_first_are_not_used(tmp_path: Path) -> None:
    # World 16 = dp 2 × pp 4 × tp 2: write the job as TP rank 0 files, add a TP-rank-1 file.
    job = _job()
    paths = write_kineto(job, tmp_path, gzip_files=False)
    remapped = []
    for path in paths:
        data = json.loads(path.read_text())
        rank = data["distributedInfo"]["rank"] * 2
        data["distributedInfo"] = {"rank": rank, "world_size": 16}
        target = tmp_path / f"tp-rank-{rank}.json"
        target.write_text(json.dumps(data))
        remapped.append(target)
        path.unlink()
    extra = json.loads(remapped[0].read_text())
    extra["distributedInfo"]["rank"] = 1
    (tmp_path / "tp-rank-1.json").write_text(json.dumps(extra))
    trace = load_trace(tmp_path, meta=JobMeta(dp_size=2, pp_size=4, tp_size=2))
    assert any("1 other rank trace(s) not used" in n for n in trace.notes)
    assert analyze(trace).slowdown == pytest.approx(analyze(job).slowdown, rel=1e-9)


def test_enclosing_cpu_ops_are_found_through_nesting() -> None:
    from whatif.kineto import _Intervals

    iv = _Intervals()
    iv.add(5, 0.0, 100.0, 0)  # nccl:all_reduce
    iv.add(5, 2.0, 6.0, 1)  # record_param_comms inside it, over before the launch
    iv.add(5, 20.0, 30.0, 2)  # a later, unrelated op inside it
    iv.add(5, 200.0, 210.0, 3)
    iv.freeze()
    ts = np.array([4.0, 10.0, 25.0, 150.0, 205.0, -1.0])
    assert iv.find(5, ts).tolist() == [1, 0, 2, -1, 3, -1]
    assert iv.payloads(5, int(iv.innermost(5, np.array([4.0]))[0])) == [1, 0]
    assert iv.find("other thread", ts).tolist() == [-1] * 6
