"""``minder bench detect``: a labelled detection benchmark on simulated jobs.

Public API::

    cases = build_suite("standard", seed=0)           # labelled scenarios (suite.py)
    result = replay(case.scenario, method_factory())  # alerts + CPU of one case (replay.py)
    summary = summarize(runs)                         # P/R/F1, latency, FA, CPU (evaluate.py)
    bench = run_benchmark(BenchOptions(suite="quick", methods=("minder", "ecod")))
    render(bench, console); markdown(bench)           # tables (report.py)
"""

from minder.benchmark.evaluate import CaseRun, Summary, match_case, summarize
from minder.benchmark.replay import ReplayResult, replay, simulate
from minder.benchmark.runner import BenchOptions, BenchResult, Variant, run_benchmark
from minder.benchmark.suite import (
    FAIL_SLOW,
    FAIL_STOP,
    SUITES,
    TABLE1_SHARES,
    BenchCase,
    build_suite,
    build_training_suite,
)

__all__ = [
    "FAIL_SLOW",
    "FAIL_STOP",
    "SUITES",
    "TABLE1_SHARES",
    "BenchCase",
    "BenchOptions",
    "BenchResult",
    "CaseRun",
    "ReplayResult",
    "Summary",
    "Variant",
    "build_suite",
    "build_training_suite",
    "match_case",
    "replay",
    "run_benchmark",
    "simulate",
    "summarize",
]
