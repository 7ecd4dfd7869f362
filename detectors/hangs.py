"""Cross-rank hang analysis of flight-recorder summaries: who the stuck collectives wait on
(docs/hangs.md).

Input: one :class:`~minder.core.hang.RankSummary` per rank that wrote a dump
(:mod:`collectors.flight_recorder`). Output: a :class:`~minder.core.hang.HangAnalysis`.

Method
------
1. **Membership.** A group's members are the union of the rank lists the summaries give for it
   (``pg_config``), plus every rank that reports the group. A group no summary lists ranks for
   (gloo dumps once subgroups exist) has the reporting ranks as members, and the default group
   (``0``) then spans ``0..max rank``; a note says so.
2. **Progress per member.** ``enq`` is the highest sequence id the rank enqueued in the group
   (``last_enqueued``, or its newest frontier entry), ``done`` the highest it completed
   (``last_completed``, or its newest completed frontier entry, or the one before its oldest
   entry: a wrapped ring recorded nothing older). A member that reports nothing of the group
   enqueued nothing in it. Point-to-point entries have their own sequence and are not aligned.
3. **The collective a group waits in.** ``S`` = the oldest collective a waiting member
   (``enq > done``) has not completed: ``min(done + 1)`` over waiting members. No waiting
   member: the group is not stuck.
4. **Whom it waits on.** Members that never enqueued ``S`` (``enq < S``) are
   :attr:`~minder.core.hang.CulpritReason.NOT_JOINED`; members without a dump are
   :attr:`~minder.core.hang.CulpritReason.NO_DUMP` (killed, or stuck holding the GIL so that
   their dumping thread never ran). Healthy ranks hold the stuck collective enqueued; a rank
   that stopped has enqueued nothing there: *never enqueued* is the signal, not the state of
   anyone's entry. Members whose entry at ``S`` differs from the majority's in op (without its
   ``nccl:``/``gloo:`` prefix), sizes or dtypes are
   :attr:`~minder.core.hang.CulpritReason.MISMATCH` (sizes are not compared for ops whose
   sizes legitimately differ per rank: all-to-all, gather, scatter).
5. **Every group.** All groups are examined, so culprits in two expert-parallel groups are
   both named, and a stuck subgroup is found while the world group is healthy.
6. **Root causes only.** A rank missing from group A's collective may be absent because it
   waits in group B's collective, which in turn waits on the real culprit. Ranks wait on
   ranks: a member waiting in a stuck group waits on that group's missing and mismatched
   members. A
   candidate (not joined, or no dump) is named when it waits on nobody (its own outstanding
   work is nothing, or waits on no missing rank). A candidate that waits on others is not
   named when, following who waits on whom, it reaches a named rank (it is a victim); when it
   reaches none (ranks waiting on each other in a cycle: collectives issued in different
   orders), every candidate of the cycle is named. Mismatched ranks are always named.
7. **Unknown membership.** A stuck group without rank lists where nobody is missing cannot
   say whom it waits on; ranks of the job without a dump are then named
   :attr:`~minder.core.hang.CulpritReason.NO_DUMP` (with a note).

Everything is relative (sequence ids are compared, never taken as absolute), so shifting all
ids, renumbering group ids, reordering the summaries, or adding healthy groups does not
change the culprits. The work is O(ranks x groups per rank) with small constants; rank lists
are expanded once per distinct list, not once per rank.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from minder.core.hang import (
    MAX_GROUP_RANKS,
    MAX_REPORTED,
    Culprit,
    CulpritReason,
    EntryState,
    FrEntry,
    GroupState,
    GroupVerdict,
    HangAnalysis,
    Mismatch,
    RankRun,
    RankSummary,
    expand_runs,
    group_order,
)

logger = logging.getLogger(__name__)

DEFAULT_GROUP = "0"
"""The default (world) group's name in flight-recorder entries."""
MAX_MISSING = 4096
"""Ranks a group verdict lists as missing."""
MAX_NOTES = 64
ALL_GROUPS_UP_TO = 16
"""When nothing hangs, verdicts of all groups are reported if there are at most this many."""
SIZE_FREE_OPS = frozenset(
    {
        "all_to_all",
        "alltoall",
        "alltoall_base",
        "all_to_all_single",
        "gather",
        "scatter",
        "_allgather_base_coalesced",
    }
)
"""Collectives whose tensor sizes legitimately differ across ranks (only op and dtypes are
compared for them)."""
FIELDS = ("op", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
_REASON_ORDER = {CulpritReason.MISMATCH: 0, CulpritReason.NOT_JOINED: 1, CulpritReason.NO_DUMP: 2}
_NONE = -(2**63)
"""``enq``/``done`` of a member that reports nothing of a group."""


@dataclass(slots=True)
class _Group:
    name: str
    desc: str = ""
    lists: set[tuple[RankRun, ...]] = field(default_factory=set)
    states: dict[int, GroupState] = field(default_factory=dict)
    members: list[int] = field(default_factory=list)
    inferred: bool = False


@dataclass(slots=True)
class _Stuck:
    group: _Group
    seq: int
    waiting: list[int]
    not_joined: list[int]
    no_dump: list[int]
    op: str = ""
    mismatches: list[Mismatch] = field(default_factory=list)
    mismatched: dict[int, str] = field(default_factory=dict)

    @property
    def missing(self) -> list[int]:
        return sorted(self.not_joined + self.no_dump)


def _progress(state: GroupState | None) -> tuple[int, int]:
    """``(enq, done)`` of one member in one group."""
    if state is None:
        return _NONE, _NONE
    colls = [e for e in state.entries if not e.p2p]
    done_entries = [e.seq for e in colls if e.state is EntryState.COMPLETED]
    if state.last_completed is not None:
        done = max([state.last_completed, *done_entries])
    elif done_entries:
        done = max(done_entries)
    elif colls:
        done = min(e.seq for e in colls) - 1
    else:
        done = _NONE
    enq_candidates = [e.seq for e in colls]
    if state.last_enqueued is not None:
        enq_candidates.append(state.last_enqueued)
    enq = max(enq_candidates) if enq_candidates else done
    return max(enq, done), done


def _entry_at(state: GroupState | None, seq: int) -> FrEntry | None:
    if state is None:
        return None
    return next((e for e in state.entries if not e.p2p and e.seq == seq), None)


def _value(entry: FrEntry, name: str) -> str | None:
    if name == "op":
        return entry.collective
    if name in ("input_sizes", "output_sizes"):
        if entry.collective in SIZE_FREE_OPS:
            return None
        return str([list(s) for s in getattr(entry, name)])
    return str(list(getattr(entry, name)))


def _open_p2p(summary: RankSummary | None) -> bool:
    """The rank has a point-to-point op not completed (it waits on its peer)."""
    if summary is None:
        return False
    return any(
        e.p2p and e.state is not EntryState.COMPLETED for g in summary.groups for e in g.entries
    )


def _mismatches(stuck: _Stuck, waiting: set[int]) -> None:
    """Compare the members' entries at ``stuck.seq`` field by field."""
    entries: dict[int, FrEntry] = {}
    for rank, state in stuck.group.states.items():
        e = _entry_at(state, stuck.seq)
        if e is not None:
            entries[rank] = e
    if not entries:
        return
    ops: dict[str, int] = {}
    for e in entries.values():
        ops[e.collective] = ops.get(e.collective, 0) + 1
    majority_op = max(ops, key=lambda k: (ops[k], k))
    stuck.op = next(e.op for e in entries.values() if e.collective == majority_op)
    if len(entries) < 2:
        return
    for name in FIELDS:
        values: dict[str, list[int]] = {}
        for rank, e in entries.items():
            v = _value(e, name)
            if v is not None:
                values.setdefault(v, []).append(rank)
        if len(values) < 2:
            continue
        # The majority first; ties go to the value more waiting ranks hold, then by text.
        ordered = sorted(
            values.items(),
            key=lambda kv: (-len(kv[1]), -sum(r in waiting for r in kv[1]), kv[0]),
        )
        stuck.mismatches.append(
            Mismatch(
                group=stuck.group.name,
                seq=stuck.seq,
                field=name,
                values={k[:128]: tuple(sorted(v)[:MAX_MISSING]) for k, v in ordered},
            )
        )
        majority = ordered[0][0]
        # An even split cannot tell who is wrong: every side is named.
        even = len(ordered[1][1]) == len(ordered[0][1])
        for value, ranks in ordered if even else ordered[1:]:
            for r in ranks:
                if even:
                    detail = f"{name} {value[:60]}: the ranks split evenly ({len(ranks)} each)"
                else:
                    detail = (
                        f"{name} {value[:60]} where {len(values[majority])} ranks have "
                        f"{majority[:60]}"
                    )
                stuck.mismatched.setdefault(r, detail)


def analyze(
    summaries: Sequence[RankSummary],
    machines: Mapping[int, str] | None = None,
    *,
    now: float = 0.0,
) -> HangAnalysis:
    """Whom the stuck collectives of these ranks' summaries wait on (the module's method).

    Parameters
    ----------
    summaries
        One per rank that wrote a dump (a later one of the same rank, by ``dumped_ts``,
        replaces an earlier one).
    machines
        Rank -> machine; ranks not in it take their summary's ``node``.
    now
        Stamped as ``analysed_ts``.
    """
    notes: list[str] = []
    by_rank: dict[int, RankSummary] = {}
    duplicates = 0
    for s in summaries:
        old = by_rank.get(s.rank)
        if old is not None:
            duplicates += 1
            if s.dumped_ts < old.dumped_ts:
                continue
        by_rank[s.rank] = s
    if duplicates:
        notes.append(f"{duplicates} summaries repeat a rank: the latest of each is used")
    versions = tuple(sorted({s.version for s in by_rank.values()}))
    if len(versions) > 1:
        notes.append(f"dumps of mixed format versions: {', '.join(v[:16] for v in versions)}")
    dropped_groups = [s.rank for s in by_rank.values() if s.groups_dropped]
    if dropped_groups:
        notes.append(
            f"{len(dropped_groups)} ranks had more groups than a summary keeps (rank "
            f"{min(dropped_groups)} first): those groups are not analysed"
        )

    groups: dict[str, _Group] = {}
    for rank, s in by_rank.items():
        for state in s.groups:
            g = groups.get(state.group)
            if g is None:
                g = groups[state.group] = _Group(state.group)
            if state.desc and not g.desc:
                g.desc = state.desc
            if state.ranks:
                g.lists.add(state.ranks)
            g.states[rank] = state

    seen = set(by_rank)
    known: set[int] = set(seen)
    for g in groups.values():
        members: set[int] = set(g.states)
        for runs in g.lists:
            members.update(expand_runs(runs))
        if len(g.lists) > 1:
            notes.append(
                f"group {g.name[:32]} ({g.desc[:32]}): ranks list {len(g.lists)} different "
                "memberships; their union is used"
            )
        g.members = sorted(members)
        known.update(members)
    world = max(known) + 1 if known else 0
    for g in groups.values():
        if g.lists:
            continue
        g.inferred = True
        if (g.name == DEFAULT_GROUP or g.desc == "default_pg") and world <= MAX_GROUP_RANKS:
            g.members = list(range(world))
            known.update(g.members)
            notes.append(
                f"group {g.name[:32]} ({g.desc[:32]}) has no rank list: taken as ranks "
                f"0..{world - 1}"
            )
        else:
            notes.append(
                f"group {g.name[:32]} ({g.desc[:32]}) has no rank list: its members are the "
                f"{len(g.members)} ranks that report it"
            )
    no_dump_ranks = sorted(known - seen)

    # -- each group: the collective it waits in, and who is missing there ------------------
    stuck_groups: list[_Stuck] = []
    healthy: list[_Group] = []
    waits_in: dict[int, list[int]] = {}  # rank -> indices of stuck groups it waits in
    for g in sorted(groups.values(), key=lambda g: group_order(g.name)):
        progress = {r: _progress(g.states.get(r)) for r in g.members if r in by_rank}
        fronts = [done + 1 for enq, done in progress.values() if enq > done]
        if not fronts:
            healthy.append(g)
            continue
        seq = min(fronts)
        waiting = [r for r, (enq, done) in progress.items() if enq >= seq > done]
        stuck = _Stuck(
            group=g,
            seq=seq,
            waiting=sorted(waiting),
            not_joined=sorted(r for r, (enq, _) in progress.items() if enq < seq),
            no_dump=[r for r in g.members if r not in by_rank],
        )
        _mismatches(stuck, set(waiting))
        index = len(stuck_groups)
        stuck_groups.append(stuck)
        for r in waiting:
            waits_in.setdefault(r, []).append(index)

    # -- root causes: candidates that wait on nobody, or on nobody who reaches a named one -----
    candidates: dict[int, list[tuple[int, CulpritReason]]] = {}
    for i, st in enumerate(stuck_groups):
        for r in st.not_joined:
            candidates.setdefault(r, []).append((i, CulpritReason.NOT_JOINED))
        for r in st.no_dump:
            candidates.setdefault(r, []).append((i, CulpritReason.NO_DUMP))
    # Whom each stuck group waits on: its missing members and its mismatched ones.
    missing_sets = [set(st.missing) | set(st.mismatched) for st in stuck_groups]
    mismatched_ranks = {r for st in stuck_groups for r in st.mismatched}

    def waits_on_someone(rank: int) -> bool:
        return any(missing_sets[i] - {rank} for i in waits_in.get(rank, ()))

    # A rank inside a send or receive waits on its peer, whom its entry does not name: it did
    # not join the others' collective because it is blocked, not because it stopped.
    in_p2p = {r for r in candidates if _open_p2p(by_rank.get(r))}
    named: set[int] = {r for r in candidates if r not in in_p2p and not waits_on_someone(r)}
    cycle: set[int] = set()
    blocked = set(candidates) - named - mismatched_ranks - in_p2p
    if blocked:
        # Reverse search from the named: a group reaches a named rank when one of its missing
        # ranks does; a rank does when a group it waits in does.
        missing_in: dict[int, list[int]] = {}
        for i, ms in enumerate(missing_sets):
            for r in ms:
                missing_in.setdefault(r, []).append(i)
        waiters = [st.waiting for st in stuck_groups]
        roots = named | mismatched_ranks
        reached: set[int] = set(roots)
        group_reached = [False] * len(stuck_groups)
        queue = deque(roots)
        while queue:
            r = queue.popleft()
            for i in missing_in.get(r, ()):
                if group_reached[i]:
                    continue
                group_reached[i] = True
                for w in waiters[i]:
                    if w not in reached:
                        reached.add(w)
                        queue.append(w)
        cycle = blocked - reached
        if cycle:
            notes.append(
                f"ranks {_ranks_text(sorted(cycle))} wait on each other across groups (a cycle: "
                "collectives issued in different orders); all are named"
            )
            named |= cycle

    if in_p2p:
        if named or mismatched_ranks:
            notes.append(
                f"ranks {_ranks_text(sorted(in_p2p))} wait in a send or receive (on a peer the "
                "dumps do not name) and are not named: the ranks named explain the hang"
            )
        else:
            notes.append(
                f"ranks {_ranks_text(sorted(in_p2p))} wait in a send or receive and nothing "
                "else explains the hang: they are named"
            )
            named |= in_p2p

    mismatched: dict[int, tuple[int, str]] = {}
    for i, st in enumerate(stuck_groups):
        for r, detail in st.mismatched.items():
            mismatched.setdefault(r, (i, detail))

    unknown_membership = [
        st
        for st in stuck_groups
        if st.group.inferred and not st.missing and not st.mismatched and no_dump_ranks
    ]
    if unknown_membership and not named and not mismatched:
        st = unknown_membership[0]
        notes.append(
            f"group {st.group.name[:32]} ({st.group.desc[:32]}) waits in #{st.seq} with no "
            "known member missing and no rank list: ranks without a dump are named"
        )
        index = stuck_groups.index(st)
        for r in no_dump_ranks:
            candidates.setdefault(r, []).append((index, CulpritReason.NO_DUMP))
            named.add(r)
    elif no_dump_ranks and not stuck_groups:
        notes.append(f"no group waits, but ranks {_ranks_text(no_dump_ranks)} wrote no dump")

    def machine(rank: int) -> str:
        if machines is not None and rank in machines:
            return machines[rank][:253]
        s = by_rank.get(rank)
        return s.node if s is not None else ""

    culprits: list[Culprit] = []
    for rank in sorted(named | set(mismatched)):
        if rank in mismatched:
            i, detail = mismatched[rank]
            st = stuck_groups[i]
            culprits.append(_culprit(rank, CulpritReason.MISMATCH, st, machine(rank), detail))
            continue
        options = sorted(
            candidates[rank],
            key=lambda c: (
                _REASON_ORDER[c[1]],
                len(stuck_groups[c[0]].group.members),
                group_order(stuck_groups[c[0]].group.name),
            ),
        )
        i, reason = options[0]
        st = stuck_groups[i]
        others = len({j for j, _ in options}) - 1
        detail = _detail(reason, st, others, rank in cycle)
        culprits.append(_culprit(rank, reason, st, machine(rank), detail))

    mismatches = [m for st in stuck_groups for m in st.mismatches]
    ordered = sorted(
        stuck_groups,
        key=lambda st: (
            not (st.missing or st.mismatched),
            len(st.group.members),
            group_order(st.group.name),
        ),
    )
    verdicts = [_verdict(st) for st in ordered]
    hung = bool(culprits)
    if not hung and len(groups) <= ALL_GROUPS_UP_TO:
        verdicts += [
            GroupVerdict(group=g.name, desc=g.desc, size=len(g.members), stuck=False)
            for g in healthy
        ]
    return HangAnalysis(
        hung=hung,
        culprits=tuple(culprits[:MAX_REPORTED]),
        mismatches=tuple(mismatches[:MAX_REPORTED]),
        groups=tuple(verdicts[:MAX_REPORTED]),
        ranks_seen=len(seen),
        ranks_expected=len(known),
        versions=versions[:64],
        analysed_ts=now,
        culprits_dropped=max(0, len(culprits) - MAX_REPORTED),
        mismatches_dropped=max(0, len(mismatches) - MAX_REPORTED),
        groups_dropped=max(0, len(verdicts) - MAX_REPORTED),
        notes=tuple(n[:512] for n in notes[:MAX_NOTES]),
    )


def _ranks_text(ranks: Sequence[int], limit: int = 8) -> str:
    head = ", ".join(str(r) for r in ranks[:limit])
    return head + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _where(st: _Stuck) -> str:
    desc = f" ({st.group.desc})" if st.group.desc else ""
    op = f"{st.op} " if st.op else ""
    return f"{op}#{st.seq} of group {st.group.name}{desc}"


def _detail(reason: CulpritReason, st: _Stuck, others: int, in_cycle: bool) -> str:
    n, size = len(st.waiting), len(st.group.members)
    if reason is CulpritReason.NO_DUMP:
        text = f"wrote no dump; {n} of {size} ranks wait for it in {_where(st)}"
    else:
        text = f"never enqueued {_where(st)}, where {n} of {size} ranks wait"
    if others:
        text += f"; also awaited in {others} other group{'s' if others > 1 else ''}"
    if in_cycle:
        text += "; it waits on ranks that wait on it"
    return text


def _culprit(rank: int, reason: CulpritReason, st: _Stuck, machine: str, detail: str) -> Culprit:
    if reason is CulpritReason.MISMATCH:
        detail = f"entered {_where(st)} with {detail}"
    return Culprit(
        rank=rank,
        reason=reason,
        machine=machine,
        group=st.group.name[:128],
        group_desc=st.group.desc[:128],
        op=st.op[:128],
        seq=st.seq,
        detail=detail[:512],
    )


def _verdict(st: _Stuck) -> GroupVerdict:
    return GroupVerdict(
        group=st.group.name[:128],
        desc=st.group.desc[:128],
        size=len(st.group.members),
        stuck=True,
        seq=st.seq,
        op=st.op[:128],
        waiting=len(st.waiting),
        missing=tuple(st.missing[:MAX_MISSING]),
    )
