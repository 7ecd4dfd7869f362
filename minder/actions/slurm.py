"""Slurm target: drain a node with ``scontrol`` and resume it when the alert ends.

Minder's drain reason starts with its mark for the alert (``minder:<alert id> gpu_xid gpu5
xid=79``), so that ``undo`` resumes a node only when Minder drained it for that alert. A node that
someone else took out of scheduling (an operator's drain, a ``DOWN`` with a reason) is left as it
is: its reason is never overwritten and it is never resumed by Minder.

``scontrol`` runs as a subprocess with a fixed argument list (never through a shell) and a
timeout; ``slurm_conf`` (or ``SLURM_CONF`` in ``env``) points it at a cluster's configuration.
The node is read with ``scontrol show node <node>`` (the multi-line format: the ``Reason=`` line
stands alone there, so a reason holding spaces or ``=`` parses without guessing).

Between the read and the update there is a window in which someone else may change the node; the
update then either succeeds (the node ends drained or resumed, which is what was asked) or Slurm
refuses the state transition (an ``ActionError``; a retry reads the node again).

Before a drain, the executor asks :meth:`SlurmActuator.job_nodes` where the alert's job runs
(``scontrol show job <id>``, its ``NodeList`` expanded with ``scontrol show hostnames``): Minder's
job id is the agent's ``SLURM_JOB_ID``, i.e. the Slurm job id. An array task's ``SLURM_JOB_ID`` is
its own job id; ``<array id>_<task id>`` is accepted too. A heterogeneous job's ``SLURM_JOB_ID`` is
its leader's id in every component, so the nodes of every running component count. Other forms
(``123+1``, a job name) name no Slurm job: no node runs them.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from minder.actions.base import MINDER_MARK, ActionError, ActionOutcome, mark_for

logger = logging.getLogger(__name__)

DEFAULT_SCONTROL = "scontrol"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_REASON_CHARS = 200
"""Slurm stores a reason of any length, but ``sinfo -R``, ``scontrol show node`` and the accounting
database show it on one line: Minder keeps its reasons short."""

DRAIN_FLAGS = frozenset({"DRAIN", "DRAINING", "DRAINED"})
"""State words meaning the node takes no new jobs because it was drained (``scontrol`` shows
``IDLE+DRAIN``, ``MIXED+DRAIN``; ``sinfo`` says ``drained``/``draining``)."""

OUT_OF_SERVICE_FLAGS = DRAIN_FLAGS | frozenset({"DOWN", "FAIL", "FAILING", "MAINT", "FUTURE"})
"""State words meaning the node is already out of scheduling for a reason of its own."""

NOT_RESPONDING = "NOT_RESPONDING"

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""One Slurm node name: no host-list syntax (``[``, ``,``), no spaces, no ``=``; a node name that
expands to several nodes must never reach ``scontrol update``."""

_ALERT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
_JOB_ID = re.compile(r"([1-9][0-9]{0,9})(?:_([0-9]{1,10}))?")
"""A Slurm job id as ``SLURM_JOB_ID`` gives it (``4242``), or an array task (``4240_2``)."""
_HOSTLIST = re.compile(r"[A-Za-z0-9._,\[\]-]{1,65536}")
"""A ``NodeList`` value: node names and Slurm's host-list ranges (``gpu[01-04,07],login1``)."""
_JOB_HEADER_FIELDS = frozenset(
    {"JobId", "ArrayJobId", "ArrayTaskId", "ArrayTaskThrottle", "HetJobId", "HetJobOffset"}
)
"""The ids on the first line of a job record, before ``JobName=`` (whose value is the user's)."""
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_FREE_TEXT_FIELDS = ("OS=", "Reason=", "Comment=", "Extra=")
"""Fields whose values are free text, in which a ``State=`` means nothing."""
_REASON_STAMP = re.compile(r"\s*\[[^\[\]@]*@[^\[\]]*\]\s*$")
"""What ``scontrol`` appends to a reason's first line: `` [user@2024-05-01T10:00:00]``."""
_STATE_SUFFIXES = "*~#!%$@^-"
"""Characters Slurm appends to a state word (``DOWN*``: not responding, ``IDLE~``: powered off)."""

RUNNING = "RUNNING"
"""The ``JobState`` of a job whose nodes run it now."""
PENDING = "PENDING"
"""The ``JobState`` of a job not placed yet: no node runs it."""
NO_SUCH_JOB = "invalid job id specified"
"""What ``scontrol show job`` says (lower-cased) of an id it does not know: never submitted, or
finished longer than ``MinJobAge`` ago (``slurm_load_jobs error: Invalid job id specified``)."""

_EXCERPT_CHARS = 160
_ELLIPSIS = "..."

# scontrol's messages, lower-cased, and whether a retry may succeed.
_PERMANENT_ERRORS = (
    "invalid node name specified",
    "not found",
    "access/permission denied",
    "permission denied",
    "invalid user id",
    "security violation",
    "invalid node state specified",
    "unable to process configuration file",
    "could not establish a configuration source",
)
_TRANSIENT_ERRORS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connect failure",
    "zero bytes were transmitted",
    "communication connection failure",
    "backup controller in standby mode",
    "resource temporarily unavailable",
    "munge",
)


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as ``scontrol show node`` reports it.

    Attributes
    ----------
    flags
        The state words, upper-case, without Slurm's suffix characters: ``IDLE+DRAIN`` gives
        ``{"IDLE", "DRAIN"}``; ``DOWN*`` gives ``{"DOWN", "NOT_RESPONDING"}``.
    reason
        The reason without the ``[user@time]`` stamp, or ``""`` when none is set.
    """

    flags: frozenset[str]
    reason: str

    @property
    def drained(self) -> bool:
        """The node takes no new jobs because it was drained (draining or drained)."""
        return bool(self.flags & DRAIN_FLAGS)

    @property
    def out_of_service(self) -> bool:
        """The node is already out of scheduling (drained, down, failing, maintenance)."""
        return bool(self.flags & OUT_OF_SERVICE_FLAGS)

    def __str__(self) -> str:
        flags = "+".join(sorted(self.flags)) or "?"
        if not self.reason:
            return f"state {flags}, no reason"
        return f"state {flags}, reason {excerpt(self.reason, 120)!r}"


def parse_state_flags(value: str) -> frozenset[str]:
    """The state words of a ``State=`` value (``IDLE+DRAIN``, ``DOWN*+DRAIN``, ``mixed-``)."""
    flags: set[str] = set()
    for word in value.split("+"):
        if "*" in word:
            flags.add(NOT_RESPONDING)
        if name := word.strip().rstrip(_STATE_SUFFIXES).upper():
            flags.add(name)
    return frozenset(flags)


def parse_show_node(output: str, node: str) -> NodeState:
    """Read the state and reason of ``node`` from ``scontrol show node`` (multi-line format).

    The output may hold several records (blank-line separated); the one whose ``NodeName=`` is
    ``node`` is read. A reason spread over several lines (continuation lines are indented further
    than the fields) is joined with spaces.

    Raises
    ------
    ValueError
        No record for ``node``, or a record without ``State=``.
    """
    for record in re.split(r"\n\s*\n", output):
        lines = record.splitlines()
        first = next((line for line in lines if line.strip()), "")
        if first.split(" ", 1)[0].strip() != f"NodeName={node}":
            continue
        state: str | None = None
        fallback: str | None = None
        reason_lines: list[str] = []
        in_reason = False
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("Reason="):
                in_reason = True
                reason_lines.append(_REASON_STAMP.sub("", stripped.removeprefix("Reason=")))
                continue
            if in_reason and line.startswith("    ") and stripped:
                reason_lines.append(stripped)  # continuation of a multi-line reason
                continue
            in_reason = False
            if stripped.startswith("State="):  # its own line since Slurm 2.x
                state = stripped.split(None, 1)[0].removeprefix("State=")
            elif (
                fallback is None
                and not stripped.startswith(_FREE_TEXT_FIELDS)
                and (match := _STATE.search(line))
            ):
                fallback = match.group(1)  # --oneliner style output
        state = state or fallback
        if state is None:
            raise ValueError(f"no State= in the record of node {node!r}")
        return NodeState(parse_state_flags(state), " ".join(reason_lines).strip())
    raise ValueError(f"no record of node {node!r} in the output of scontrol show node")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as ``scontrol show job`` reports it.

    Attributes
    ----------
    job_id
        ``JobId``: the job's own id (an array task's or a heterogeneous component's too).
    state
        ``JobState``, upper-case (``RUNNING``, ``PENDING``, ``COMPLETED``...).
    node_list
        ``NodeList``: a host-list expression (``gpu[01-04]``), ``""`` when none (``(null)``).
    array_job_id, array_task_id
        ``ArrayJobId`` and ``ArrayTaskId`` of an array task, else ``""``.
    het_job_id
        ``HetJobId`` of a heterogeneous job's component (its leader's id), else ``""``.
    """

    job_id: str
    state: str
    node_list: str
    array_job_id: str = ""
    array_task_id: str = ""
    het_job_id: str = ""

    @property
    def running(self) -> bool:
        """The job runs on its nodes now."""
        return self.state == RUNNING

    @property
    def placed(self) -> bool:
        """The job runs, or ran until it ended (``COMPLETING``, ``FAILED``, ``NODE_FAIL``,
        ``CANCELLED``...), on the nodes of its ``NodeList``. A fault often kills its job before
        Minder acts: the node still ran it. Slurm forgets an ended job after ``MinJobAge``
        (300 s by default)."""
        return bool(self.node_list) and self.state != PENDING


def parse_show_job(output: str) -> list[JobRecord]:
    """The job records of ``scontrol show job`` output (the multi-line format, records separated
    by blank lines).

    Text the job's owner chose (its name, comment, command, paths) may hold anything, ``NodeList=``
    or a line break included, so only the ids before ``JobName=`` on a record's first line are read
    there, and ``JobState=``/``NodeList=`` only where they start a line. A record with either of
    them twice or not at all, a chunk that does not start with ``JobId=``, or two records of one
    job id are refused as unreadable rather than guessed at.

    Raises
    ------
    ValueError
        The output is not a list of job records, naming what was found.
    """
    records: list[JobRecord] = []
    seen: set[str] = set()
    for chunk in re.split(r"\n[ \t]*\n", output):
        lines = [line for line in chunk.splitlines() if line.strip()]
        if not lines:
            continue
        ids = _job_header(lines[0].strip())
        fields: dict[str, list[str]] = {"JobState": [], "NodeList": []}
        for line in lines[1:]:
            key, sep, value = line.split(None, 1)[0].partition("=")
            if sep and key in fields:
                fields[key].append(value)
        for key, values in fields.items():
            if len(values) != 1:
                raise ValueError(
                    f"the record of job {ids['JobId']} has {len(values)} {key}= lines, expected one"
                )
        job_id = ids["JobId"]
        if job_id in seen:
            raise ValueError(f"job {job_id} has two records")
        seen.add(job_id)
        node_list = fields["NodeList"][0]
        records.append(
            JobRecord(
                job_id=job_id,
                state=fields["JobState"][0].upper(),
                node_list="" if node_list in ("", "(null)") else node_list,
                array_job_id=ids.get("ArrayJobId", ""),
                array_task_id=ids.get("ArrayTaskId", ""),
                het_job_id=ids.get("HetJobId", ""),
            )
        )
    return records


def _job_header(line: str) -> dict[str, str]:
    """The ids of a job record's first line: ``JobId=7 ArrayJobId=5 ArrayTaskId=2 JobName=...``."""
    if not line.startswith("JobId="):
        raise ValueError(f"a record starts with {excerpt(line, 60)!r}, expected JobId=")
    ids: dict[str, str] = {}
    for token in line.split(" JobName=", 1)[0].split():
        key, sep, value = token.partition("=")
        if not sep or key not in _JOB_HEADER_FIELDS:
            continue
        if key in ids:
            raise ValueError(f"a record's first line has {key}= twice: {excerpt(line, 80)!r}")
        ids[key] = value
    if not ids["JobId"].isdigit():
        raise ValueError(f"JobId={excerpt(ids['JobId'], 40)!r} is not a number")
    return ids


def records_of_job(records: list[JobRecord], job_id: str) -> list[JobRecord]:
    """The records that make up job ``job_id`` (a Slurm job id or ``<array id>_<task id>``).

    A plain id is the record with that ``JobId`` (an array task's own id; ``scontrol`` also lists
    the other tasks of an array whose first task holds the array's id, which are other jobs) and,
    when that record leads a heterogeneous job (``HetJobId`` is its own id), every component.

    Raises
    ------
    ValueError
        ``job_id`` is not a Slurm job id, or an array task has two records.
    """
    match = _JOB_ID.fullmatch(job_id)
    if match is None:
        raise ValueError(f"{excerpt(repr(job_id), 60)} is not a Slurm job id")
    first, task = match.group(1), match.group(2)
    if task is not None:
        tasks = [r for r in records if r.array_job_id == first and r.array_task_id == task]
        if len(tasks) > 1:
            raise ValueError(f"array task {job_id} has {len(tasks)} records")
        return tasks
    leader = [r for r in records if r.job_id == first]
    if leader and leader[0].het_job_id == first:
        return [r for r in records if r.het_job_id == first]
    return leader


def sanitise_text(text: str) -> str:
    """One line of printable text: control, format (bidi overrides) and separator characters
    become spaces, runs of white space one space, surrogates are dropped."""
    out: list[str] = []
    for char in text:
        category = unicodedata.category(char)
        if category == "Cs":
            continue
        if category[0] in "CZ":  # Cc Cf Co Cn, Zs Zl Zp
            out.append(" ")
        else:
            out.append(char)
    return " ".join("".join(out).split())


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending with ``...`` when it was cut."""
    if len(text) <= limit:
        return text
    if limit <= len(_ELLIPSIS):
        return text[:limit]
    return text[: limit - len(_ELLIPSIS)].rstrip() + _ELLIPSIS


def excerpt(text: str, limit: int = _EXCERPT_CHARS) -> str:
    """Untrusted text (a reason, scontrol's output) made fit for a one-line message."""
    return truncate(sanitise_text(text), limit)


def drain_reason(alert_id: str, reason: str, limit: int = DEFAULT_MAX_REASON_CHARS) -> str:
    """The reason Minder sets: its mark for ``alert_id``, then ``reason`` as one line, cut to
    ``limit`` characters (the mark itself is never cut).

    Raises
    ------
    ActionError
        ``alert_id`` is not a plain token, or its mark does not fit in ``limit``.
    """
    _check_alert_id(alert_id)
    mark = mark_for(alert_id)
    if len(mark) > limit:
        raise ActionError(
            f"slurm: the mark {mark!r} is longer than the reason limit of {limit} characters",
            transient=False,
        )
    # scontrol strips a double quote at either end of a reason: use single quotes throughout.
    text = sanitise_text(reason).replace('"', "'")
    return truncate(f"{mark} {text}", limit) if text else mark


def carries_mark(reason: str, alert_id: str) -> bool:
    """The reason's first word is Minder's mark for ``alert_id``."""
    words = reason.split(maxsplit=1)
    return bool(words) and words[0] == mark_for(alert_id)


def minder_mark_of(reason: str) -> str | None:
    """Minder's mark at the start of ``reason`` (for whichever alert), or None."""
    words = reason.split(maxsplit=1)
    if words and words[0].startswith(f"{MINDER_MARK}:"):
        return words[0]
    return None


def _check_node(node: str) -> None:
    if not _NODE_NAME.fullmatch(node):
        raise ActionError(
            f"slurm: {excerpt(repr(node), 80)} is not a single Slurm node name "
            "(letters, digits, '.', '_', '-'; no host-list expression)",
            transient=False,
        )


def check_node_name(node: str) -> None:
    """Refuse anything but one Slurm node name (no host-list expression).

    Raises
    ------
    ActionError
        (not transient) ``node`` is not a single node name.
    """
    _check_node(node)


def check_alert_id(alert_id: str) -> None:
    """Refuse an alert id that cannot be Minder's mark (a plain token of at most 64 characters).

    Raises
    ------
    ActionError
        (not transient) ``alert_id`` is not a plain token.
    """
    _check_alert_id(alert_id)


def is_slurm_job_id(job_id: str) -> bool:
    """``job_id`` names a Slurm job: ``4242`` (``SLURM_JOB_ID``) or an array task ``4240_2``."""
    return isinstance(job_id, str) and _JOB_ID.fullmatch(job_id) is not None


def _check_alert_id(alert_id: str) -> None:
    if not _ALERT_ID.fullmatch(alert_id):
        raise ActionError(
            f"slurm: alert id {excerpt(repr(alert_id), 80)} is not a plain token "
            "(letters, digits, '.', '_', ':', '-'; at most 64 characters)",
            transient=False,
        )


class SlurmActuator:
    """Drains and resumes Slurm nodes with ``scontrol`` (see the module docstring).

    Parameters
    ----------
    scontrol
        The ``scontrol`` binary: a name looked up on ``PATH`` or a path.
    slurm_conf
        The cluster's ``slurm.conf``; sets ``SLURM_CONF`` for ``scontrol``. None: ``SLURM_CONF``
        from ``env`` or the environment, else Slurm's default.
    env
        Extra environment variables for ``scontrol``, on top of this process's environment.
    timeout_s
        Seconds one ``scontrol`` call may take. ``scontrol`` itself retries an unreachable
        controller for about ``MessageTimeout`` seconds (10 by default) before it gives up.
    max_reason_chars
        The longest reason set on a node, Minder's mark included.
    """

    name = "slurm"

    def __init__(
        self,
        *,
        scontrol: str | os.PathLike[str] = DEFAULT_SCONTROL,
        slurm_conf: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_reason_chars: int = DEFAULT_MAX_REASON_CHARS,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_reason_chars < 1:
            raise ValueError(f"max_reason_chars must be >= 1, got {max_reason_chars}")
        self.scontrol = os.fspath(scontrol)
        self.timeout_s = timeout_s
        self.max_reason_chars = max_reason_chars
        self._extra_env = dict(env or {})
        if slurm_conf is not None:
            self._extra_env["SLURM_CONF"] = os.fspath(slurm_conf)

    # -- the protocol -----------------------------------------------------------------------

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        """Drain ``node`` with a reason that starts with Minder's mark for ``alert_id``.

        No change when the node already carries that mark and is drained, or when it is already
        out of scheduling with someone else's reason (which is kept).
        """
        _check_node(node)
        text = drain_reason(alert_id, reason, self.max_reason_chars)
        current = self.node_state(node)
        if current.drained and carries_mark(current.reason, alert_id):
            return self._outcome(node, "drain", False, f"already drained by Minder: {current}")
        if current.out_of_service and current.reason and not carries_mark(current.reason, alert_id):
            other = minder_mark_of(current.reason)
            who = f"Minder for another alert ({other})" if other else "someone else"
            return self._outcome(
                node,
                "drain",
                False,
                f"already out of scheduling, drained by {who}: {current}; their reason is kept",
            )
        self._update(node, "drain", ["State=DRAIN", f"Reason={text}"])
        logger.info("slurm: drained node %s for alert %s (was %s)", node, alert_id, current)
        return self._outcome(node, "drain", True, f"drained (was {current}): reason {text!r}")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        """Resume ``node`` if, and only if, it is drained with Minder's mark for ``alert_id``."""
        _check_node(node)
        _check_alert_id(alert_id)
        current = self.node_state(node)
        if not carries_mark(current.reason, alert_id):
            if current.out_of_service and current.reason:
                other = minder_mark_of(current.reason)
                who = f"by Minder for another alert ({other})" if other else "by someone else"
                detail = f"drained {who}: {current}; left as it is"
            elif current.out_of_service:
                detail = f"out of scheduling without Minder's mark: {current}; left as it is"
            else:
                detail = f"not drained: {current}"
            return self._outcome(node, "resume", False, detail)
        if not current.drained:
            return self._outcome(node, "resume", False, f"not drained: {current}")
        self._update(node, "resume", ["State=RESUME"])
        logger.info("slurm: resumed node %s for alert %s (was %s)", node, alert_id, current)
        return self._outcome(node, "resume", True, f"resumed (was {current})")

    # -- reading ------------------------------------------------------------------------------

    def node_state(self, node: str) -> NodeState:
        """The node's state words and reason, read with ``scontrol show node``.

        Raises
        ------
        ActionError
            Unknown node, ``scontrol`` missing, controller unreachable, unreadable output.
        """
        _check_node(node)
        output = self._run(node, "read", ["show", "node", node])
        try:
            return parse_show_node(output, node)
        except ValueError as exc:
            raise ActionError(
                f"slurm: cannot read node {node!r}: {exc}; scontrol said {excerpt(output)!r}",
                transient=False,
            ) from None

    # -- the scheduler's view ---------------------------------------------------------------

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The nodes Slurm job ``job_id`` runs on, or ran on until it ended and Slurm still
        knows it (:class:`~minder.actions.base.SchedulerView`).

        ``scontrol show job <id>``, then ``scontrol show hostnames`` for a ``NodeList`` with a
        range (a plain list needs no second call). None when Slurm knows no such placed job: not a
        Slurm job id (see the module docstring), unknown, pending, or ended longer ago than
        ``MinJobAge``.

        Raises
        ------
        ActionError
            Controller unreachable or too slow (transient), ``scontrol`` missing, output that
            cannot be read.
        """
        if not is_slurm_job_id(job_id):
            logger.debug("slurm: %s is not a Slurm job id: no node runs it", excerpt(repr(job_id)))
            return None
        subject = f"job {job_id!r}"
        completed = self._exec(subject, "read", ["show", "job", job_id])
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            if NO_SUCH_JOB in output.lower():
                return None
            raise classify_error(subject, "read", completed.returncode, output)
        try:
            records = records_of_job(parse_show_job(completed.stdout or ""), job_id)
        except ValueError as exc:
            raise ActionError(
                f"slurm: cannot read job {job_id!r}: {excerpt(str(exc))}", transient=False
            ) from None
        placed = [record for record in records if record.placed]
        if not placed:
            return None
        nodes: set[str] = set()
        for record in placed:
            nodes |= self.expand_hostlist(record.node_list)
        return frozenset(nodes)

    def expand_hostlist(self, expression: str) -> frozenset[str]:
        """The node names of a host-list expression (``gpu[01-03],login1``), expanded by
        ``scontrol show hostnames`` when it holds a range.

        Raises
        ------
        ActionError
            Not a host list, or ``scontrol`` failed.
        """
        if not expression:
            return frozenset()
        subject = f"node list {excerpt(repr(expression), 80)}"
        if not _HOSTLIST.fullmatch(expression):
            raise ActionError(f"slurm: {subject} is not a Slurm host list", transient=False)
        if "[" in expression:
            completed = self._exec(subject, "expand", ["show", "hostnames", expression])
            if completed.returncode != 0:
                output = (completed.stdout or "") + (completed.stderr or "")
                raise classify_error(subject, "expand", completed.returncode, output)
            names = (completed.stdout or "").split()
        else:
            names = [name for name in expression.split(",") if name]
        for name in names:
            if not _NODE_NAME.fullmatch(name):
                raise ActionError(
                    f"slurm: {subject} holds {excerpt(repr(name), 80)}, not a node name",
                    transient=False,
                )
        return frozenset(names)

    # -- running scontrol ---------------------------------------------------------------------

    def _update(self, node: str, operation: str, fields: list[str]) -> None:
        self._run(node, operation, ["update", f"NodeName={node}", *fields])

    def _environment(self) -> dict[str, str]:
        environment = {**os.environ, **self._extra_env}
        conf = environment.get("SLURM_CONF")
        if conf and not Path(conf).is_file():
            raise ActionError(
                f"slurm: SLURM_CONF {excerpt(conf, 120)!r} is not a file", transient=False
            )
        return environment

    def _run(self, node: str, operation: str, args: list[str]) -> str:
        """``scontrol args`` about ``node``: its output, or the classified error."""
        subject = f"node {node!r}"
        completed = self._exec(subject, operation, args)
        output = (completed.stdout or "") + (completed.stderr or "")
        if completed.returncode != 0:
            raise classify_error(subject, operation, completed.returncode, output, node=node)
        return output

    def _exec(
        self, subject: str, operation: str, args: list[str]
    ) -> subprocess.CompletedProcess[str]:
        """Run ``scontrol args`` (``subject``/``operation`` name it in errors): the finished
        process whatever its exit code, or an ``ActionError`` when it could not run or timed out."""
        return self.run_program(self.scontrol, subject, operation, args, label="scontrol")

    def run_program(
        self,
        program: str,
        subject: str,
        operation: str,
        args: list[str],
        *,
        stdin_text: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        label: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run the Slurm client ``program`` (``scontrol``, ``sbatch``, ``scancel``...: a name on
        ``PATH`` or a path) with ``args``, this actuator's environment (``SLURM_CONF``) and
        timeout; ``subject``/``operation`` name it in errors.

        ``stdin_text`` is written to its standard input (``sbatch`` reads its script there);
        ``extra_env`` is added to its environment (never logged: it may hold a secret);
        ``label`` names the program in errors (by default the file name of ``program``).

        Returns
        -------
        subprocess.CompletedProcess
            The finished process, whatever its exit code (see :func:`classify_error`).

        Raises
        ------
        ActionError
            The program could not run, or ran past the timeout (transient).
        """
        command = [program, *args]
        label = label or Path(program).name or program
        environment = self._environment()
        if extra_env:
            environment.update(extra_env)
        try:
            completed = subprocess.run(  # a fixed argument list, no shell
                command,
                stdin=subprocess.DEVNULL if stdin_text is None else None,
                input=stdin_text,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                env=environment,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise ActionError(
                f"slurm: cannot {operation} {subject}: {label} not found "
                f"({excerpt(program, 120)!r}; install Slurm's client or set its path)",
                transient=False,
            ) from None
        except PermissionError:
            raise ActionError(
                f"slurm: cannot {operation} {subject}: no permission to run "
                f"{excerpt(program, 120)!r}",
                transient=False,
            ) from None
        except OSError as exc:
            raise ActionError(
                f"slurm: cannot {operation} {subject}: cannot run "
                f"{excerpt(program, 120)!r}: {excerpt(str(exc))}",
                transient=False,
            ) from None
        except subprocess.TimeoutExpired:
            raise ActionError(
                f"slurm: cannot {operation} {subject}: {label} {args[0] if args else ''} took "
                f"longer than {self.timeout_s:g} s (controller unreachable or overloaded)",
                transient=True,
            ) from None
        return completed

    def _outcome(self, node: str, operation: str, changed: bool, detail: str) -> ActionOutcome:
        if not changed:
            logger.debug("slurm: %s of node %s changed nothing: %s", operation, node, detail)
        return ActionOutcome(self.name, node, operation, changed, excerpt(detail, 400))


def classify_error(
    subject: str,
    operation: str,
    returncode: int,
    output: str,
    *,
    node: str | None = None,
    program: str = "scontrol",
) -> ActionError:
    """An ``ActionError`` for a failed call of a Slurm client (``program``, by default
    ``scontrol``) about ``subject`` (``node 'x'``, ``job '7'``), transient when a retry may
    succeed; ``node`` when the call was about that node."""
    lowered = output.lower()
    said = excerpt(output) or "nothing"
    if returncode < 0:
        how = f"{program} was killed by signal {-returncode}"
        transient = True
    else:
        how = f"{program} exited with {returncode}"
        if any(pattern in lowered for pattern in _TRANSIENT_ERRORS):
            transient = True
        elif any(pattern in lowered for pattern in _PERMANENT_ERRORS):
            transient = False
        else:
            transient = "fatal:" not in lowered
    if node is not None and (
        "invalid node name specified" in lowered or (operation == "read" and "not found" in lowered)
    ):
        return ActionError(f"slurm: unknown node {node!r} ({how}: {said})", transient=False)
    return ActionError(f"slurm: cannot {operation} {subject}: {how}: {said}", transient=transient)
