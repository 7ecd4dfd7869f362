"""Golden checks against the what-if paper artifact's published outputs (ST and SE traces)."""

from __future__ import annotations

import pytest
from conftest import published

from whatif import Trace, build_model
from whatif.analysis import recorded_step_times
from whatif.report import WhatIfReport

REL = 0.01  # the tolerance: within 1 % of the published value


def close(mine: float, theirs: float, rel: float = REL) -> bool:
    return abs(mine / theirs - 1) <= rel


@pytest.fixture(params=["ST", "SE"])
def case(request: pytest.FixtureRequest) -> tuple[str, WhatIfReport]:
    name = request.param
    return name, request.getfixturevalue(f"{name.lower()}_report")


def test_actual_replay_reproduces_every_step(case: tuple[str, WhatIfReport]) -> None:
    name, report = case
    base = published(name, "result")["step_t_base"]
    assert len(report.per_step) == len(base)
    for step in report.per_step:
        # The published step times are the trace's own (float32) step times.
        assert step.actual == pytest.approx(base[str(step.step)], abs=2e-6)
        assert step.actual == pytest.approx(step.recorded, abs=1e-9)
    assert report.replay_error < 1e-9


def test_original_and_ideal_replays_per_step(case: tuple[str, WhatIfReport]) -> None:
    name, report = case
    result = published(name, "result")
    for step in report.per_step:
        assert close(step.original, result["step_t_nodelay"][str(step.step)], 1e-4)
        assert close(step.ideal, result["step_t_noblk"][str(step.step)], 1e-4)


def test_slowdown_and_model_error(case: tuple[str, WhatIfReport]) -> None:
    name, report = case
    result = published(name, "result")
    assert close(report.slowdown, result["blocking_slowdown"])
    assert report.waste == pytest.approx(1 - 1 / report.slowdown)
    assert close(1 + report.model_error, result["launch_slowdown"])
    for step in report.per_step:
        assert close(step.slowdown, result["blocking_step_slowdown"][str(step.step)])


@pytest.mark.parametrize(
    ("attribute", "key"),
    [
        ("by_optype", "blocking_decompose_by_optype"),
        ("by_dp_rank", "blocking_decompose_by_dp_rank"),
        ("by_stage", "blocking_decompose_by_stage"),
    ],
)
def test_decompositions(case: tuple[str, WhatIfReport], attribute: str, key: str) -> None:
    name, report = case
    expected = published(name, "result")[key]
    mine = {str(k): v for k, v in getattr(report, attribute).items()}
    assert set(mine) == set(expected)
    for group, value in expected.items():
        assert close(mine[group], value), (group, mine[group], value)


def test_decompositions_per_step(case: tuple[str, WhatIfReport]) -> None:
    name, report = case
    result = published(name, "result")
    for step in report.per_step:
        for attr, key in (
            ("by_stage", "stage"),
            ("by_dp_rank", "dp_rank"),
            ("by_optype", "optype"),
        ):
            expected = result[f"blocking_decompose_by_{key}_per_step"][str(step.step)]
            mine = {str(k): v for k, v in getattr(step, attr).items()}
            for group, value in expected.items():
                assert close(mine[group], value), (step.step, group)


@pytest.mark.parametrize("metric", ["mw", "ms"])
def test_root_cause_metrics(case: tuple[str, WhatIfReport], metric: str) -> None:
    name, report = case
    expected = published(name, metric)
    removal = getattr(report, metric)
    assert close(removal.value, expected["rem"])
    assert close(removal.add, expected["add"])
    assert close(removal.t_removed, expected["trem"])
    assert close(removal.t_added, expected["tadd"])
    assert close(removal.t_original, expected["tori"])
    assert close(removal.t_ideal, expected["tideal"])


def test_st_verdict_is_last_stage_imbalance(st_report: WhatIfReport) -> None:
    verdict = st_report.verdict
    assert verdict.cause == "stage"
    assert verdict.target == {"stage": 3}
    assert st_report.meta.pp_size - 1 == 3
    assert "stage 3" in verdict.summary


def test_se_verdict_is_sequence_length_imbalance(se_report: WhatIfReport) -> None:
    verdict = se_report.verdict
    assert verdict.cause == "sequence_length"
    assert verdict.evidence.fwd_bwd_correlation is not None
    assert verdict.evidence.fwd_bwd_correlation >= verdict.thresholds.seq_correlation


def test_st_custom_what_ifs_match_the_artifact_notebook(st_report: WhatIfReport) -> None:
    # docs/whatif-method.md §3.7: all PP comm free → 1.0013×, all DP comm free → 1.039×.
    speedups = {w.name: w.speedup for w in st_report.whatifs}
    assert speedups["pp-comm:free"] == pytest.approx(1.0013, abs=5e-4)
    assert speedups["dp-comm:free"] == pytest.approx(1.039, abs=5e-4)


def test_worker_scores_are_min_of_dp_and_stage(st_report: WhatIfReport) -> None:
    for w in st_report.by_worker:
        assert w.slowdown == pytest.approx(
            min(st_report.by_dp_rank[w.dp_rank], st_report.by_stage[w.stage])
        )
    top = max(st_report.by_worker, key=lambda w: w.slowdown)
    assert (top.stage, top.dp_rank) == (3, 1)
    assert top.exact is not None and top.exact > 1.2  # only the slow stage's worker original


def test_report_json_has_the_design_keys(st_report: WhatIfReport) -> None:
    data = st_report.to_dict()
    for key in (
        "slowdown",
        "waste",
        "model_error",
        "by_optype",
        "by_dp_rank",
        "by_stage",
        "by_worker",
        "mw",
        "ms",
        "verdict",
        "per_step",
    ):
        assert key in data
    assert data["verdict"]["cause"] == "stage"
    assert len(data["by_worker"]) == 8


def test_model_is_vectorised_over_one_mp_group(st_trace: Trace, se_trace: Trace) -> None:
    st, se = build_model(st_trace), build_model(se_trace)
    # One template per step of one model-parallel group; every DP rank and step shares it.
    assert st.template.n_ops * st.n_steps * st.dp_size == len(st_trace.ops)
    assert se.template.n_ops * se.n_steps * se.dp_size == len(se_trace.ops)
    assert st.template.n_ops == 106
    assert (recorded_step_times(st) > 0).all()


def test_service_entry_point_analyses_a_path() -> None:
    from conftest import WIA, need

    from whatif import analyze_path

    report = analyze_path(need(WIA / "trace-ST.parquet"), what_ifs=["pp-comm:free"])
    data = report.to_dict()
    assert data["slowdown"] == pytest.approx(published("ST", "result")["blocking_slowdown"])
    assert data["whatifs"][0]["name"] == "pp-comm:free"


def test_optional_columns_are_derived(tmp_path, st_report: WhatIfReport) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd
    from conftest import WIA, need

    from whatif import load_trace

    frame = pd.read_parquet(need(WIA / "trace-ST.parquet"))
    path = tmp_path / "trace-bare.parquet"
    frame.drop(columns=["rank", "seq_id", "mc", "gmc", "mb_id"]).to_parquet(path)
    (tmp_path / "meta-bare.yaml").write_text((WIA / "meta-ST.yaml").read_text())
    trace = load_trace(path)
    assert (trace.ops["rank"] == -1).all()
    from whatif import analyze

    assert analyze(trace).slowdown == pytest.approx(st_report.slowdown, rel=1e-12)
