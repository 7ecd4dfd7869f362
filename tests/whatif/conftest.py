"""Shared fixtures of the what-if tests: the artifact's published traces and their outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from whatif import Trace, analyze, load_trace
from whatif.report import WhatIfReport

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
WIA = DATA / "bytedance-straggler-wia"
KINETO = DATA / "hta-kineto-traces"


def need(path: Path) -> Path:
    """``path``, or skip the test when the shared data is not next to the repository."""
    if not path.exists():
        pytest.skip(f"shared test data {path} is absent (expected ../shared/data beside the repo)")
    return path


def published(name: str, kind: str) -> dict[str, Any]:
    """The artifact's published output ``kind`` (result, mw, ms) for trace ``name``."""
    data: dict[str, Any] = json.loads(need(WIA / f"{kind}-{name}.json").read_text())
    return data


@pytest.fixture(scope="session")
def st_trace() -> Trace:
    return load_trace(need(WIA / "trace-ST.parquet"))


@pytest.fixture(scope="session")
def se_trace() -> Trace:
    return load_trace(need(WIA / "trace-SE.parquet"))


@pytest.fixture(scope="session")
def st_report(st_trace: Trace) -> WhatIfReport:
    return analyze(st_trace, what_ifs=["pp-comm:free", "dp-comm:free"])


@pytest.fixture(scope="session")
def se_report(se_trace: Trace) -> WhatIfReport:
    return analyze(se_trace)
