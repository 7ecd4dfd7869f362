"""Custom what-ifs: parsing and their effect on the replay."""

from __future__ import annotations

import pytest

from minder.core.errors import ValidationError
from whatif import WhatIf, analyze, build_model, what_if
from whatif.synth import SynthJob, synthesize


@pytest.fixture(scope="module")
def slow_worker_trace():  # type: ignore[no-untyped-def]
    return synthesize(SynthJob(dp=4, pp=2, microbatches=4, slow_workers={(1, 2): 1.5}))


def test_parse_specs() -> None:
    w = WhatIf.parse("stage=3,dp=1:faster=20%")
    assert (w.stages, w.dp_ranks, w.optypes) == ((3,), (1,), None)
    assert w.factor == pytest.approx(1 / 1.2)
    assert WhatIf.parse("pp-comm:free").optypes == (
        "forward-send",
        "forward-recv",
        "backward-send",
        "backward-recv",
    )
    assert WhatIf.parse("pp-comm:free").factor == 0.0
    w = WhatIf.parse("optype=forward-compute|backward-compute,stage=0|1:scale=0.5")
    assert w.optypes == ("forward-compute", "backward-compute") and w.stages == (0, 1)
    assert WhatIf.parse("rank=6:slower=10%").factor == pytest.approx(1.1)
    assert WhatIf.parse("all:ideal").to_ideal


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("stage=3", "expected SELECTORS:EFFECT"),
        ("stage=x:free", "stage needs integers"),
        ("colour=red:free", "unknown key 'colour'"),
        ("bogus:free", "unknown selector 'bogus'"),
        ("optype=moe:free", r"unknown op type\(s\) \['moe'\]"),
        ("stage=1:teleport", "unknown effect 'teleport'"),
        ("stage=1:scale=-2", "factor must be a finite number"),
    ],
)
def test_bad_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WhatIf.parse(spec)


def test_selecting_nothing_is_refused(slow_worker_trace) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="dp rank"):
        what_if(slow_worker_trace, "dp=9:free")
    with pytest.raises(ValidationError, match="selects no op"):
        what_if(slow_worker_trace, "stage=5:free")
    with pytest.raises(ValidationError, match=r"rank\(s\) \[99\] not in the trace"):
        what_if(slow_worker_trace, "rank=99:free")


def test_faster_slow_worker_recovers_time(slow_worker_trace) -> None:  # type: ignore[no-untyped-def]
    model = build_model(slow_worker_trace)
    fixed = what_if(model, "stage=1,dp=2,compute:faster=50%")
    assert fixed.speedup > 1.1
    rank = int(model.worker_rank[1, 2])
    by_rank = what_if(model, f"rank={rank},compute:faster=50%")
    assert by_rank.step_time == pytest.approx(fixed.step_time)
    neutral = what_if(model, "all:scale=1")
    assert neutral.speedup == pytest.approx(1.0)
    other = what_if(model, "stage=0,dp=0,compute:faster=50%")
    assert other.speedup < fixed.speedup  # speeding up a healthy worker barely helps


def test_ideal_for_everything_equals_the_ideal_replay(slow_worker_trace) -> None:  # type: ignore[no-untyped-def]
    report = analyze(slow_worker_trace, what_ifs=["all:ideal", "comm:free"])
    ideal, free = report.whatifs
    assert ideal.slowdown_after == pytest.approx(1.0)
    assert ideal.speedup == pytest.approx(report.slowdown)
    assert free.speedup > 1.0
