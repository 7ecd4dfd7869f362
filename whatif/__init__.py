"""What-if straggler analysis of job traces. Imports only ``minder.core`` of ours.

Typical use::

    from whatif import analyze, load_trace

    report = analyze(load_trace("trace-ST.parquet"))
    report.slowdown, report.verdict.cause, report.to_dict()

See ``docs/whatif-method.md`` for the method (Lin et al., OSDI '25).
"""

from whatif.analysis import analyze, analyze_path, what_if
from whatif.loading import load_trace
from whatif.model import JobModel, build_model
from whatif.report import WhatIfReport
from whatif.scenarios import ProgressFn
from whatif.trace import JobMeta, OpsTable, Trace, make_trace, read_canonical, write_canonical
from whatif.verdict import Thresholds, Verdict
from whatif.whatifs import WhatIf

__all__ = [
    "JobMeta",
    "JobModel",
    "OpsTable",
    "ProgressFn",
    "Thresholds",
    "Trace",
    "Verdict",
    "WhatIf",
    "WhatIfReport",
    "analyze",
    "analyze_path",
    "build_model",
    "load_trace",
    "make_trace",
    "read_canonical",
    "what_if",
    "write_canonical",
]
