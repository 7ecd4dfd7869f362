"""Which alerts act on the scheduler, how, and within which bounds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from minder.core.alert import Alert, AlertKind
from minder.core.errors import ValidationError

DEFAULT_ACT_ON: Mapping[str, float] = {
    "rule": 0.0,
    "hang": 0.0,
    "silence": 60.0,
    "similarity": 120.0,
}
"""Alert kind → seconds the alert must have held (stayed open) before Minder acts. Kinds left out
(``straggler`` by default) only notify. Rules (XID, ECC, GPU lost, link down) and the machines
a hang waits on (the culprits' own ``hang`` alerts) act at once; a silent machine and a lasting
outlier first get a chance to come back or be dismissed. The job-level ``hang`` alert names no
machine and is never acted on (:meth:`ActionPolicy.why_not`)."""

ACTING_KINDS = frozenset({"rule", "similarity", "straggler", "silence", "hang"})
"""Alert kinds ``act_on`` may name."""


_KINDS = "rule, similarity, straggler, silence or hang"


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """The operator's rules for acting.

    Attributes
    ----------
    enforce
        False (the default): log-only, every decision is audited as ``dry_run`` and nothing is
        changed on the scheduler. True: act.
    act_on
        See :data:`DEFAULT_ACT_ON`.
    opt_out_jobs
        Jobs never acted on (also settable per job through the API).
    max_per_job
        The breaker trips when acting would take more than this many machines of one job out
        within ``window_s``.
    max_fraction
        … or more than this fraction of all watched machines (at least ``min_fleet_bound``).
    window_s
        The breaker's sliding window.
    node_template
        The scheduler's node name of a machine: ``{machine}`` by default (agents report the
        hostname, which is the Slurm node name and the Kubernetes node name).
    """

    enforce: bool = False
    act_on: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ACT_ON))
    opt_out_jobs: frozenset[str] = frozenset()
    max_per_job: int = 4
    max_fraction: float = 0.02
    min_fleet_bound: int = 1
    window_s: float = 3600.0
    node_template: str = "{machine}"

    def __post_init__(self) -> None:
        for kind, hold in self.act_on.items():
            if kind == AlertKind.SUSPICIOUS_SOURCE.value:
                raise ValidationError(
                    "act_on kind 'suspicious_source': these alerts say that a report named a "
                    f"machine outside its job; they are never acted on (expected {_KINDS})"
                )
            if kind not in ACTING_KINDS:
                raise ValidationError(f"act_on kind {kind[:40]!r}: expected {_KINDS}")
            if not (isinstance(hold, int | float) and math.isfinite(hold) and hold >= 0):
                raise ValidationError(f"act_on[{kind}] = {hold!r}: expected seconds >= 0")
        if self.max_per_job < 1:
            raise ValidationError(f"max_per_job is {self.max_per_job}: expected >= 1")
        if not 0 < self.max_fraction <= 1:
            raise ValidationError(f"max_fraction is {self.max_fraction}: expected in (0, 1]")
        if self.window_s <= 0:
            raise ValidationError(f"window_s is {self.window_s}: expected > 0")
        try:
            formatted = self.node_template.format(machine="node-0001")
        except (KeyError, IndexError, ValueError):
            formatted = ""
        if "{machine}" not in self.node_template or "node-0001" not in formatted:
            raise ValidationError(
                f"node_template {self.node_template[:60]!r}: expected a name with '{{machine}}' "
                "and no other placeholder, e.g. '{machine}' or '{machine}.cluster.local'"
            )

    @property
    def mode(self) -> str:
        """``enforce`` or ``dry_run``, as audited."""
        return "enforce" if self.enforce else "dry_run"

    def why_not(self, alert: Alert) -> str | None:
        """Why this alert does not act (None when it does, subject to the scheduler's check and
        the breaker)."""
        if alert.kind is AlertKind.SUSPICIOUS_SOURCE:
            return "suspicious_source alerts are never acted on: they only notify"
        if not alert.machine:
            if alert.kind is AlertKind.HANG:
                return (
                    "job-level hang alert: it names no one machine; the machines the hang "
                    "waits on have hang alerts of their own, and those act"
                )
            return f"{alert.kind.value} alert names no machine: nothing to take out"
        if alert.kind.value not in self.act_on:
            acting = sorted(self.act_on) or ["none"]
            return f"{alert.kind.value} alerts only notify (acting kinds: {', '.join(acting)})"
        if alert.domain and alert.machine == alert.domain:
            return (
                f"domain alert on {alert.domain}: a shared switch or rack is not drained "
                "machine by machine"
            )
        return None

    def node_of(self, machine: str) -> str:
        """The scheduler's name of ``machine``."""
        return self.node_template.format(machine=machine)

    def fleet_bound(self, watched_machines: int) -> int:
        """Most machines the fleet-wide bound allows in one window."""
        return max(self.min_fleet_bound, math.floor(self.max_fraction * watched_machines))


DEFAULT_SELFCHECK_COMMAND: tuple[str, ...] = ("minder", "selfcheck", "run")
"""The argv prefix a self-check runs on its nodes (the service appends ``--report-url`` and
``--check-id``)."""


@dataclass(frozen=True, slots=True)
class SelfCheckPolicy:
    """When and how the service checks a node Minder drained (docs/selfcheck.md; settings
    ``MINDER_SELFCHECK__*``).

    Attributes
    ----------
    report_url
        The API's base URL as the nodes reach it (``http://minder:8080``): where a check posts
        its report.
    enforce
        Self-checks act only when the actions do (``MINDER_ACTIONS__ENFORCE``); in dry run the
        service audits which node it would check and does nothing.
    kinds
        Alert kinds whose drained node gets a check.
    max_concurrent
        Checks running at once (launched, no verdict yet).
    timeout_s
        Wall time a launched check may take before it is cancelled as ``timed_out``.
    retries
        Inconclusive or timed-out checks of one alert retried (a new check) before the service
        gives up, notifies and leaves the node out.
    max_failures_per_node
        A node whose checks failed this many times gets no more automatic checks: it stays out
        until a person acts (resolves the alert, or asks for a check through the API).
    partners
        Healthy idle nodes the collective check runs with (0: no collective check).
    command
        The argv prefix run on every node of a check.
    ready_timeout_s
        How long a pending check waits for its node (its job still running there) or for the
        scheduler before it is ``inconclusive``.
    report_grace_s
        How long after the scheduler says a check's job ended its report may still arrive; then
        the check is ``inconclusive`` ("exited without a report").
    interval_s
        The service's pass interval (it is also woken after a drain and after a report).
    """

    report_url: str
    enforce: bool = False
    kinds: frozenset[str] = frozenset(DEFAULT_ACT_ON)
    max_concurrent: int = 4
    timeout_s: float = 600.0
    retries: int = 1
    max_failures_per_node: int = 2
    partners: int = 3
    command: tuple[str, ...] = DEFAULT_SELFCHECK_COMMAND
    ready_timeout_s: float = 1800.0
    report_grace_s: float = 15.0
    interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.report_url.startswith(("http://", "https://")):
            raise ValidationError(
                f"self-check report_url {self.report_url[:80]!r}: expected the API's base URL as "
                "the nodes reach it, e.g. http://minder:8080"
            )
        for kind in self.kinds:
            if kind not in ACTING_KINDS:
                raise ValidationError(f"self-check kind {kind[:40]!r}: expected {_KINDS}")
        for name, low in (("max_concurrent", 1), ("retries", 0), ("max_failures_per_node", 1),
                          ("partners", 0)):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValidationError(
                    f"self-check {name} is {value!r}: expected an integer >= {low}"
                )
        for name in ("timeout_s", "ready_timeout_s", "report_grace_s", "interval_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValidationError(f"self-check {name} is {value!r}: expected seconds > 0")
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ValidationError(
                f"self-check command {list(self.command)[:8]!r}: expected a non-empty argv of "
                "non-empty strings, e.g. ['minder', 'selfcheck', 'run']"
            )

    @property
    def mode(self) -> str:
        """``enforce`` or ``dry_run``, as audited."""
        return "enforce" if self.enforce else "dry_run"
