"""The runner of ``minder selfcheck run`` (collectors/selfcheck/runner.py) and the report it builds,
checked against the documented JSON Schema (docs/selfcheck-report.schema.json).

The default checks really run here (a CPU matmul, the clock, the disks; the rest say why they are
skipped). The checks that crash, hang or answer out of bounds are small :class:`Check` classes of
this file: the runner's own behaviour is under test, not theirs.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from collectors.selfcheck.base import (
    CHECK_NAMES,
    CHECKS,
    PARTNER_CHECKS,
    Check,
    CheckContext,
    CheckOptions,
    result,
)
from collectors.selfcheck.runner import (
    CollectiveCheck,
    build_context,
    load_check,
    plan_from_environ,
    run_checks,
    run_one,
    select_checks,
)
from minder.core.errors import ValidationError
from minder.core.selfcheck import (
    MAX_MEASUREMENTS,
    CheckResult,
    CheckStatus,
    SelfCheckReport,
    Verdict,
)

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "docs" / "selfcheck-report.schema.json"
SMALL = CheckOptions(matmul_size_cpu=128, matmul_warmup=1, matmul_repeats=3)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


class Passes(Check):
    name = "host.disk"

    def run(self, context: CheckContext) -> CheckResult:
        return result(self.name, CheckStatus.PASS, "fine", {"x": 1})


class Crashes(Check):
    name = "gpu.dcgm"

    def run(self, context: CheckContext) -> CheckResult:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")


class Hangs(Check):
    name = "gpu.nvml"

    def __init__(self) -> None:
        self.released = threading.Event()

    def run(self, context: CheckContext) -> CheckResult:
        self.released.wait(30)  # a driver call that never returns
        return result(self.name, CheckStatus.PASS, "too late")


class Absent(Check):
    name = "network.rdma"

    def unavailable(self, context: CheckContext) -> str | None:
        return "no RDMA device here"

    def run(self, context: CheckContext) -> CheckResult:
        raise AssertionError("a check that is unavailable is not run")


class Chatty(Check):
    name = "network.ib_write_bw"

    def __init__(self, count: int) -> None:
        self.count = count

    def run(self, context: CheckContext) -> CheckResult:
        return result(self.name, CheckStatus.PASS, "ok", {f"m{i}": i for i in range(self.count)})


class Misnamed(Check):
    name = "host.clock"

    def run(self, context: CheckContext) -> CheckResult:
        return result("host.other", CheckStatus.PASS, "ok")


class BadMeasurement(Check):
    name = "host.memory_ecc"

    def run(self, context: CheckContext) -> CheckResult:
        return CheckResult(self.name, CheckStatus.PASS, "ok", {"bad key!": 1})


# -- choosing checks -------------------------------------------------------------------------


def test_every_registered_check_loads_under_its_name() -> None:
    assert CHECK_NAMES[0] == "collective.allreduce"  # the rendezvous first
    for name in CHECKS:
        check = load_check(name)
        assert check.name == name
        assert check.description


def test_checks_are_chosen_in_the_registrys_order() -> None:
    assert select_checks() == list(CHECK_NAMES)
    assert select_checks(["host.disk", "gpu.matmul"]) == ["gpu.matmul", "host.disk"]
    assert "gpu.dcgm" not in select_checks(skip=["gpu.dcgm"])
    assert select_checks(partner=True) == list(PARTNER_CHECKS)
    assert select_checks(["host.disk"], partner=True) == []
    with pytest.raises(ValidationError, match=r"check 'gpu\.bogus': expected one of"):
        select_checks(["gpu.bogus"])


# -- one check -------------------------------------------------------------------------------


def test_a_crashing_check_gives_an_error_in_one_line() -> None:
    got = run_one(Crashes(), CheckContext(timeout_s=10))
    assert got.status is CheckStatus.ERROR
    assert got.summary == (
        "crashed: RuntimeError: CUDA error: an illegal memory access was encountered more lines"
    )
    assert got.duration_s >= 0


def test_a_hanging_check_times_out_and_the_run_goes_on() -> None:
    hangs = Hangs()
    began = time.monotonic()
    got = run_one(hangs, CheckContext(timeout_s=0.5))
    took = time.monotonic() - began
    hangs.released.set()
    assert got.status is CheckStatus.ERROR
    assert got.summary == "timed out: no answer within 0.5 s"
    assert 0.4 < took < 5
    assert 0.4 < got.duration_s < 5


def test_an_unavailable_check_is_skipped_with_its_reason() -> None:
    got = run_one(Absent(), CheckContext())
    assert (got.status, got.summary) == (CheckStatus.SKIPPED, "no RDMA device here")


def test_results_are_made_to_fit_the_report() -> None:
    capped = run_one(Chatty(MAX_MEASUREMENTS + 10), CheckContext())
    assert capped.status is CheckStatus.PASS
    assert len(capped.measurements) == MAX_MEASUREMENTS
    assert capped.measurements["measurements_dropped"] == 11
    misnamed = run_one(Misnamed(), CheckContext())
    assert misnamed.status is CheckStatus.ERROR and "host.other" in misnamed.summary
    bad = run_one(BadMeasurement(), CheckContext())
    assert bad.status is CheckStatus.ERROR
    assert bad.summary.startswith("gave a malformed result: host.memory_ecc.measurements key")


# -- a run -----------------------------------------------------------------------------------


def test_a_run_decides_its_verdict_and_tells_its_progress() -> None:
    seen: list[tuple[str, str | None]] = []
    report = run_checks(
        [Passes(), Absent()],
        CheckContext(),
        node="n7",
        check_id="abc123",
        progress=lambda name, r: seen.append((name, None if r is None else r.status.value)),
    )
    assert report.verdict is Verdict.PASS
    assert report.node == "n7" and report.check_id == "abc123"
    assert report.finished_ts >= report.started_ts
    assert seen == [
        ("host.disk", None),
        ("host.disk", "pass"),
        ("network.rdma", None),
        ("network.rdma", "skipped"),
    ]
    crashed = run_checks([Passes(), Crashes()], CheckContext(), node="n7")
    assert crashed.verdict is Verdict.INCONCLUSIVE
    assert crashed.reason.startswith("gpu.dcgm gave no answer: crashed: RuntimeError")
    nothing = run_checks([Absent()], CheckContext(), node="n7")
    assert nothing.verdict is Verdict.INCONCLUSIVE


def test_a_run_out_of_time_does_not_start_the_remaining_checks() -> None:
    hangs = Hangs()
    began = time.monotonic()
    report = run_checks([hangs, Passes()], CheckContext(), node="n7", timeout_s=1.0)
    hangs.released.set()
    assert time.monotonic() - began < 5
    hung, rest = report.checks
    assert hung.status is CheckStatus.ERROR and hung.summary.startswith("timed out")
    assert rest.status is CheckStatus.ERROR
    assert rest.summary == "not run: the run's 1 s (MINDER_SELFCHECK_TIMEOUT_S) were spent"
    assert report.verdict is Verdict.INCONCLUSIVE


# -- the launch ------------------------------------------------------------------------------


def test_the_plan_comes_from_the_launchs_variables() -> None:
    suspect = plan_from_environ(
        {
            "MINDER_SELFCHECK_NODE": "n7",
            "MINDER_SELFCHECK_SUSPECT": "n7",
            "MINDER_SELFCHECK_CHECK_ID": "c1",
            "MINDER_SELFCHECK_TIMEOUT_S": "120",
        }
    )
    assert (suspect.node, suspect.check_id, suspect.timeout_s) == ("n7", "c1", 120.0)
    assert suspect.is_suspect and not suspect.is_partner
    partner = plan_from_environ({"SLURMD_NODENAME": "n3", "MINDER_SELFCHECK_SUSPECT": "n7"})
    assert partner.node == "n3" and partner.is_partner
    by_hand = plan_from_environ({}, check_id="given")
    assert by_hand.is_suspect and by_hand.suspect is None and by_hand.check_id == "given"
    for bad in ("soon", "-5", "inf"):
        with pytest.raises(ValidationError, match="MINDER_SELFCHECK_TIMEOUT_S="):
            plan_from_environ({"MINDER_SELFCHECK_TIMEOUT_S": bad})


def test_the_context_takes_options_and_baselines(tmp_path: Path) -> None:
    baselines = tmp_path / "b.json"
    baselines.write_text(json.dumps({"NVIDIA H100 PCIe": 600, "cpu": 1.0}))
    context = build_context(
        {
            "MINDER_SELFCHECK_BASELINE_CPU": "2.5",
            "MINDER_SELFCHECK_HOST_TYPO": "1",  # not an option: ignored
            "MINDER_SELFCHECK_CLOCK_MAX_OFFSET_S": "0.5",
        },
        baseline_file=baselines,
    )
    assert context.baselines == {"nvidia h100 pcie": 600.0, "cpu": 2.5}  # the variable wins
    assert context.options.clock_max_offset_s == 0.5
    with pytest.raises(ValidationError, match="MINDER_SELFCHECK_DISK_MIN_FREE_BYTES"):
        build_context({"MINDER_SELFCHECK_DISK_MIN_FREE_BYTES": "lots"})


def test_the_collective_check_of_a_world_of_one_says_no_partner() -> None:
    got = run_one(CollectiveCheck(), CheckContext(environ={}, timeout_s=30))
    assert got.status is CheckStatus.SKIPPED
    assert got.summary == "no healthy partner was available"


def test_without_its_module_the_collective_check_is_skipped_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "collectors.selfcheck.collective", None)
    got = run_one(CollectiveCheck(), CheckContext(timeout_s=10))
    assert (got.status, got.summary) == (
        CheckStatus.SKIPPED,
        "collectors.selfcheck.collective is missing",
    )


# -- the report and its schema ---------------------------------------------------------------


def _real_reports(tmp_path: Path) -> list[SelfCheckReport]:
    """Reports of the default checks run here: as they are (pass), with a matmul baseline the
    machine cannot reach (fail), and with a check that crashes (inconclusive)."""
    context = build_context({"PATH": "/usr/bin:/bin"})
    checks = [load_check(name) for name in select_checks()]
    healthy = run_checks(checks, context, node="n7", check_id="c1", timeout_s=300)
    forced = build_context({"MINDER_SELFCHECK_BASELINE_CPU": "1000000"})
    failing = run_checks(
        [load_check("gpu.matmul")],
        CheckContext(environ=forced.environ, options=SMALL, baselines=forced.baselines),
        node="n7",
    )
    crashed = run_checks([Passes(), Crashes()], CheckContext(), node="n7")
    return [healthy, failing, crashed]


def test_real_reports_follow_the_documented_schema_and_the_api_contract(
    tmp_path: Path, validator: jsonschema.Draft202012Validator
) -> None:
    healthy, failing, crashed = _real_reports(tmp_path)
    assert [c.name for c in healthy.checks] == list(CHECK_NAMES)
    statuses = {c.name: c.status for c in healthy.checks}
    assert statuses["gpu.matmul"] is CheckStatus.PASS  # the CPU fallback really ran
    assert statuses["host.disk"] is CheckStatus.PASS
    assert healthy.verdict is Verdict.PASS, healthy.reason
    assert failing.verdict is Verdict.FAIL and failing.failing() == ["gpu.matmul"]
    assert crashed.verdict is Verdict.INCONCLUSIVE
    for report in (healthy, failing, crashed):
        data = json.loads(json.dumps(report.to_dict()))  # as it goes over the wire
        validator.validate(data)
        assert SelfCheckReport.from_dict(data) == report  # and the API's parser takes it


def _bad_reports(good: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
    bad: list[tuple[str, dict[str, object]]] = []

    def variant(why: str, change: object) -> None:
        data = copy.deepcopy(good)
        change(data)  # type: ignore[operator]
        bad.append((why, data))

    variant("no verdict", lambda d: d.pop("verdict"))
    variant("a verdict its checks do not give", lambda d: d.update(verdict="fail"))
    variant("another version", lambda d: d.update(schema_version=2))
    variant("an unknown field", lambda d: d.update(extra=1))
    variant("an empty node", lambda d: d.update(node=""))
    variant("a bad check name", lambda d: d["checks"][0].update(name="GPU Matmul"))
    variant("an unknown status", lambda d: d["checks"][0].update(status="ok"))
    variant("a nested measurement", lambda d: d["checks"][0]["measurements"].update(x={"a": 1}))
    variant(
        "a measurement name with a space",
        lambda d: d["checks"][0]["measurements"].update({"a b": 1}),
    )
    variant("a negative duration", lambda d: d["checks"][0].update(duration_s=-1))
    variant("a check without its summary", lambda d: d["checks"][0].pop("summary"))
    variant(
        "a failed check with a pass verdict",
        lambda d: d["checks"][0].update(status="fail"),
    )
    variant(
        "an error with a pass verdict",
        lambda d: d["checks"][0].update(status="error"),
    )
    variant("too many checks", lambda d: d.update(checks=d["checks"] * 65))
    return bad


def test_the_schema_refuses_malformed_reports(validator: jsonschema.Draft202012Validator) -> None:
    good = run_checks([Passes(), Absent()], CheckContext(), node="n7").to_dict()
    validator.validate(good)
    for why, data in _bad_reports(good):
        errors = list(validator.iter_errors(data))
        assert errors, f"the schema accepted a report with {why}"
    empty = dict(good, checks=[], verdict="inconclusive", reason="no check could run here")
    validator.validate(empty)
    assert not validator.is_valid(dict(empty, verdict="pass"))
