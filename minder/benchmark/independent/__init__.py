"""A second, independent generator of labelled jobs and its benchmark suites (``minder bench
detect --suite independent``), reported apart from the tuned suites.

Public API::

    cases = build_independent_suite("independent", seed=0, interval_s=15)  # cases.py
    table, labels = cases[0].table(), cases[0].labels()                    # generator.py
    result = run_independent(BenchOptions(suite="independent", intervals=(1, 60)))  # run.py
    render_independent(result, console); markdown_independent(result)     # report.py
"""

from minder.benchmark.independent.cases import (
    INDEPENDENT_STREAM,
    INTERVALS,
    SUITES,
    IndependentCase,
    build_independent_suite,
)
from minder.benchmark.independent.generator import (
    FAULT_KINDS,
    LABEL_COLUMNS,
    FaultSpec,
    Halt,
    JobSpec,
    Pattern,
    generate_table,
    job_labels,
)

__all__ = [
    "FAULT_KINDS",
    "INDEPENDENT_STREAM",
    "INTERVALS",
    "LABEL_COLUMNS",
    "SUITES",
    "FaultSpec",
    "Halt",
    "IndependentCase",
    "JobSpec",
    "Pattern",
    "build_independent_suite",
    "generate_table",
    "job_labels",
]
