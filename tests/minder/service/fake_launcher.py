"""A fake scheduler for the self-check service's tests: the actions' actuator and scheduler view
(drain, resume, where a job runs) and the self-check launcher, in one object with a scheduler's
semantics.

It stands in for Slurm in these unit tests only: the service's logic (decide, launch, poll, time
out, apply) is exercised here against a database, with time driven by the test; the real
launchers are tested against a real ``slurmctld`` (tests/minder/actions/test_selfcheck_slurm.py)
and the fake Kubernetes API server. What it keeps of Slurm's semantics:

- a node is idle, runs jobs, is drained (``DRAIN`` with a reason; ``DRAINING`` while a job still
  runs on it) or reserved (a check's ``MAINT`` reservation holds it out of the pool);
- Minder's drain carries its mark for one alert (``minder:<alert id> ...``), and only that mark is
  undone (a node drained by someone else, or for another alert, is left as it is);
- a check is a job: ``PENDING`` when submitted, ``RUNNING`` at the next look, then it ends
  (``SUCCEEDED``/``FAILED``) as its :class:`Run` says, or runs on (a hang) until cancelled; a
  release ends a job still running (``scancel``), then removes the reservation;
- a check runs only on a node held out by Minder's mark for its alert with no job left on it, and
  partners are idle nodes of the node's partition, never one running a job, drained or reserved.

Each check's run is decided by ``runner(launch)``: a report (posted with the token the launch
carried in its environment, as ``minder selfcheck run`` would, through ``post``), an exit state,
or a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from minder.actions.base import ActionError, ActionOutcome, mark_for
from minder.actions.selfcheck import CheckLaunch, LaunchState, LaunchStatus
from minder.core.selfcheck import SelfCheckReport


@dataclass
class Run:
    """How a check's job goes: the report it posts (None: none), how it exits, or a hang."""

    report: SelfCheckReport | None = None
    exit: LaunchState = LaunchState.SUCCEEDED
    hang: bool = False
    token: str | None = None
    """Post with this token instead of the launch's (a forged or stale report)."""
    linger: int = 0
    """Looks at the job for which it still runs after posting (its other ranks finishing)."""


@dataclass
class Node:
    name: str
    partition: str = "gpu"
    jobs: set[str] = field(default_factory=set)
    drained: bool = False
    reason: str = ""
    reservation: str | None = None

    @property
    def idle(self) -> bool:
        return not self.jobs and not self.drained and self.reservation is None


@dataclass
class CheckJob:
    id: str
    launch: CheckLaunch
    reservation: str
    nodes: tuple[str, ...]
    state: LaunchState = LaunchState.PENDING
    detail: str = ""
    posted: bool = False
    lingered: int = 0


PostReport = Callable[[str, str, SelfCheckReport], None]
"""``post(check_id, token, report)``: what the check's process does with its report (the test
hands it to the storage function the API calls)."""


class FakeScheduler:
    """See the module doc. ``runner`` decides each check's run; ``post`` delivers a report."""

    def __init__(
        self,
        nodes: list[str],
        *,
        runner: Callable[[CheckLaunch], Run],
        post: PostReport,
        name: str = "slurm",
    ) -> None:
        self.name = name
        self.nodes = {n: Node(n) for n in nodes}
        self.runner = runner
        self.post = post
        self.checks: dict[str, CheckJob] = {}
        self.launched: list[CheckLaunch] = []
        self.cancelled: list[str] = []
        self.releases: list[tuple[str, str, bool]] = []
        self.fail_after_hold: ActionError | None = None
        """Raised by the next :meth:`launch` after it created the reservation (a launch that
        stops midway: ``sbatch`` refused, the process killed)."""
        self._next_job = 1000

    # -- user jobs ------------------------------------------------------------------------------
    def run_job(self, job_id: str, nodes: list[str]) -> None:
        for name in nodes:
            self.nodes[name].jobs.add(job_id)

    def end_job(self, job_id: str) -> None:
        for node in self.nodes.values():
            node.jobs.discard(job_id)

    # -- SchedulerView and NodeActuator ---------------------------------------------------------
    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        found = frozenset(n.name for n in self.nodes.values() if job_id in n.jobs)
        return found or None

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        state = self._node(node)
        if state.drained:
            who = "Minder for this alert" if _ours(state, alert_id) else "someone else"
            return ActionOutcome(self.name, node, "drain", False, f"already drained by {who}")
        state.drained, state.reason = True, f"{mark_for(alert_id)} {reason}"
        return ActionOutcome(self.name, node, "drain", True, f"drained: {state.reason}")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        state = self._node(node)
        if not (state.drained and _ours(state, alert_id)):
            return ActionOutcome(self.name, node, "resume", False,
                                 f"not drained with Minder's mark for {alert_id}")  # fmt: skip
        state.drained, state.reason = False, ""
        return ActionOutcome(self.name, node, "resume", True, "resumed")

    # -- SelfCheckLauncher -----------------------------------------------------------------------
    def ready(self, node: str, *, alert_id: str) -> str | None:
        state = self._node(node)
        if not (state.drained and _ours(state, alert_id)):
            return f"{node} is not held out by Minder for alert {alert_id}"
        user_jobs = sorted(j for j in state.jobs if j not in self.checks)
        if user_jobs:
            return f"{node} still runs job(s) {', '.join(user_jobs)} (DRAINING)"
        return None

    def partners(self, node: str, count: int) -> tuple[str, ...]:
        partition = self._node(node).partition
        idle = sorted(
            n.name
            for n in self.nodes.values()
            if n.name != node and n.partition == partition and n.idle
        )
        return tuple(idle[:count])

    def ref_for(self, check_id: str) -> str:
        """The ref known before the launch: the check's reservation (what :meth:`release`,
        :meth:`cancel` and :meth:`status` accept, as Slurm's launcher does)."""
        return f"minder-selfcheck-{check_id}"

    def launch(self, launch: CheckLaunch) -> str:
        why = self.ready(launch.node, alert_id=launch.alert_id)
        if why is not None:
            raise ActionError(f"cannot launch the check: {why}", transient=False)
        busy = [p for p in launch.partners if not self._node(p).idle]
        if busy:
            raise ActionError(f"partners no longer idle: {', '.join(busy)}", transient=True)
        self._next_job += 1
        job_id = str(self._next_job)
        reservation = self.ref_for(launch.check_id)
        nodes = (launch.node, *launch.partners)
        for name in nodes:
            self.nodes[name].reservation = reservation
        if self.fail_after_hold is not None:
            error, self.fail_after_hold = self.fail_after_hold, None
            raise error
        for name in nodes:
            self.nodes[name].jobs.add(job_id)
        self.checks[job_id] = CheckJob(job_id, launch, reservation, nodes)
        self.launched.append(launch)
        return f"{job_id}:{reservation}"

    def _job(self, ref: str) -> CheckJob | None:
        """The check job of a launch's ref (``<job>:<reservation>``) or of a planned one (the
        reservation alone)."""
        found = self.checks.get(ref.split(":", 1)[0])
        if found is not None:
            return found
        reservation = ref.split(":", 1)[-1]
        return next((j for j in self.checks.values() if j.reservation == reservation), None)

    def status(self, ref: str) -> LaunchStatus:
        job = self._job(ref)
        if job is None:
            return LaunchStatus(LaunchState.GONE, "no such job")
        if job.state is LaunchState.PENDING:
            job.state = LaunchState.RUNNING
        elif job.state is LaunchState.RUNNING:
            run = self.runner(job.launch)
            if not run.hang:
                if run.report is not None and not job.posted:
                    token = run.token or job.launch.env["MINDER_SELFCHECK_TOKEN"]
                    self.post(job.launch.check_id, token, run.report)
                    job.posted = True
                if job.lingered < run.linger:
                    job.lingered += 1
                    return LaunchStatus(job.state, job.detail)
                job.state = run.exit
                job.detail = "exit code 0" if run.exit is LaunchState.SUCCEEDED else "exit code 1"
                self._end(job)
        return LaunchStatus(job.state, job.detail)

    def release(
        self, ref: str, *, node: str, alert_id: str, passed: bool, reason: str
    ) -> ActionOutcome:
        self.releases.append((ref, node, passed))
        self.cancel(ref)  # as Slurm's release: the check's job ends first
        reservation = ref.split(":", 1)[-1]  # a launch that stopped midway left it alone
        for held in self.nodes.values():
            if held.reservation == reservation:
                held.reservation = None
        state = self._node(node)
        if passed:
            if state.drained and _ours(state, alert_id):
                state.drained, state.reason = False, ""
                return ActionOutcome(
                    self.name, node, "resume", True, "reservation removed, resumed"
                )
            return ActionOutcome(self.name, node, "resume", False,
                                 "reservation removed; not Minder's hold: left as it is")  # fmt: skip
        if state.drained:
            return ActionOutcome(self.name, node, "drain", False,
                                 f"reservation removed; kept drained ({reason})")  # fmt: skip
        state.drained, state.reason = True, f"{mark_for(alert_id)} {reason}"
        return ActionOutcome(self.name, node, "drain", True, f"drained again ({reason})")

    def cancel(self, ref: str) -> None:
        job = self._job(ref)
        if job is None or job.state not in (LaunchState.PENDING, LaunchState.RUNNING):
            return
        self.cancelled.append(job.id)
        job.state, job.detail = LaunchState.FAILED, "cancelled"
        self._end(job)

    # -- helpers ---------------------------------------------------------------------------------
    def _end(self, job: CheckJob) -> None:
        for name in job.nodes:
            self.nodes[name].jobs.discard(job.id)

    def _node(self, node: str) -> Node:
        found = self.nodes.get(node)
        if found is None:
            raise ActionError(f"unknown node {node!r}", transient=False)
        return found


def _ours(node: Node, alert_id: str) -> bool:
    return node.reason.split(" ", 1)[0] == mark_for(alert_id)
