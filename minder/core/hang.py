"""Hangs: the compact per-rank flight-recorder summary the agent sends, and the cross-rank
analysis the service, the CLI and the API return (docs/hangs.md).

A rank's flight-recorder dump (PyTorch's ``TORCH_FR_BUFFER_SIZE`` ring of collectives) is far
too large to send as it is: thousands of entries, each with its stack frames. The agent sends
a :class:`RankSummary` instead. Per process group it holds the group's ranks, the last
enqueued, started and completed collective sequence ids, and a few entries at the frontier:
the oldest ones not completed and the newest completed ones before them. That is what a
cross-rank analysis needs to tell who never joined the collective the others wait in, and
which entries disagree in op, size or dtype.

Everything here is plain data with ``to_dict``/``from_dict`` for the wire (msgpack or JSON),
the database and the API; ``from_dict`` validates bounds and types and raises
:class:`~minder.core.errors.ValidationError` with a one-line reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from minder.core.errors import ValidationError

SUMMARY_VERSION = 1
"""Version of :meth:`RankSummary.to_dict`."""
BATCH_FIELD = "flight_recorder"
"""The node batch envelope's field holding a list of :meth:`RankSummary.to_dict`."""
MAX_GROUPS = 256
"""Process groups kept per rank summary (a rank in more groups keeps the first ones by id and
counts the rest in ``groups_dropped``)."""
MAX_ENTRIES = 8
"""Frontier entries kept per group."""
MAX_RANK_RUNS = 512
"""Runs of a group's rank list (a strided expert-parallel group is one run)."""
MAX_TEXT = 128
"""Longest op name, group name, description, dtype or source kept."""
MAX_DIMS = 8
"""Tensors per entry side, and dimensions per tensor, kept."""
MAX_SUMMARIES_PER_BATCH = 64
"""Rank summaries one batch may carry (a node runs at most a few dozen ranks)."""
MAX_RANK = 2**31 - 1
MAX_GROUP_RANKS = 1 << 20
"""Ranks one group may list (a job of a million ranks): a summary listing more is refused, so
one forged run cannot make the service expand billions of ranks."""
MAX_SEQ = 2**62


class EntryState(StrEnum):
    """A flight-recorder entry's state."""

    SCHEDULED = "scheduled"
    STARTED = "started"
    COMPLETED = "completed"


def _text(value: Any, what: str, *, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} is {value!r:.60}: expected a string")
    return value[:limit]


def _int(value: Any, what: str, low: int = -1, high: int = MAX_SEQ) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{what} is {value!r:.60}: expected an integer in {low}..{high}")
    return value


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _list(value: Any, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ValidationError(f"{what} is {type(value).__name__}: expected a list")
    if len(value) > limit:
        raise ValidationError(f"{what} has {len(value)} items: expected at most {limit}")
    return list(value)


def _shapes(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    return tuple(
        tuple(_int(d, f"{what}[{i}]", 0) for d in _list(shape, f"{what}[{i}]", MAX_DIMS))
        for i, shape in enumerate(_list(value, what, MAX_DIMS))
    )


def _dtypes(value: Any, what: str) -> tuple[str, ...]:
    return tuple(_text(d, f"{what}[{i}]") for i, d in enumerate(_list(value, what, MAX_DIMS)))


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValidationError(f"{what} is {type(value).__name__}: expected an object")
    return value


@dataclass(frozen=True, slots=True)
class FrEntry:
    """One flight-recorder entry, without its stack frames.

    Attributes
    ----------
    seq
        The collective sequence id within its group (``collective_seq_id``), or the p2p one for
        a point-to-point entry (``p2p_seq_id``).
    op
        The profiling name as recorded (``nccl:all_reduce``, ``gloo:broadcast``).
    """

    record_id: int
    seq: int
    op: str
    state: EntryState
    p2p: bool = False
    input_sizes: tuple[tuple[int, ...], ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    created_ns: int = 0
    timeout_ms: int | None = None

    @property
    def collective(self) -> str:
        """The op without its backend prefix (``all_reduce``), for matching across backends."""
        return self.op.rpartition(":")[2]

    def to_dict(self) -> dict[str, Any]:
        return {
            "record_id": self.record_id,
            "seq": self.seq,
            "op": self.op,
            "state": self.state.value,
            "p2p": self.p2p,
            "input_sizes": [list(s) for s in self.input_sizes],
            "output_sizes": [list(s) for s in self.output_sizes],
            "input_dtypes": list(self.input_dtypes),
            "output_dtypes": list(self.output_dtypes),
            "created_ns": self.created_ns,
            "timeout_ms": self.timeout_ms,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "entry") -> FrEntry:
        d = _mapping(data, where)
        try:
            state = EntryState(str(d.get("state")))
        except ValueError:
            raise ValidationError(
                f"{where}.state is {d.get('state')!r:.40}: expected one of "
                f"{', '.join(s.value for s in EntryState)}"
            ) from None
        p2p = d.get("p2p", False)
        if not isinstance(p2p, bool):
            raise ValidationError(f"{where}.p2p is {p2p!r:.40}: expected true or false")
        return cls(
            record_id=_int(d.get("record_id"), f"{where}.record_id", 0),
            seq=_int(d.get("seq"), f"{where}.seq"),
            op=_text(d.get("op"), f"{where}.op"),
            state=state,
            p2p=p2p,
            input_sizes=_shapes(d.get("input_sizes", []), f"{where}.input_sizes"),
            output_sizes=_shapes(d.get("output_sizes", []), f"{where}.output_sizes"),
            input_dtypes=_dtypes(d.get("input_dtypes", []), f"{where}.input_dtypes"),
            output_dtypes=_dtypes(d.get("output_dtypes", []), f"{where}.output_dtypes"),
            created_ns=_int(d.get("created_ns", 0), f"{where}.created_ns", 0, 2**63 - 1),
            timeout_ms=_opt_int(d.get("timeout_ms"), f"{where}.timeout_ms"),
        )


def group_order(name: str) -> tuple[int, int, str]:
    """Sort key of process-group ids: numeric ids in numeric order, then named ones.

    ``isdecimal``, not ``isdigit``: "²" is a digit that ``int`` refuses.
    """
    return (0, int(name), "") if name.isascii() and name.isdecimal() else (1, 0, name)


RankRun = tuple[int, int, int]
"""``(start, stop, step)`` of a ``range``: the ranks ``range(start, stop, step)``."""


def rank_runs(ranks: Sequence[int]) -> tuple[RankRun, ...]:
    """``ranks`` (in their order) as arithmetic runs: ``[0..7]`` is one run, ``[0, 8, 16]``
    another."""
    runs: list[RankRun] = []
    i = 0
    n = len(ranks)
    while i < n:
        start = ranks[i]
        if i + 1 < n and ranks[i + 1] != start:
            step = ranks[i + 1] - start
            j = i + 1
            while j + 1 < n and ranks[j + 1] - ranks[j] == step:
                j += 1
            runs.append((start, ranks[j] + (1 if step > 0 else -1), step))
            i = j + 1
        else:
            runs.append((start, start + 1, 1))
            i += 1
    return tuple(runs)


def expand_runs(runs: Sequence[RankRun]) -> Iterator[int]:
    """The ranks of :func:`rank_runs`'s runs, in order."""
    for start, stop, step in runs:
        yield from range(start, stop, step)


@dataclass(frozen=True, slots=True)
class GroupState:
    """One process group as one rank sees it.

    Attributes
    ----------
    group
        The group's id as the entries name it (``process_group[0]``, also ``pg_status``'s key).
    desc
        Its description (``default_pg``, ``ep_group_3``): a hint for people, not an identity.
    ranks
        The global ranks of the group, as runs (:func:`rank_runs`); empty when the dump did
        not say.
    last_enqueued, last_started, last_completed
        Collective sequence ids from ``pg_status`` (None where absent or -1).
    entries
        Frontier entries, oldest first: the oldest not completed, preceded by the newest
        completed ones, at most :data:`MAX_ENTRIES`.
    """

    group: str
    desc: str = ""
    ranks: tuple[RankRun, ...] = ()
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None
    entries: tuple[FrEntry, ...] = ()

    def rank_list(self) -> list[int]:
        """The group's global ranks, in order."""
        return list(expand_runs(self.ranks))

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "desc": self.desc,
            "ranks": [list(r) for r in self.ranks],
            "last_enqueued": self.last_enqueued,
            "last_started": self.last_started,
            "last_completed": self.last_completed,
            "entries": [e.to_dict() for e in self.entries],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "group") -> GroupState:
        d = _mapping(data, where)
        runs: list[RankRun] = []
        total = 0
        for i, run in enumerate(_list(d.get("ranks", []), f"{where}.ranks", MAX_RANK_RUNS)):
            items = _list(run, f"{where}.ranks[{i}]", 3)
            if len(items) != 3:
                raise ValidationError(
                    f"{where}.ranks[{i}] is {items!r:.60}: expected [start, stop, step]"
                )
            start, stop, step = (_int(v, f"{where}.ranks[{i}]", -1, MAX_RANK + 1) for v in items)
            span = range(start, stop, step or 1)
            if step == 0 or start < 0 or (span and span[-1] < 0):
                raise ValidationError(
                    f"{where}.ranks[{i}] is {items!r:.60}: expected a run of ranks >= 0 "
                    "with a non-zero step"
                )
            runs.append((start, stop, step))
            total += len(span)
            if total > MAX_GROUP_RANKS:
                raise ValidationError(
                    f"{where}.ranks lists more than {MAX_GROUP_RANKS} ranks: expected one "
                    "group of a job"
                )
        return cls(
            group=_text(d.get("group"), f"{where}.group"),
            desc=_text(d.get("desc", ""), f"{where}.desc"),
            ranks=tuple(runs),
            last_enqueued=_opt_int(d.get("last_enqueued"), f"{where}.last_enqueued"),
            last_started=_opt_int(d.get("last_started"), f"{where}.last_started"),
            last_completed=_opt_int(d.get("last_completed"), f"{where}.last_completed"),
            entries=tuple(
                FrEntry.from_dict(e, f"{where}.entries[{i}]")
                for i, e in enumerate(_list(d.get("entries", []), f"{where}.entries", MAX_ENTRIES))
            ),
        )


@dataclass(frozen=True, slots=True)
class RankSummary:
    """What one rank's flight-recorder dump says, compact enough for a node batch.

    Attributes
    ----------
    rank
        The global rank (from the dump file's name: the recorder writes ``<prefix><rank>``).
    node
        The machine the rank runs on (the agent's node name; empty offline).
    version
        The dump's format version (``2.10``).
    dumped_ts
        When the dump was written (its file's modification time), unix seconds.
    source
        The dump file's name, for people.
    entries_total
        Entries in the dump before summarising.
    groups_dropped
        Groups beyond :data:`MAX_GROUPS` that were not kept.
    """

    rank: int
    version: str
    groups: tuple[GroupState, ...]
    node: str = ""
    dumped_ts: float = 0.0
    source: str = ""
    entries_total: int = 0
    groups_dropped: int = 0

    def group(self, group: str) -> GroupState | None:
        """The group of id ``group``, if this rank is in it."""
        return next((g for g in self.groups if g.group == group), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": SUMMARY_VERSION,
            "rank": self.rank,
            "node": self.node,
            "version": self.version,
            "dumped_ts": self.dumped_ts,
            "source": self.source,
            "entries_total": self.entries_total,
            "groups_dropped": self.groups_dropped,
            "groups": [g.to_dict() for g in self.groups],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "summary") -> RankSummary:
        d = _mapping(data, where)
        if d.get("v") != SUMMARY_VERSION:
            raise ValidationError(
                f"{where}.v is {d.get('v')!r:.20}: expected summary version {SUMMARY_VERSION}"
            )
        dumped = d.get("dumped_ts", 0.0)
        if (
            isinstance(dumped, bool)
            or not isinstance(dumped, int | float)
            or not math.isfinite(dumped)
        ):
            raise ValidationError(f"{where}.dumped_ts is {dumped!r:.40}: expected unix seconds")
        return cls(
            rank=_int(d.get("rank"), f"{where}.rank", 0, MAX_RANK),
            node=_text(d.get("node", ""), f"{where}.node", limit=253),
            version=_text(d.get("version"), f"{where}.version", limit=16),
            dumped_ts=float(dumped),
            source=_text(d.get("source", ""), f"{where}.source"),
            entries_total=_int(d.get("entries_total", 0), f"{where}.entries_total", 0),
            groups_dropped=_int(d.get("groups_dropped", 0), f"{where}.groups_dropped", 0),
            groups=tuple(
                GroupState.from_dict(g, f"{where}.groups[{i}]")
                for i, g in enumerate(_list(d.get("groups", []), f"{where}.groups", MAX_GROUPS))
            ),
        )


class CulpritReason(StrEnum):
    """Why a rank is named."""

    NOT_JOINED = "not_joined"
    """It never enqueued the collective the rest of its group waits in."""
    NO_DUMP = "no_dump"
    """The group waits for it and it wrote no dump (killed, or stuck holding the GIL)."""
    MISMATCH = "mismatch"
    """It entered the collective the others wait in with another op, size or dtype."""
    STOPPED_FIRST = "stopped_first"
    """Live: its step counter stopped before the rest of the job's (no flight recorder)."""


@dataclass(frozen=True, slots=True)
class Culprit:
    """A rank a hang waits on."""

    rank: int
    reason: CulpritReason
    machine: str = ""
    group: str = ""
    group_desc: str = ""
    op: str = ""
    seq: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "reason": self.reason.value,
            "machine": self.machine,
            "group": self.group,
            "group_desc": self.group_desc,
            "op": self.op,
            "seq": self.seq,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "culprit") -> Culprit:
        d = _mapping(data, where)
        try:
            reason = CulpritReason(str(d.get("reason")))
        except ValueError:
            raise ValidationError(
                f"{where}.reason is {d.get('reason')!r:.40}: expected one of "
                f"{', '.join(r.value for r in CulpritReason)}"
            ) from None
        return cls(
            rank=_int(d.get("rank"), f"{where}.rank", 0, MAX_RANK),
            reason=reason,
            machine=_text(d.get("machine", ""), f"{where}.machine", limit=253),
            group=_text(d.get("group", ""), f"{where}.group"),
            group_desc=_text(d.get("group_desc", ""), f"{where}.group_desc"),
            op=_text(d.get("op", ""), f"{where}.op"),
            seq=_opt_int(d.get("seq"), f"{where}.seq"),
            detail=_text(d.get("detail", ""), f"{where}.detail", limit=512),
        )


@dataclass(frozen=True, slots=True)
class Mismatch:
    """Ranks of one group that entered the same collective sequence id differently."""

    group: str
    seq: int
    field: str
    """``op``, ``input_sizes``, ``output_sizes``, ``input_dtypes`` or ``output_dtypes``."""
    values: Mapping[str, tuple[int, ...]]
    """Each value seen (as text) and the ranks that had it, the majority first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "seq": self.seq,
            "field": self.field,
            "values": {k: list(v) for k, v in self.values.items()},
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "mismatch") -> Mismatch:
        d = _mapping(data, where)
        values = _mapping(d.get("values", {}), f"{where}.values")
        return cls(
            group=_text(d.get("group"), f"{where}.group"),
            seq=_int(d.get("seq"), f"{where}.seq"),
            field=_text(d.get("field"), f"{where}.field"),
            values={
                _text(k, f"{where}.values key"): tuple(
                    _int(r, f"{where}.values[{k[:20]}]", 0, MAX_RANK)
                    for r in _list(v, f"{where}.values[{k[:20]}]", 4096)
                )
                for k, v in values.items()
            },
        )


@dataclass(frozen=True, slots=True)
class GroupVerdict:
    """Where one process group stands across its ranks."""

    group: str
    desc: str
    size: int
    """Ranks in the group (from its configuration, else the ranks that dumped)."""
    stuck: bool
    """Some rank waits in a collective that not every rank of the group joined or finished."""
    seq: int | None = None
    """The sequence id the group waits in (the oldest one not completed)."""
    op: str = ""
    waiting: int = 0
    """Ranks that enqueued ``seq`` and wait in it."""
    missing: tuple[int, ...] = ()
    """Ranks that never enqueued ``seq`` or wrote no dump."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "desc": self.desc,
            "size": self.size,
            "stuck": self.stuck,
            "seq": self.seq,
            "op": self.op,
            "waiting": self.waiting,
            "missing": list(self.missing),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "group verdict") -> GroupVerdict:
        d = _mapping(data, where)
        stuck = d.get("stuck")
        if not isinstance(stuck, bool):
            raise ValidationError(f"{where}.stuck is {stuck!r:.40}: expected true or false")
        return cls(
            group=_text(d.get("group"), f"{where}.group"),
            desc=_text(d.get("desc", ""), f"{where}.desc"),
            size=_int(d.get("size"), f"{where}.size", 0, MAX_RANK),
            stuck=stuck,
            seq=_opt_int(d.get("seq"), f"{where}.seq"),
            op=_text(d.get("op", ""), f"{where}.op"),
            waiting=_int(d.get("waiting", 0), f"{where}.waiting", 0, MAX_RANK),
            missing=tuple(
                _int(r, f"{where}.missing", 0, MAX_RANK)
                for r in _list(d.get("missing", []), f"{where}.missing", 4096)
            ),
        )


MAX_REPORTED = 256
"""Culprits, mismatches and stuck groups an analysis keeps for alerts and the API (counted
beyond it in ``*_dropped``)."""


@dataclass(frozen=True, slots=True)
class HangAnalysis:
    """The cross-rank verdict on a set of rank summaries (:mod:`detectors.hangs`).

    Attributes
    ----------
    hung
        Some group waits on a rank.
    culprits
        Every rank a stuck group waits on, in every group (not only the first found), ordered
        by rank.
    mismatches
        Collectives entered differently by ranks of one group.
    groups
        The stuck groups (all groups when ``hung`` is false and there are few).
    ranks_seen
        Ranks whose dump was analysed.
    ranks_expected
        Ranks of the job per the groups' configurations (at least ``ranks_seen``).
    """

    hung: bool
    culprits: tuple[Culprit, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    groups: tuple[GroupVerdict, ...] = ()
    ranks_seen: int = 0
    ranks_expected: int = 0
    versions: tuple[str, ...] = ()
    analysed_ts: float = 0.0
    culprits_dropped: int = 0
    mismatches_dropped: int = 0
    groups_dropped: int = 0
    notes: tuple[str, ...] = field(default=())
    """One-line remarks for people (a group with no configuration, dumps of mixed versions)."""

    @property
    def culprit_ranks(self) -> list[int]:
        return sorted({c.rank for c in self.culprits})

    @property
    def culprit_machines(self) -> list[str]:
        return sorted({c.machine for c in self.culprits if c.machine})

    def to_dict(self) -> dict[str, Any]:
        return {
            "hung": self.hung,
            "culprit_ranks": self.culprit_ranks,
            "culprit_machines": self.culprit_machines,
            "culprits": [c.to_dict() for c in self.culprits],
            "mismatches": [m.to_dict() for m in self.mismatches],
            "groups": [g.to_dict() for g in self.groups],
            "ranks_seen": self.ranks_seen,
            "ranks_expected": self.ranks_expected,
            "versions": list(self.versions),
            "analysed_ts": self.analysed_ts,
            "culprits_dropped": self.culprits_dropped,
            "mismatches_dropped": self.mismatches_dropped,
            "groups_dropped": self.groups_dropped,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "analysis") -> HangAnalysis:
        d = _mapping(data, where)
        hung = d.get("hung")
        if not isinstance(hung, bool):
            raise ValidationError(f"{where}.hung is {hung!r:.40}: expected true or false")
        analysed = d.get("analysed_ts", 0.0)
        if isinstance(analysed, bool) or not isinstance(analysed, int | float):
            raise ValidationError(f"{where}.analysed_ts is {analysed!r:.40}: expected seconds")
        return cls(
            hung=hung,
            culprits=tuple(
                Culprit.from_dict(c, f"{where}.culprits[{i}]")
                for i, c in enumerate(
                    _list(d.get("culprits", []), f"{where}.culprits", MAX_REPORTED)
                )
            ),
            mismatches=tuple(
                Mismatch.from_dict(m, f"{where}.mismatches[{i}]")
                for i, m in enumerate(
                    _list(d.get("mismatches", []), f"{where}.mismatches", MAX_REPORTED)
                )
            ),
            groups=tuple(
                GroupVerdict.from_dict(g, f"{where}.groups[{i}]")
                for i, g in enumerate(_list(d.get("groups", []), f"{where}.groups", MAX_REPORTED))
            ),
            ranks_seen=_int(d.get("ranks_seen", 0), f"{where}.ranks_seen", 0),
            ranks_expected=_int(d.get("ranks_expected", 0), f"{where}.ranks_expected", 0),
            versions=tuple(
                _text(v, f"{where}.versions")
                for v in _list(d.get("versions", []), f"{where}.versions", 64)
            ),
            analysed_ts=float(analysed),
            culprits_dropped=_int(d.get("culprits_dropped", 0), f"{where}.culprits_dropped", 0),
            mismatches_dropped=_int(
                d.get("mismatches_dropped", 0), f"{where}.mismatches_dropped", 0
            ),
            groups_dropped=_int(d.get("groups_dropped", 0), f"{where}.groups_dropped", 0),
            notes=tuple(
                _text(n, f"{where}.notes", limit=512)
                for n in _list(d.get("notes", []), f"{where}.notes", 64)
            ),
        )
