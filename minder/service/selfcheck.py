"""The self-check service: checks the nodes Minder drained, and returns them or keeps them out by
the verdict (docs/selfcheck.md).

A background thread of the service (beside the delivery workers), woken after a drain was applied
(the actions executor), after a node's report or an operator's request (the API), and every
``interval_s``. Each pass, everything read from and written to the database (so a restart, or
another replica, picks up where it stopped):

1. **Decide.** An active alert of the policy's kinds whose node Minder drained (an applied,
   enforced drain or cordon in the audit trail) and that has no check yet gets a ``pending``
   check (attempt 1), unless its node failed ``max_failures_per_node`` checks since a person last
   closed (resolved, false positive) one of its alerts (then it stays out until a person acts;
   audited once as ``selfcheck_skip`` and notified once as ``selfcheck.inconclusive``, state
   ``skipped``). An operator's request
   (``POST /api/v1/selfchecks``) creates one too. In dry run nothing is decided: the service
   audits once per alert which node it would check.
2. **Cancel** the pending and running checks whose alert a person closed.
3. **Poll** the running checks: past ``timeout_s`` a check is cancelled on the scheduler and
   ``timed_out``; a check whose job ended (failed, gone, or succeeded) without its report within
   ``report_grace_s`` is ``inconclusive`` ("the check exited without a report").
4. **Launch** pending checks while fewer than ``max_concurrent`` run: when the launcher says the
   node is ready (Minder's own hold, no job left on it; a node not ready within
   ``ready_timeout_s`` makes the check inconclusive), with ``partners`` healthy idle nodes, a
   one-time token (only its SHA-256 is stored; the token travels in the job's environment) and
   the rendezvous environment of docs/selfcheck.md. The launcher's ``ref_for`` is stored before
   the launch, so a launch that stops midway is still released with it; the node's own budget
   (``MINDER_SELFCHECK_TIMEOUT_S``) is :func:`node_budget_s` of ``timeout_s``.
5. **Apply** the final states (once each, ``applied_ts``):

   - ``passed``: the actions circuit breaker is asked first (it counts returns too, but not the
     return of a node whose drain for the same alert it counts in the window); then the
     launcher returns the node (Minder's own hold only), the alert becomes
     ``cleared_by_selfcheck`` with the evidence, and the drain-to-return time is observed. A
     breaker that refuses keeps the node out, saying so on the alert and to the notification
     destinations;
   - ``failed``: the node stays out, the alert becomes ``confirmed`` with the evidence;
   - ``inconclusive`` / ``timed_out``: the node stays out; a new check is decided while retries
     are left, else ``selfcheck.inconclusive`` is notified;
   - ``cancelled``: the launched job is stopped and the node stays out (or, when a person closed
     the alert, only the check's hold is removed: the person's close returns the node).

Every action on the scheduler is one row of the action audit trail (``selfcheck_launch``,
``selfcheck_cancel``, ``selfcheck_resume``, ``selfcheck_keep``, ``selfcheck_release``). Checks
launch only while the actions enforce (``MINDER_ACTIONS__ENFORCE``); checks already launched are
followed to their end and applied.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from minder.actions.base import ActionError, ActionOutcome
from minder.actions.executor import BREAKER, breaker_refusal, enqueue_breaker_trip
from minder.actions.policy import ActionPolicy, SelfCheckPolicy
from minder.actions.selfcheck import CheckLaunch, LaunchState, SelfCheckLauncher
from minder.core.alert import Alert, AlertStatus
from minder.core.errors import NotFoundError
from minder.core.selfcheck import (
    FINAL_STATES,
    CheckStatus,
    SelfCheckRecord,
    SelfCheckState,
)
from minder.storage import Session, SessionFactory
from minder.storage.actions import ActionOutcomeKind, audit, audited, get_breaker
from minder.storage.alerts import ACTIVE_STATUSES, get_alert
from minder.storage.outbox import AlertEvent, Destination, record_selfcheck_verdict
from minder.storage.selfchecks import (
    ACTIVE_STATES,
    CANCEL_OPERATION,
    KEEP_OPERATION,
    LAUNCH_OPERATION,
    RELEASE_OPERATION,
    RESUME_OPERATION,
    SKIP_OPERATION,
    Drain,
    back_to_pending,
    claim,
    count_by_target,
    count_running,
    decide_selfcheck,
    drained_alerts_without_check,
    failed_checks,
    finish,
    inconclusive_checks,
    mark_applied,
    mark_launching,
    selfchecks_in,
    set_launched,
    set_pending_detail,
    token_digest,
    unapplied_selfchecks,
    unclaim,
)

logger = logging.getLogger(__name__)

CLAIM_S = 300.0
"""How long a replica holds a check while it talks to the scheduler about it (launch, cancel,
release: a few ``scontrol``/API calls, each within the target's timeout)."""
LAUNCH_LIMIT_S = 300.0
"""A running check without a scheduler handle this long after its launch began was being
launched when its service stopped: it is inconclusive (its job, if any, times out by itself)."""
DRAIN_TO_RETURN_BUCKETS = (30, 60, 120, 180, 300, 600, 900, 1800, 3600, 7200, 14400, 43200)
"""Seconds from the drain to the node's return after a pass."""
MEASUREMENTS_KEPT = 16
"""Measurements of one check copied into an alert's evidence."""
_SHOWN = 64
_FINAL_COUNTED = (
    SelfCheckState.PASSED,
    SelfCheckState.FAILED,
    SelfCheckState.INCONCLUSIVE,
    SelfCheckState.TIMED_OUT,
    SelfCheckState.CANCELLED,
)


def node_budget_s(timeout_s: float) -> float:
    """The time budget the checks on the node get (``MINDER_SELFCHECK_TIMEOUT_S``):
    ``max(30, 0.85 * timeout_s - 30)``. The service's clock starts before the launch (the
    reservation, ``sbatch``, the job's start and the torch import take their share), so a node
    given the full ``timeout_s`` would report after the service timed the check out."""
    return max(30.0, round(0.85 * timeout_s - 30.0, 3))


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


class SelfCheckMetrics:
    """``minder_selfchecks_in_progress{target}``, ``minder_selfchecks_total{state}`` and
    ``minder_selfcheck_drain_to_return_seconds`` (the dashboards read these names)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.in_progress = Gauge(
            "minder_selfchecks_in_progress",
            "Self-checks pending or running, per scheduler target",
            ["target"],
            registry=registry,
        )
        self.total = Counter(
            "minder_selfchecks",
            "Self-checks that reached a final state (passed, failed, inconclusive, timed_out, "
            "cancelled)",
            ["state"],
            registry=registry,
        )
        self.drain_to_return = Histogram(
            "minder_selfcheck_drain_to_return_seconds",
            "Seconds from Minder's drain of a node to its return after a passed self-check",
            buckets=DRAIN_TO_RETURN_BUCKETS,
            registry=registry,
        )
        for state in _FINAL_COUNTED:
            self.total.labels(state.value)


def selfcheck_evidence(record: SelfCheckRecord, *, outcome: str) -> dict[str, Any]:
    """What goes on the alert (``evidence["selfcheck"]``), in the audit trail and in the events:
    the verdict, its reason, the failed checks, the check's identity and its key measurements
    (those of the failed or erring checks, and of the collective check)."""
    report = record.report
    evidence: dict[str, Any] = {
        "check_id": record.id,
        "state": record.state.value,
        "verdict": report.verdict.value if report is not None else None,
        "reason": report.reason if report is not None else record.detail,
        "failing": report.failing() if report is not None else [],
        "node": record.node,
        "target": record.target,
        "attempt": record.attempt,
        "partners": list(record.partners),
        "started_ts": record.started_ts,
        "finished_ts": record.finished_ts,
        "drained_ts": record.drained_ts,
        "outcome": outcome,
    }
    if report is not None:
        evidence["checks"] = [
            {"name": c.name, "status": c.status.value, "summary": c.summary[:200]}
            for c in report.checks
        ]
        evidence["measurements"] = {
            c.name: dict(list(c.measurements.items())[:MEASUREMENTS_KEPT])
            for c in report.checks
            if c.status in (CheckStatus.FAIL, CheckStatus.ERROR) or c.name.startswith("collective.")
        }
    return evidence


class SelfCheckService:
    """Schedules self-checks on drained nodes and applies their verdicts (see the module doc).

    Parameters
    ----------
    launcher
        The scheduler's side (Slurm, Kubernetes).
    policy
        Which alerts get a check, and the bounds.
    action_policy
        The actions' policy: its circuit breaker bounds count the returns too.
    sessions
        The database.
    destinations
        Every outbox destination: the alert transitions go to each that takes them (the action
        executor's undo of ``alert.cleared_by_selfcheck`` included), ``selfcheck.inconclusive``
        and ``breaker.tripped`` to the notification ones.
    on_enqueued
        Called after outbox rows were written (wakes the delivery workers).
    clock
        Wall time (tests drive it).
    """

    def __init__(
        self,
        launcher: SelfCheckLauncher,
        policy: SelfCheckPolicy,
        action_policy: ActionPolicy,
        sessions: SessionFactory,
        *,
        destinations: Sequence[Destination] = (),
        metrics: SelfCheckMetrics | None = None,
        on_enqueued: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.launcher = launcher
        self.target = launcher.name
        self.policy = policy
        self.action_policy = action_policy
        self.sessions = sessions
        self.destinations = list(destinations)
        self.metrics = metrics
        self.on_enqueued = on_enqueued
        self.clock = clock
        self._ended: dict[str, float] = {}
        """Check id -> when this process first saw its job ended without a report."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if metrics is not None:
            metrics.in_progress.labels(self.target).set(0)

    # -- the thread ------------------------------------------------------------------------------
    def wake(self) -> None:
        """Run a pass now (a drain was applied, a report or a request came)."""
        self._wake.set()

    def start(self) -> None:
        """Run passes until :meth:`stop`."""
        self._thread = threading.Thread(target=self._run, name="minder-selfcheck", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current pass."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        logger.info(
            "self-check service on %s started (%s)",
            self.target,
            "enforcing" if self.policy.enforce else "dry run: nothing is launched",
        )
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:
                # The database or the scheduler may be down: the checks wait in the database.
                logger.warning(
                    "self-check pass failed (%s); retrying",
                    (str(exc).splitlines() or [type(exc).__name__])[0][:300],
                )
                self._stop.wait(self.policy.interval_s)
            self._wake.wait(self.policy.interval_s)
            self._wake.clear()
        logger.info("self-check service stopped")

    # -- one pass --------------------------------------------------------------------------------
    def run_once(self) -> None:
        """One pass: decide, cancel, poll, launch, apply (see the module doc)."""
        self._decide()
        self._cancel_closed()
        self._poll_running()
        self._launch_pending()
        self._apply_final()
        self.refresh_gauge()

    def refresh_gauge(self) -> None:
        """``minder_selfchecks_in_progress`` from the database."""
        if self.metrics is None:
            return
        with self.sessions() as session:
            counts = count_by_target(session, ACTIVE_STATES)
        for target in {self.target, *counts}:
            self.metrics.in_progress.labels(target).set(counts.get(target, 0))

    # -- 1. decide -------------------------------------------------------------------------------
    def _decide(self) -> None:
        dry_run = not self.policy.enforce
        with self.sessions() as session:
            found = drained_alerts_without_check(session, kinds=self.policy.kinds, dry_run=dry_run)
        notified = False
        for item in found:
            alert, drain = item.alert, item.drain
            now = self.clock()
            with self.sessions.begin() as session:
                if dry_run:
                    detail = (
                        f"dry run: would check node {drain.node} with up to "
                        f"{self.policy.partners} partner(s) (MINDER_ACTIONS__ENFORCE is false)"
                    )
                    self._audit(
                        session,
                        alert,
                        drain.node,
                        LAUNCH_OPERATION,
                        ActionOutcomeKind.DRY_RUN,
                        detail,
                    )
                    logger.info("alert %s: %s", alert.id, detail)
                    continue
                failures = failed_checks(session, drain.node)
                if failures >= self.policy.max_failures_per_node:
                    detail = (
                        f"node {drain.node} failed {failures} self-check(s) since a person last "
                        f"closed one of its alerts (MINDER_SELFCHECK__MAX_FAILURES_PER_NODE="
                        f"{self.policy.max_failures_per_node}): no automatic check; it stays out "
                        "until a person acts"
                    )
                    if not audited(session, alert.id, SKIP_OPERATION):
                        self._audit(
                            session,
                            alert,
                            drain.node,
                            SKIP_OPERATION,
                            ActionOutcomeKind.SKIPPED_POLICY,
                            detail,
                        )
                        self._notify_skip(session, alert, drain, failures, detail, now)
                        notified = True
                        logger.warning("alert %s: %s", alert.id, detail)
                    continue
                created = decide_selfcheck(session, alert=alert, drain=drain, now=now)
            if created is not None:
                logger.info(
                    "alert %s: self-check %s of node %s decided",
                    alert.id,
                    created.id,
                    _shown(drain.node),
                )
        if notified:
            self._enqueued()

    def _notify_skip(
        self,
        session: Session,
        alert: Alert,
        drain: Drain,
        failures: int,
        detail: str,
        now: float,
    ) -> None:
        """A node skipped under ``max_failures_per_node``: ``selfcheck.inconclusive`` to the
        notification destinations (no check, no verdict: a person decides), with the reason."""
        record_selfcheck_verdict(
            session,
            alert.id,
            None,
            {
                "check_id": None,
                "state": "skipped",
                "verdict": None,
                "reason": detail,
                "failing": [],
                "node": drain.node,
                "target": drain.target,
                "failures": failures,
                "drained_ts": drain.drained_ts,
                "outcome": "kept out, not checked: a person decides",
            },
            self.destinations,
            event=AlertEvent.SELFCHECK_INCONCLUSIVE,
            now=now,
        )

    # -- 2. cancel the checks of closed alerts ---------------------------------------------------
    def _cancel_closed(self) -> None:
        with self.sessions() as session:
            active = selfchecks_in(session, ACTIVE_STATES)
            statuses = {r.alert_id: _status(session, r.alert_id) for r in active}
        for record in active:
            status = statuses[record.alert_id]
            if status in ACTIVE_STATUSES:
                continue
            shown = "deleted" if status is None else status.value
            with self.sessions.begin() as session:
                finish(
                    session,
                    record.id,
                    SelfCheckState.CANCELLED,
                    f"cancelled: the alert was {shown} by a person",
                    now=self.clock(),
                )

    # -- 3. poll the running checks --------------------------------------------------------------
    def _poll_running(self) -> None:
        with self.sessions() as session:
            running = selfchecks_in(session, [SelfCheckState.RUNNING])
        live = {r.id for r in running}
        for gone in [key for key in self._ended if key not in live]:
            del self._ended[gone]
        for record in running:
            now = self.clock()
            started = record.started_ts if record.started_ts is not None else record.created_ts
            if record.scheduler_ref is None:
                if now - started > LAUNCH_LIMIT_S:
                    with self.sessions.begin() as session:
                        finish(
                            session,
                            record.id,
                            SelfCheckState.INCONCLUSIVE,
                            "the launch did not complete (the service stopped while launching?)",
                            now=now,
                            only_from=[SelfCheckState.RUNNING],
                        )
                continue
            if now - started > self.policy.timeout_s:
                self._time_out(record, now - started)
                continue
            try:
                status = self.launcher.status(record.scheduler_ref)
            except ActionError as exc:
                logger.warning(
                    "self-check %s: cannot read its state on %s: %s",
                    record.id,
                    self.target,
                    str(exc)[:300],
                )
                continue
            if status.state in (LaunchState.PENDING, LaunchState.RUNNING):
                self._ended.pop(record.id, None)
                continue
            first = self._ended.setdefault(record.id, now)
            if now - first < self.policy.report_grace_s:
                continue
            detail = f"the check exited without a report: {status.state.value}"
            if status.detail:
                detail += f" ({status.detail})"
            with self.sessions.begin() as session:
                finish(
                    session,
                    record.id,
                    SelfCheckState.INCONCLUSIVE,
                    detail,
                    now=now,
                    only_from=[SelfCheckState.RUNNING],
                    unclaimed=True,  # not while another replica is launching it
                )
            self._ended.pop(record.id, None)

    def _time_out(self, record: SelfCheckRecord, waited_s: float) -> None:
        assert record.scheduler_ref is not None
        if not self._claim(record):
            return
        try:
            with self.sessions.begin() as session:
                # a report that came meanwhile wins
                if not finish(
                    session,
                    record.id,
                    SelfCheckState.TIMED_OUT,
                    f"no verdict within {self.policy.timeout_s:.0f} s "
                    f"(waited {waited_s:.0f} s): cancelled on {self.target}",
                    now=self.clock(),
                    only_from=[SelfCheckState.RUNNING],
                ):
                    return
            self._cancel_job(record, "timed out")
        finally:
            self._unclaim(record)

    def _cancel_job(self, record: SelfCheckRecord, why: str) -> None:
        """Stop a launched check's job; one audit row either way."""
        assert record.scheduler_ref is not None
        try:
            self.launcher.cancel(record.scheduler_ref)
        except ActionError as exc:
            outcome, detail = (
                ActionOutcomeKind.FAILED,
                f"cannot cancel {record.scheduler_ref}: {exc}",
            )
        else:
            outcome, detail = ActionOutcomeKind.APPLIED, f"cancelled {record.scheduler_ref} ({why})"
        with self.sessions.begin() as session:
            self._audit_check(session, record, CANCEL_OPERATION, outcome, detail)

    # -- 4. launch -------------------------------------------------------------------------------
    def _launch_pending(self) -> None:
        with self.sessions() as session:
            pending = selfchecks_in(session, [SelfCheckState.PENDING])
            running = count_running(session)
        if not pending:
            return
        if not self.policy.enforce:
            with self.sessions.begin() as session:
                for record in pending:
                    set_pending_detail(
                        session,
                        record.id,
                        "dry run: not launched (MINDER_ACTIONS__ENFORCE is false)",
                        now=self.clock(),
                    )
            return
        for record in pending:
            if running >= self.policy.max_concurrent:
                with self.sessions.begin() as session:
                    set_pending_detail(
                        session,
                        record.id,
                        f"waiting for a slot: {running} of "
                        f"{self.policy.max_concurrent} checks running",
                        now=self.clock(),
                    )
                continue
            if not self._claim(record):
                continue
            try:
                if self._launch(record):
                    running += 1
            except Exception as exc:
                # a launcher's bug or an unexpected answer: this check gives up, the others go on
                logger.exception("self-check %s: launching it failed", record.id)
                with self.sessions.begin() as session:
                    finish(
                        session,
                        record.id,
                        SelfCheckState.INCONCLUSIVE,
                        f"the launch failed: {type(exc).__name__}: {str(exc)[:300]}",
                        now=self.clock(),
                    )
            finally:
                self._unclaim(record)

    def _launch(self, record: SelfCheckRecord) -> bool:
        """Launch one pending check if its node is ready; True when it was launched."""
        now = self.clock()
        partners: tuple[str, ...] = ()
        try:
            why = self.launcher.ready(record.node, alert_id=record.alert_id)
            if why is None and self.policy.partners > 0:
                partners = tuple(self.launcher.partners(record.node, self.policy.partners))
        except ActionError as exc:
            why = f"cannot ask {self.target}: {exc}"
            if not exc.transient:
                self._give_up(record, f"the node cannot be checked: {why}")
                return False
        if why is not None:
            if now - record.created_ts > self.policy.ready_timeout_s:
                self._give_up(
                    record,
                    f"the node was not ready for a check within "
                    f"{self.policy.ready_timeout_s:.0f} s: {why}",
                )
            else:
                with self.sessions.begin() as session:
                    set_pending_detail(session, record.id, f"waiting for the node: {why}", now=now)
            return False
        token = secrets.token_urlsafe(32)
        # the ref is known (and committed) before the launch: a launch that stops midway leaves
        # a ref with which the release finds and removes what it created
        planned = self.launcher.ref_for(record.id)
        with self.sessions.begin() as session:
            if not mark_launching(
                session,
                record.id,
                token_sha256=token_digest(token),
                partners=partners,
                planned_ref=planned,
                now=now,
            ):
                return False
        record = replace(record, scheduler_ref=planned)
        nodes = (record.node, *partners)
        launch = CheckLaunch(
            check_id=record.id,
            alert_id=record.alert_id,
            node=record.node,
            partners=tuple(partners),
            command=(
                *self.policy.command,
                "--report-url",
                self.policy.report_url,
                "--check-id",
                record.id,
            ),
            env={
                "MINDER_SELFCHECK_CHECK_ID": record.id,
                "MINDER_SELFCHECK_REPORT_URL": self.policy.report_url,
                "MINDER_SELFCHECK_TOKEN": token,
                "MINDER_SELFCHECK_TIMEOUT_S": f"{node_budget_s(self.policy.timeout_s):g}",
                "MINDER_SELFCHECK_SUSPECT": record.node,
                "MINDER_SELFCHECK_NODES": ",".join(nodes),
            },
            timeout_s=self.policy.timeout_s,
        )
        try:
            ref = self.launcher.launch(launch)
        except ActionError as exc:
            detail = f"cannot launch the check of {record.node}: {exc}"
            retry = exc.transient and now - record.created_ts <= self.policy.ready_timeout_s
            if retry:
                # whatever the launch created before it failed goes before the retry; when it
                # cannot, the check ends inconclusive and the apply releases it
                retry = self._undo_partial_launch(record, detail)
            with self.sessions.begin() as session:
                self._audit_check(
                    session,
                    record,
                    LAUNCH_OPERATION,
                    ActionOutcomeKind.FAILED,
                    detail + (" (retried)" if retry else ""),
                )
                if retry:
                    back_to_pending(session, record.id, f"{detail}; retried", now=self.clock())
                    return False
                finish(
                    session,
                    record.id,
                    SelfCheckState.INCONCLUSIVE,
                    detail,
                    now=self.clock(),
                    only_from=[SelfCheckState.RUNNING],
                )
            return False
        with self.sessions.begin() as session:
            set_launched(session, record.id, ref, now=self.clock())
            partners_text = ", ".join(partners) if partners else "no partner"
            self._audit_check(
                session,
                record,
                LAUNCH_OPERATION,
                ActionOutcomeKind.APPLIED,
                f"launched self-check {record.id} (attempt {record.attempt}) on "
                f"{record.node} with {partners_text} as {ref}",
            )
        logger.info(
            "self-check %s of node %s launched as %s (partners: %s)",
            record.id,
            _shown(record.node),
            ref,
            ", ".join(partners) or "none",
        )
        return True

    def _undo_partial_launch(self, record: SelfCheckRecord, detail: str) -> bool:
        """Release (keeping the node out) what a launch that failed may have created; False
        when the scheduler could not be asked."""
        assert record.scheduler_ref is not None
        try:
            self.launcher.release(
                record.scheduler_ref,
                node=record.node,
                alert_id=record.alert_id,
                passed=False,
                reason=f"self-check launch failed: {detail}",
            )
        except ActionError as exc:
            logger.warning(
                "self-check %s: cannot release its failed launch %s: %s",
                record.id,
                record.scheduler_ref,
                str(exc)[:300],
            )
            return False
        return True

    def _give_up(self, record: SelfCheckRecord, detail: str) -> None:
        with self.sessions.begin() as session:
            finish(
                session,
                record.id,
                SelfCheckState.INCONCLUSIVE,
                detail,
                now=self.clock(),
                only_from=[SelfCheckState.PENDING],
            )

    # -- 5. apply the verdicts -------------------------------------------------------------------
    def _apply_final(self) -> None:
        with self.sessions() as session:
            final = unapplied_selfchecks(session)
        for record in final:
            if self._job_still_ending(record):
                continue
            if not self._claim(record):
                continue
            try:
                self._apply(record)
            except ActionError as exc:
                # transient: the claim ends, the next pass tries again
                logger.warning(
                    "self-check %s: the scheduler did not take its verdict's consequence yet: %s",
                    record.id,
                    str(exc)[:300],
                )
            except Exception:
                # one check's trouble (a database error, an alert changed meanwhile) must not
                # hold up the others: it is tried again next pass
                logger.exception("self-check %s: applying its verdict failed", record.id)
            finally:
                self._unclaim(record)

    def _job_still_ending(self, record: SelfCheckRecord) -> bool:
        """Whether a check that reported is still ending on the scheduler (its other ranks
        finishing) within ``report_grace_s`` of its report: its job is left to exit by itself
        (and is recorded completed) rather than be cancelled by the release."""
        if record.report is None or record.scheduler_ref is None or record.finished_ts is None:
            return False
        if self.clock() - record.finished_ts >= self.policy.report_grace_s:
            return False
        try:
            state = self.launcher.status(record.scheduler_ref).state
        except ActionError:
            return False  # the release ends it if need be
        return state in (LaunchState.PENDING, LaunchState.RUNNING)

    def _apply(self, record: SelfCheckRecord) -> None:
        assert record.state in FINAL_STATES
        with self.sessions() as session:
            status = _status(session, record.alert_id)
        if status is None:
            self._applied(record, "the alert is gone: nothing done")
            return
        active = status in ACTIVE_STATUSES
        if record.state is SelfCheckState.CANCELLED or not active:
            self._apply_cancel_or_closed(record, active, status)
        elif record.state is SelfCheckState.PASSED:
            self._apply_pass(record)
        elif record.state is SelfCheckState.FAILED:
            self._apply_fail(record)
        else:
            self._apply_inconclusive(record)

    def _apply_cancel_or_closed(
        self, record: SelfCheckRecord, active: bool, status: AlertStatus
    ) -> None:
        """A cancelled check, or any check of an alert a person closed meanwhile."""
        launched = record.scheduler_ref is not None
        if launched and record.state is SelfCheckState.CANCELLED:
            self._cancel_job(record, "cancelled")
        if not launched:
            self._applied(record, None)
            return
        if active:  # an operator's cancel: the node stays out
            self._release(
                record,
                KEEP_OPERATION,
                passed=False,
                reason="self-check cancelled: the node stays out",
            )
        else:  # the person's close returns the node; only the check's hold goes
            self._release(
                record,
                RELEASE_OPERATION,
                passed=True,
                reason=f"the alert was {status.value} by a person",
            )
        self._applied(record, None)

    def _apply_pass(self, record: SelfCheckRecord) -> None:
        with self.sessions.begin() as session:
            alert = get_alert(session, record.alert_id)
            now = self.clock()
            why, tripped = breaker_refusal(
                session,
                self.action_policy,
                target=self.target,
                job=record.job,
                machine=record.machine,
                alert_id=record.alert_id,
                resume=True,
                now=now,
            )
            if tripped:
                state = get_breaker(session, BREAKER)
                enqueue_breaker_trip(
                    session,
                    self.destinations,
                    reason=state.reason or "",
                    target=self.target,
                    mode=self.policy.mode,
                    alert=alert,
                    now=now,
                )
            outcome = ActionOutcomeKind.SKIPPED_BREAKER if why else ActionOutcomeKind.STARTED
            detail = (
                f"self-check passed but the node stays out: {why}"
                if why
                else f"returning {record.node}: self-check {record.id} passed"
            )
            self._audit_check(session, record, RESUME_OPERATION, outcome, detail)
        if tripped:
            self._enqueued()
        if why is not None:
            self._release(record, KEEP_OPERATION, passed=False, reason=detail)
            self._keep_passed(record, why)
            return
        if record.scheduler_ref is None:
            # only a check launched before the planned ref was stored can lack one
            self._keep_passed(record, "the check's scheduler handle is unknown: nothing released")
            return
        done, refused = self._call_release(
            record, passed=True, reason=f"self-check {record.id} passed"
        )
        if refused:
            self._keep_passed(record, f"{self.target} did not return the node ({done.detail})")
            return
        now = self.clock()
        returned = done.changed
        outcome_text = (
            f"returned to scheduling: {done.detail}"
            if returned
            else f"not returned (not Minder's hold alone): {done.detail}"
        )
        with self.sessions.begin() as session:
            self._audit_check(
                session,
                record,
                RESUME_OPERATION,
                ActionOutcomeKind.APPLIED if returned else ActionOutcomeKind.UNCHANGED,
                done.detail,
            )
            evidence = selfcheck_evidence(record, outcome=outcome_text)
            evidence["returned_ts"] = now if returned else None
            record_selfcheck_verdict(
                session,
                record.alert_id,
                AlertStatus.CLEARED_BY_SELFCHECK,
                evidence,
                self.destinations,
                event=AlertEvent.CLEARED_BY_SELFCHECK,
                now=now,
            )
            mark_applied(
                session,
                record.id,
                now=now,
                detail=f"passed: {outcome_text}",
                returned_ts=now if returned else None,
            )
        self._count(record)
        if returned and self.metrics is not None and record.drained_ts is not None:
            self.metrics.drain_to_return.observe(max(0.0, now - record.drained_ts))
        self._enqueued()
        logger.info(
            "self-check %s of node %s passed: %s; alert %s cleared",
            record.id,
            _shown(record.node),
            outcome_text,
            record.alert_id,
        )

    def _keep_passed(self, record: SelfCheckRecord, why: str) -> None:
        """A passed check whose node stays out anyway (the breaker, the scheduler): the alert
        keeps its status and gets the evidence; the notification destinations hear of it."""
        now = self.clock()
        with self.sessions.begin() as session:
            record_selfcheck_verdict(
                session,
                record.alert_id,
                None,
                selfcheck_evidence(record, outcome=f"passed, but kept out: {why}"),
                self.destinations,
                event=AlertEvent.SELFCHECK_INCONCLUSIVE,
                now=now,
            )
            mark_applied(session, record.id, now=now, detail=f"passed, but kept out: {why}")
        self._count(record)
        self._enqueued()
        logger.warning(
            "self-check %s of node %s passed, but the node stays out: %s",
            record.id,
            _shown(record.node),
            why,
        )

    def _apply_fail(self, record: SelfCheckRecord) -> None:
        failing = ", ".join(record.report.failing()) if record.report is not None else ""
        kept = self._release(
            record,
            KEEP_OPERATION,
            passed=False,
            reason=f"self-check failed: {failing or record.detail}",
        )
        now = self.clock()
        with self.sessions.begin() as session:
            record_selfcheck_verdict(
                session,
                record.alert_id,
                AlertStatus.CONFIRMED,
                selfcheck_evidence(record, outcome=f"kept out: {kept}"),
                self.destinations,
                event=AlertEvent.CONFIRMED,
                now=now,
            )
            mark_applied(session, record.id, now=now)
        self._count(record)
        self._enqueued()
        logger.warning(
            "self-check %s of node %s failed (%s): node kept out, alert %s confirmed",
            record.id,
            _shown(record.node),
            failing,
            record.alert_id,
        )

    def _apply_inconclusive(self, record: SelfCheckRecord) -> None:
        kept = (
            self._release(
                record,
                KEEP_OPERATION,
                passed=False,
                reason=f"self-check {record.state.value}: {record.detail}",
            )
            if record.scheduler_ref is not None
            else "nothing was launched"
        )
        now = self.clock()
        notified = False
        with self.sessions.begin() as session:
            spent = inconclusive_checks(session, record.alert_id)
            retry = None
            if spent <= self.policy.retries and self.policy.enforce:
                alert = get_alert(session, record.alert_id)
                drain = _drain_of_record(record)
                retry = decide_selfcheck(
                    session,
                    alert=alert,
                    drain=drain,
                    now=now,
                    detail=f"retry {spent} of {self.policy.retries} after check {record.id} "
                    f"({record.state.value}): waiting for a slot and for the node",
                )
            if retry is not None:
                detail = f"{record.state.value}: {record.detail}; retried as {retry.id}"
            else:
                detail = (
                    f"{record.state.value}: {record.detail}; no retry left "
                    f"({spent} without a verdict): the node stays out, a person decides"
                )
                record_selfcheck_verdict(
                    session,
                    record.alert_id,
                    None,
                    selfcheck_evidence(record, outcome=f"kept out, no verdict: {kept}"),
                    self.destinations,
                    event=AlertEvent.SELFCHECK_INCONCLUSIVE,
                    now=now,
                )
                notified = True
            mark_applied(session, record.id, now=now, detail=detail)
        self._count(record)
        if notified:
            self._enqueued()
        logger.warning("self-check %s of node %s: %s", record.id, _shown(record.node), detail)

    # -- the scheduler ---------------------------------------------------------------------------
    def _call_release(
        self, record: SelfCheckRecord, *, passed: bool, reason: str
    ) -> tuple[ActionOutcome, bool]:
        """``launcher.release``, and whether the scheduler refused it for good (then the node
        is left as it is, out of scheduling). A failure is audited; a transient one is raised
        (the next pass tries again)."""
        assert record.scheduler_ref is not None
        operation = RESUME_OPERATION if passed else KEEP_OPERATION
        try:
            done = self.launcher.release(
                record.scheduler_ref,
                node=record.node,
                alert_id=record.alert_id,
                passed=passed,
                reason=reason,
            )
        except ActionError as exc:
            with self.sessions.begin() as session:
                self._audit_check(
                    session,
                    record,
                    operation,
                    ActionOutcomeKind.FAILED,
                    f"{exc}{' (retried)' if exc.transient else ''}",
                )
            if exc.transient:
                raise
            refused = ActionOutcome(
                self.target, record.node, operation, False, f"{self.target} refused: {exc}"
            )
            return refused, True
        return done, False

    def _release(
        self, record: SelfCheckRecord, operation: str, *, passed: bool, reason: str
    ) -> str:
        """Release a launched check (keep the node out, or only remove the check's hold), with
        one audit row; returns what was done, in words."""
        if record.scheduler_ref is None:
            return "nothing was launched"
        done, refused = self._call_release(record, passed=passed, reason=reason)
        if not refused:
            with self.sessions.begin() as session:
                self._audit_check(
                    session,
                    record,
                    operation,
                    ActionOutcomeKind.APPLIED if done.changed else ActionOutcomeKind.UNCHANGED,
                    done.detail,
                )
        return done.detail

    # -- bookkeeping -----------------------------------------------------------------------------
    def _claim(self, record: SelfCheckRecord) -> bool:
        with self.sessions.begin() as session:
            return claim(session, record.id, now=self.clock(), lease_s=CLAIM_S)

    def _unclaim(self, record: SelfCheckRecord) -> None:
        with self.sessions.begin() as session:
            unclaim(session, record.id)

    def _applied(self, record: SelfCheckRecord, detail: str | None) -> None:
        with self.sessions.begin() as session:
            mark_applied(session, record.id, now=self.clock(), detail=detail)
        self._count(record)

    def _count(self, record: SelfCheckRecord) -> None:
        if self.metrics is not None:
            self.metrics.total.labels(record.state.value).inc()

    def _enqueued(self) -> None:
        if self.on_enqueued is not None:
            self.on_enqueued()

    def _audit(
        self,
        session: Session,
        alert: Alert,
        node: str,
        operation: str,
        outcome: ActionOutcomeKind,
        detail: str,
    ) -> None:
        audit(
            session,
            target=self.target,
            operation=operation,
            mode=self.policy.mode,
            outcome=outcome,
            detail=detail,
            alert_id=alert.id,
            job=alert.job,
            machine=alert.machine,
            node=node,
            now=self.clock(),
        )

    def _audit_check(
        self,
        session: Session,
        record: SelfCheckRecord,
        operation: str,
        outcome: ActionOutcomeKind,
        detail: str,
    ) -> None:
        audit(
            session,
            target=self.target,
            operation=operation,
            mode="enforce",  # only an enforcing service launches; what it launched it finishes
            outcome=outcome,
            detail=detail,
            alert_id=record.alert_id,
            job=record.job,
            machine=record.machine,
            node=record.node,
            now=self.clock(),
        )


def _status(session: Session, alert_id: str) -> AlertStatus | None:
    try:
        return get_alert(session, alert_id).status
    except NotFoundError:
        return None


def _drain_of_record(record: SelfCheckRecord) -> Drain:
    """The drain a check answers, as a retry of it needs."""
    return Drain(node=record.node, target=record.target, drained_ts=record.drained_ts)
