"""Runs the checks of ``minder selfcheck run`` and builds the node's report (docs/selfcheck.md).

:func:`run_checks` runs each check in turn with a time allowance: a check that raises gives an
``error`` result with a one-line summary, a check that does not answer within its allowance gives
an ``error`` saying so (its thread is left behind; the process ends soon after), and every result
is made to fit the report's bounds, so that the report always goes out and the API always takes
it. :class:`~minder.core.selfcheck.SelfCheckReport.of` then decides the verdict.

:func:`plan_from_environ` reads the launch's variables (docs/selfcheck.md, "The command"): this
node's name, the suspect's, the check id and the whole run's wall time. A partner node (not the
suspect) runs the collective check only.
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from collectors.selfcheck.base import (
    CHECK_ID_ENV,
    CHECK_NAMES,
    CHECKS,
    PARTNER_CHECKS,
    SUSPECT_ENV,
    TIMEOUT_ENV,
    Check,
    CheckContext,
    CheckOptions,
    node_name,
    one_line,
    result,
    skipped,
)
from collectors.selfcheck.gpu import baselines_from_environ, load_baseline_file
from minder.core.errors import MinderError, ValidationError
from minder.core.selfcheck import (
    MAX_MEASUREMENTS,
    CheckResult,
    CheckStatus,
    SelfCheckReport,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 900.0
"""Wall time of a whole run when ``MINDER_SELFCHECK_TIMEOUT_S`` is not set."""
REPORT_RESERVE_S = 10.0
"""Seconds of the whole run kept, at most, for printing and posting the report (10 % of a
shorter run)."""

Progress = Callable[[str, CheckResult | None], None]
"""Told ``(name, None)`` when a check starts and ``(name, result)`` when it ends."""


# -- the collective check (another module's function) -----------------------------------------


class CollectiveCheck(Check):
    """``collective.allreduce``: an all-reduce among the suspect and healthy partners
    (:func:`collectors.selfcheck.collective.run_collective_check`, imported when it runs).

    That function reads the rendezvous from the environment and says ``skipped`` itself when the
    world is one node or torch is absent.
    """

    name = "collective.allreduce"
    description = "all-reduce among the suspect and healthy partners, two rounds (2× median rule)"

    def run(self, context: CheckContext) -> CheckResult:
        try:
            module = importlib.import_module("collectors.selfcheck.collective")
        except ImportError as exc:
            if getattr(exc, "name", None) == "collectors.selfcheck.collective":
                return skipped(self.name, "collectors.selfcheck.collective is missing")
            return skipped(
                self.name, f"collectors.selfcheck.collective cannot be imported: {one_line(exc)}"
            )
        run: Callable[..., CheckResult] = module.run_collective_check
        options = module.CollectiveOptions(threshold=context.options.collective_threshold)
        return run(context.environ, timeout_s=context.timeout_s, options=options)


# -- choosing checks -------------------------------------------------------------------------


def load_check(name: str) -> Check:
    """The default check ``name`` (its module imported now)."""
    module, attribute = CHECKS[name]
    cls = getattr(importlib.import_module(module), attribute)
    check = cls()
    assert isinstance(check, Check)
    return check


def select_checks(
    only: Sequence[str] = (), skip: Sequence[str] = (), *, partner: bool = False
) -> list[str]:
    """The names of the checks to run, in the registry's order: ``only`` (all when empty) less
    ``skip``; a partner runs :data:`~collectors.selfcheck.base.PARTNER_CHECKS` only.

    Raises
    ------
    ValidationError
        A name is not a check's.
    """
    for name in (*only, *skip):
        if name not in CHECKS:
            raise ValidationError(
                f"check {one_line(name, 64)!r}: expected one of {', '.join(CHECK_NAMES)}"
            )
    wanted = [n for n in CHECK_NAMES if (not only or n in only) and n not in skip]
    if partner:
        wanted = [n for n in wanted if n in PARTNER_CHECKS]
    return wanted


# -- the launch ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunPlan:
    """Who this node is in the check, from the launch's variables.

    Attributes
    ----------
    node
        This node's name (``MINDER_SELFCHECK_NODE``, ``SLURMD_NODENAME`` or the host name).
    suspect
        The suspect's name (``MINDER_SELFCHECK_SUSPECT``); None for a run by hand, whose node is
        then the suspect.
    check_id
        The service's id of the check (``--check-id`` or ``MINDER_SELFCHECK_CHECK_ID``).
    timeout_s
        Wall time of the whole run (``MINDER_SELFCHECK_TIMEOUT_S``).
    """

    node: str
    suspect: str | None
    check_id: str | None
    timeout_s: float

    @property
    def is_suspect(self) -> bool:
        return self.suspect is None or self.suspect == self.node

    @property
    def is_partner(self) -> bool:
        return not self.is_suspect


def plan_from_environ(environ: Mapping[str, str], *, check_id: str | None = None) -> RunPlan:
    """This node's part in the check (see :class:`RunPlan`).

    Raises
    ------
    ValidationError
        ``MINDER_SELFCHECK_TIMEOUT_S`` is not a positive number.
    """
    raw = environ.get(TIMEOUT_ENV)
    timeout = DEFAULT_TIMEOUT_S
    if raw is not None and raw.strip():
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValidationError(
                f"{TIMEOUT_ENV}={one_line(raw, 40)!r}: expected a positive number of seconds"
            )
    suspect = environ.get(SUSPECT_ENV, "").strip() or None
    given = check_id if check_id is not None else environ.get(CHECK_ID_ENV, "").strip() or None
    return RunPlan(node_name(environ), suspect, given, timeout)


def build_context(
    environ: Mapping[str, str],
    *,
    baseline_file: Path | None = None,
    sysfs_root: Path = Path("/sys"),
    dev_root: Path = Path("/dev"),
    kmsg_path: Path = Path("/dev/kmsg"),
) -> CheckContext:
    """The checks' context: options from ``MINDER_SELFCHECK_*``, baselines from ``baseline_file``
    under ``MINDER_SELFCHECK_BASELINE_*`` (the variables win).

    Raises
    ------
    ValidationError
        An option, the baseline file or a baseline variable is malformed (one line naming it).
    """
    options = CheckOptions.from_environ(environ)
    baselines = load_baseline_file(baseline_file) if baseline_file is not None else {}
    baselines.update(baselines_from_environ(environ))
    return CheckContext(
        environ=dict(environ),
        options=options,
        baselines=baselines,
        sysfs_root=sysfs_root,
        dev_root=dev_root,
        kmsg_path=kmsg_path,
    )


# -- running ---------------------------------------------------------------------------------


def run_checks(
    checks: Sequence[Check],
    context: CheckContext,
    *,
    node: str,
    check_id: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.time,
) -> SelfCheckReport:
    """Run ``checks`` in turn and report (never raises for a check's failure).

    Each check gets its own allowance (:meth:`Check.timeout_s`), cut to what is left of
    ``timeout_s`` less a reserve for reporting (:data:`REPORT_RESERVE_S`); a check that finds no
    time left is an ``error`` saying so.
    """
    started = clock()
    began = time.monotonic()
    deadline = began + timeout_s - min(REPORT_RESERVE_S, 0.1 * timeout_s)
    results: list[CheckResult] = []
    for check in checks:
        if progress is not None:
            progress(check.name, None)
        left = deadline - time.monotonic()
        if left <= 0:
            outcome = result(
                check.name,
                CheckStatus.ERROR,
                f"not run: the run's {timeout_s:g} s ({TIMEOUT_ENV}) were spent",
            )
        else:
            allowance = min(check.timeout_s(context.options), left)
            outcome = run_one(check, replace(context, timeout_s=allowance))
        results.append(outcome)
        if progress is not None:
            progress(check.name, outcome)
    report = SelfCheckReport.of(node, started, max(clock(), started), results, check_id)
    logger.info("selfcheck: %s on %s: %s", report.verdict.value, node, report.reason[:200])
    return report


def run_one(check: Check, context: CheckContext) -> CheckResult:
    """One check within ``context.timeout_s``: its result, ``skipped`` where it cannot run here,
    ``error`` when it raised or did not answer in time; ``duration_s`` set, bounds enforced."""
    box: dict[str, CheckResult | BaseException] = {}

    def target() -> None:
        try:
            why = check.unavailable(context)
            box["result"] = skipped(check.name, why) if why is not None else check.run(context)
        except BaseException as exc:  # reported as the check's error, never a crash
            box["error"] = exc

    began = time.monotonic()
    thread = threading.Thread(target=target, name=f"selfcheck-{check.name}", daemon=True)
    thread.start()
    thread.join(context.timeout_s)
    duration = round(time.monotonic() - began, 3)
    if thread.is_alive():
        logger.warning(
            "selfcheck: %s gave no answer within %.0f s; left behind", check.name, context.timeout_s
        )
        return _with_duration(
            result(
                check.name,
                CheckStatus.ERROR,
                f"timed out: no answer within {context.timeout_s:g} s",
            ),
            duration,
        )
    error = box.get("error")
    if error is not None:
        assert isinstance(error, BaseException)
        logger.warning("selfcheck: %s raised %s", check.name, type(error).__name__, exc_info=error)
        return _with_duration(
            result(check.name, CheckStatus.ERROR, f"crashed: {_describe(error)}"), duration
        )
    outcome = box.get("result")
    assert isinstance(outcome, CheckResult)
    return _with_duration(_fitted(check.name, outcome), duration)


def _describe(error: BaseException) -> str:
    text = one_line(error, 200)
    if isinstance(error, MinderError | OSError | ValueError) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _with_duration(outcome: CheckResult, duration: float) -> CheckResult:
    return CheckResult(
        outcome.name, outcome.status, outcome.summary, outcome.measurements, duration
    )


def _fitted(name: str, outcome: CheckResult) -> CheckResult:
    """``outcome`` within the report's bounds (what the API's validation would refuse becomes an
    ``error`` of this check rather than a refused report)."""
    if outcome.name != name:
        return result(name, CheckStatus.ERROR, f"answered as {outcome.name!r}: a bug of the check")
    measurements = dict(outcome.measurements)
    if len(measurements) > MAX_MEASUREMENTS:
        dropped = len(measurements) - (MAX_MEASUREMENTS - 1)
        measurements = dict(list(measurements.items())[: MAX_MEASUREMENTS - 1])
        measurements["measurements_dropped"] = dropped
    data = outcome.to_dict()
    data["measurements"] = measurements
    try:
        return CheckResult.from_dict(data, name)
    except ValidationError as exc:
        return result(name, CheckStatus.ERROR, f"gave a malformed result: {one_line(exc, 200)}")
