"""The collective self-check ``collective.allreduce``: the suspect node and k healthy partners
time a fixed-size all-reduce (and a matmul) in pairs, in two rounds with different pairings, and
the suspect fails when it is more than 2x slower than the round's median in both rounds
(docs/selfcheck-collective.md).

The method is dlrover's node check adapted to one suspect and known-healthy partners:

* every node of the check calls :func:`run_collective_check` at the same time (the launcher sets
  the ``MINDER_SELFCHECK_*`` variables of :class:`CollectiveConfig`); the ranks meet at a
  ``torch.distributed`` TCP store, on NCCL when CUDA is available and gloo otherwise;
* each round splits the ranks into pairs (with an odd count a partner sits the round out, never
  the suspect): round 1 in rank order (:func:`pair_round1`), round 2 by round-1 time, slowest
  with fastest (:func:`pair_round2`); the pairs of a round run at the same time, each for the
  same wall-time window, iterating *matmul, then all-reduce* and timing the two parts apart;
* :func:`judge` compares each pair's time (the slower member's) with the round's median pair
  time (with two pairs, the faster one's): a pair more than ``threshold`` (2) times slower is
  slow, and a node slow in both rounds fails; a node slow in one round only was its partner's
  victim.

Worlds of 2 and 3 nodes have no median to compare with (one group per round), so they are judged
differently: 3 nodes time each of their three pairs in turn and judge each node by its two pairs
against the pair without it; 2 nodes cannot tell from one pair which member is slow, so their
verdict rests on each node's local compute time, and the pair's all-reduce time is only reported.

Pairing and judging are pure functions of plain numbers (no torch), tested on their own; torch is
imported on the first check that needs it.
"""

from __future__ import annotations

import datetime
import logging
import math
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from minder.core.errors import ValidationError
from minder.core.selfcheck import CheckResult, CheckStatus, Measurement

__all__ = [
    "CHECK_NAME",
    "MAX_WORLD",
    "NO_PARTNER",
    "CollectiveConfig",
    "CollectiveOptions",
    "Evidence",
    "GroupTime",
    "Judgement",
    "RoundTimes",
    "judge",
    "matmul_step",
    "next_round",
    "pair_round1",
    "pair_round2",
    "run_collective_check",
]

logger = logging.getLogger(__name__)

CHECK_NAME = "collective.allreduce"
"""The check's name in a :class:`~minder.core.selfcheck.CheckResult`."""
NO_PARTNER = "no healthy partner was available"
"""The summary of a check skipped because the world has one node."""
MAX_WORLD = 16
"""Most nodes one check may have: the suspect and up to 15 partners (the measurements of a
16-node check stay under :data:`~minder.core.selfcheck.MAX_MEASUREMENTS`)."""
INSTALL_HINT = "install the deep extra: pip install 'minder[deep]' (torch==2.13.0)"

_NAME_BYTES = 256
"""Bytes of a node name in the all-gather of names (longer names are refused)."""
_SHOWN = 40
"""Characters of a node name shown in a summary or log line (names come from the environment)."""

Groups = tuple[tuple[int, ...], ...]
"""The groups of one round: tuples of ranks, each rank in at most one group."""
PARTS = ("compute", "allreduce")
"""The two timed parts of an iteration."""
ComputeStep = Callable[[], object]
"""The local work of one iteration (default :func:`matmul_step`); its return value is ignored."""


def _short(name: str) -> str:
    return name if len(name) <= _SHOWN else name[: _SHOWN - 1] + "…"


def _listed(names: Sequence[str], most: int = 4) -> str:
    return ", ".join(_short(n) for n in names[:most]) + (", …" if len(names) > most else "")


def _one_line(text: object, limit: int = 240) -> str:
    return " ".join(str(text).split())[:limit]


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CollectiveOptions:
    """How much work one check does (docs/selfcheck-collective.md, "Parameters").

    Attributes
    ----------
    allreduce_bytes
        Size of the all-reduced float32 buffer; None: 64 MiB on CUDA (dlrover's ``1 << 24``
        floats, bandwidth-bound on NVLink and InfiniBand), 1 MiB on CPU (gloo over TCP).
    matmul
        Whether each iteration does a matmul before its all-reduce (a slow GPU or CPU is part of
        what the check exposes). Ignored when a ``compute`` step is given.
    matmul_dim
        Side of the square matrices; each iteration multiplies a batch of 10 of them, as dlrover
        does. None: 2048 on CUDA, 128 on CPU (dlrover's sizes).
    warmup
        Untimed iterations of each group before its window (connection set-up, caches, clocks).
    round_s
        The timed window of each round: every group iterates until its window has passed (and at
        least ``min_iterations`` times), so all groups of a round run for the same wall time.
    min_iterations
        Fewest timed iterations per round, however slow the group (the median needs a few).
    threshold
        The slow factor: a group more than ``threshold`` times the round's median is slow.
    """

    allreduce_bytes: int | None = None
    matmul: bool = True
    matmul_dim: int | None = None
    warmup: int = 5
    round_s: float = 2.0
    min_iterations: int = 10
    threshold: float = 2.0

    def __post_init__(self) -> None:
        if self.allreduce_bytes is not None and not 4 <= self.allreduce_bytes <= 2**31:
            raise ValidationError(
                f"allreduce_bytes {self.allreduce_bytes!r}: expected 4 bytes to 2 GiB"
            )
        if self.matmul_dim is not None and not 1 <= self.matmul_dim <= 16384:
            raise ValidationError(f"matmul_dim {self.matmul_dim!r}: expected 1 to 16384")
        if not 0 <= self.warmup <= 1000:
            raise ValidationError(f"warmup {self.warmup!r}: expected 0 to 1000 iterations")
        if not (math.isfinite(self.round_s) and 0 <= self.round_s <= 600):
            raise ValidationError(f"round_s {self.round_s!r}: expected 0 to 600 seconds")
        if not 1 <= self.min_iterations <= 100_000:
            raise ValidationError(
                f"min_iterations {self.min_iterations!r}: expected 1 to 100000 iterations"
            )
        if not (math.isfinite(self.threshold) and self.threshold > 1):
            raise ValidationError(f"threshold {self.threshold!r}: expected a number above 1")


def _env_int(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, int] | None:
    for name in names:
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            return name, int(raw.strip())
        except ValueError:
            raise ValidationError(f"{name} {raw[:40]!r}: expected an integer") from None
    return None


def _parse_master(raw: str) -> tuple[str, int]:
    host, sep, port = raw.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        bad_host = not host
    else:
        bad_host = not host or ":" in host
    if not sep or bad_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValidationError(
            f"MINDER_SELFCHECK_MASTER {raw[:80]!r}: expected host:port with a port of 1-65535 "
            "(an IPv6 host in brackets: [::1]:29500)"
        )
    return host, int(port)


@dataclass(frozen=True, slots=True)
class CollectiveConfig:
    """Where this process stands in the check, from the launcher's environment.

    Attributes
    ----------
    nodes
        The check's nodes, suspect first (``MINDER_SELFCHECK_NODES``).
    suspect
        The node being judged (``MINDER_SELFCHECK_SUSPECT``).
    node
        This process's node (``MINDER_SELFCHECK_NODE``, else ``SLURMD_NODENAME``, else the host
        name).
    rank, world
        This process's rank and the world size (``MINDER_SELFCHECK_RANK``/``..._WORLD``, else
        ``SLURM_PROCID``/``SLURM_NTASKS``). Rank order need not follow ``nodes``.
    master_host, master_port
        The rendezvous (``MINDER_SELFCHECK_MASTER``, ``host:port`` of rank 0's TCP store); None
        and 0 for a world of one.
    """

    nodes: tuple[str, ...]
    suspect: str
    node: str
    rank: int
    world: int
    master_host: str | None = None
    master_port: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> CollectiveConfig:
        """Read the launcher's variables; :class:`ValidationError` (one line) on a bad value.

        Without ``MINDER_SELFCHECK_NODES`` and with a world of one (a check run by hand), the
        world is this node alone.
        """
        node = (
            environ.get("MINDER_SELFCHECK_NODE")
            or environ.get("SLURMD_NODENAME")
            or socket.gethostname()
        ).strip()
        world_entry = _env_int(environ, ("MINDER_SELFCHECK_WORLD", "SLURM_NTASKS"))
        rank_entry = _env_int(environ, ("MINDER_SELFCHECK_RANK", "SLURM_PROCID"))
        world = world_entry[1] if world_entry else 1
        rank = rank_entry[1] if rank_entry else 0
        if not 1 <= world <= MAX_WORLD:
            where = world_entry[0] if world_entry else "world size"
            raise ValidationError(
                f"{where} {world}: expected 1 to {MAX_WORLD} nodes (a suspect and partners)"
            )
        if not 0 <= rank < world:
            where = rank_entry[0] if rank_entry else "rank"
            raise ValidationError(f"{where} {rank}: expected a rank of 0 to {world - 1}")
        raw_nodes = environ.get("MINDER_SELFCHECK_NODES", "").strip()
        if not raw_nodes:
            if world > 1:
                raise ValidationError(
                    f"MINDER_SELFCHECK_NODES is unset with a world of {world}: expected the "
                    "check's node names, suspect first, comma-separated"
                )
            nodes: tuple[str, ...] = (node,)
        else:
            nodes = tuple(part.strip() for part in raw_nodes.split(","))
        for name in nodes:
            if not name or len(name.encode()) >= _NAME_BYTES or not name.isprintable():
                raise ValidationError(
                    f"MINDER_SELFCHECK_NODES entry {name[:_SHOWN]!r}: expected a printable "
                    f"node name of 1 to {_NAME_BYTES - 1} bytes"
                )
        if len(set(nodes)) != len(nodes):
            raise ValidationError(
                f"MINDER_SELFCHECK_NODES {raw_nodes[:120]!r} names a node twice: expected each "
                "node once"
            )
        if len(nodes) != world:
            raise ValidationError(
                f"MINDER_SELFCHECK_NODES has {len(nodes)} nodes for a world of {world}: expected "
                "one rank per node"
            )
        suspect = environ.get("MINDER_SELFCHECK_SUSPECT", "").strip() or (
            nodes[0] if not raw_nodes else ""
        )
        if suspect not in nodes:
            raise ValidationError(
                f"MINDER_SELFCHECK_SUSPECT {suspect[:_SHOWN]!r}: expected one of the check's "
                f"nodes ({_listed(nodes)})"
            )
        if node not in nodes:
            raise ValidationError(
                f"this node {node[:_SHOWN]!r}: expected one of the check's nodes ({_listed(nodes)})"
            )
        if world == 1:
            return cls(nodes, suspect, node, rank, world)
        raw_master = environ.get("MINDER_SELFCHECK_MASTER", "")
        if not raw_master:
            raise ValidationError(
                f"MINDER_SELFCHECK_MASTER is unset with a world of {world}: expected host:port "
                "of rank 0's rendezvous"
            )
        host, port = _parse_master(raw_master)
        return cls(nodes, suspect, node, rank, world, host, port)


# --------------------------------------------------------------------------------------------
# Pairing and judging: plain numbers, no torch
# --------------------------------------------------------------------------------------------


def _check_suspect(n: int, suspect: int) -> None:
    if not 0 <= suspect < n:
        raise ValueError(f"suspect rank {suspect}: expected a rank of 0 to {n - 1}")


def pair_round1(n: int, *, suspect: int = 0) -> Groups:
    """Round 1's groups of ``n`` ranks: pairs in rank order, ``(0, 1), (2, 3), …``.

    With an odd ``n`` one partner sits the round out, never the suspect: the highest rank that
    is not the suspect (``n = 5``: ``(0, 1), (2, 3)``, rank 4 out). Every group is a pair: a
    group of three all-reduces more slowly than a pair (4/3 of the traffic on a ring; 3.5 times
    on gloo with more ranks than cores), so it would be compared unfairly with the pairs.
    """
    if n < 2:
        raise ValueError(f"world size {n}: expected at least 2 ranks to pair")
    _check_suspect(n, suspect)
    ranks = list(range(n))
    if n % 2:
        ranks.remove(max(r for r in ranks if r != suspect))
    return tuple((ranks[i], ranks[i + 1]) for i in range(0, len(ranks), 2))


def pair_round2(times: Sequence[float], *, suspect: int = 0) -> Groups:
    """Round 2's groups: ranks sorted by their round-1 ``times``, slowest first (ties by rank),
    the slowest paired with the fastest, the second-slowest with the second-fastest, ….

    With an odd count, the rank that sat round 1 out has time NaN and plays now, ranked at the
    median of the others' times; the partner that sits round 2 out is the one of median
    round-1 time among the partners that played round 1 (the least telling: neither a slow
    pair's member, who must be re-paired, nor the fastest, who is the best reference).
    """
    n = len(times)
    if n < 2:
        raise ValueError(f"{n} round-1 times: expected at least 2 ranks to pair")
    _check_suspect(n, suspect)
    sat_out = [r for r, value in enumerate(times) if math.isnan(value)]
    if len(sat_out) > n % 2 or suspect in sat_out:
        raise ValueError(
            f"round-1 times of ranks {sat_out} are NaN: expected one partner at most to have sat "
            "round 1 out, and only with an odd number of ranks"
        )
    for rank, value in enumerate(times):
        if rank not in sat_out and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"round-1 time of rank {rank} is {value!r}: expected >= 0 seconds")
    played = [t for t in times if not math.isnan(t)]
    filled = [statistics.median(played) if math.isnan(t) else t for t in times]
    ranks = list(range(n))
    if n % 2:
        partners = sorted(
            (r for r in ranks if r != suspect and r not in sat_out), key=lambda r: (times[r], r)
        )
        ranks.remove(partners[(len(partners) - 1) // 2])
    order = sorted(ranks, key=lambda r: (-filled[r], r))
    m = len(order)
    return tuple(tuple(sorted((order[i], order[m - 1 - i]))) for i in range(m // 2))


_TRIANGLE: tuple[Groups, ...] = (((0, 1),), ((0, 2),), ((1, 2),))
"""The rounds of a 3-node check: each pair alone, in turn."""


@dataclass(frozen=True, slots=True)
class RoundTimes:
    """What one round measured.

    Attributes
    ----------
    groups
        The round's groups (ranks outside every group idled).
    compute
        Per rank, the median time of its local compute step (NaN for an idle rank).
    allreduce
        Per rank, the median time of its all-reduce, started in step with its group (NaN for an
        idle rank).
    """

    groups: Groups
    compute: Sequence[float]
    allreduce: Sequence[float]

    def rank_times(self) -> list[float]:
        """Per rank, its group's iteration time: the slowest member's compute plus the slowest
        member's all-reduce, what every member waits through (NaN for an idle rank).

        A group's members share its time, so :func:`pair_round2` splits a slow pair whatever
        its members' own times: the healthy partner of a slow node (whose own compute and
        aligned all-reduce are normal) must not be paired with it again.
        """
        out = [math.nan] * len(self.compute)
        for group in self.groups:
            time_s = max(self.compute[r] for r in group) + max(self.allreduce[r] for r in group)
            for r in group:
                out[r] = time_s
        return out


def next_round(n: int, done: Sequence[RoundTimes], *, suspect: int = 0) -> Groups | None:
    """The groups of the round after ``done`` in an ``n``-rank check, or None when it is over.

    ``n >= 4``: :func:`pair_round1`, then :func:`pair_round2` of round 1's group times
    (:meth:`RoundTimes.rank_times`; with an odd ``n`` a different partner sits each round out,
    and the suspect plays both).
    ``n == 3``: the three pairs in turn (``(0, 1)``, ``(0, 2)``, ``(1, 2)``), the third rank
    out. ``n == 2``: the one pair, once.
    """
    if n < 2:
        raise ValueError(f"world size {n}: expected at least 2 ranks")
    _check_suspect(n, suspect)
    if n == 2:
        return ((0, 1),) if not done else None
    if n == 3:
        return _TRIANGLE[len(done)] if len(done) < len(_TRIANGLE) else None
    if not done:
        return pair_round1(n, suspect=suspect)
    if len(done) == 1:
        return pair_round2(done[0].rank_times(), suspect=suspect)
    return None


@dataclass(frozen=True, slots=True)
class GroupTime:
    """One group's time in one round: the slower member's median, per part."""

    round: int
    """1-based."""
    members: tuple[int, ...]
    compute_s: float
    allreduce_s: float


@dataclass(frozen=True, slots=True)
class Evidence:
    """How one rank fared in one round (the part that compared worst).

    Attributes
    ----------
    rank, round
        The rank judged and the 1-based round (0: the local compute of a 2-node check).
    members
        The group it ran in (itself alone for a local compute comparison).
    part
        ``compute`` or ``allreduce``: the part with the larger ratio.
    time_s, reference_s, ratio
        The group's time for that part, what it was compared with, and their ratio.
    reference
        What the reference is: ``median``, ``the faster pair``, ``the pair (1, 2)`` (rank
        numbers; summaries give node names), ``its partner``.
    slow
        ``ratio > threshold``.
    """

    rank: int
    round: int
    members: tuple[int, ...]
    part: str
    time_s: float
    reference_s: float
    reference: str
    ratio: float
    slow: bool


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on every rank of a check (:func:`judge`).

    A rank fails when it is slow in every round it was judged in (two rounds, or the local
    compute of a 2-node check).
    """

    world: int
    threshold: float
    decided_by: str
    """``pair times`` (3 or more nodes) or ``local compute times`` (2 nodes)."""
    evidence: tuple[Evidence, ...]
    groups: tuple[GroupTime, ...]
    references: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    """Per round with two or more groups, its reference (compute, all-reduce) group time."""
    compute_ratio: tuple[float, ...] = ()
    """Per rank, its local compute time (median over its rounds) over the median of the other
    ranks': evidence of where a slow pair's time went (compute or network)."""

    def of(self, rank: int) -> tuple[Evidence, ...]:
        """The evidence on ``rank``, by round."""
        return tuple(e for e in self.evidence if e.rank == rank)

    def failed(self, rank: int) -> bool:
        """Whether ``rank`` was slow in every round it was judged in, and was judged in two
        (a partner that sat a round out cannot fail), or in its compute (2 ranks)."""
        mine = self.of(rank)
        return len(mine) >= (1 if self.world == 2 else 2) and all(e.slow for e in mine)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.world) if self.failed(r))


def _check_round(n: int, index: int, rnd: RoundTimes) -> None:
    if len(rnd.compute) != n or len(rnd.allreduce) != n:
        raise ValueError(
            f"round {index} has {len(rnd.compute)} compute and {len(rnd.allreduce)} all-reduce "
            f"times: expected {n} of each"
        )
    seen: set[int] = set()
    for group in rnd.groups:
        if len(group) < 2:
            raise ValueError(f"round {index} group {group}: expected two or more ranks")
        for rank in group:
            if not 0 <= rank < n or rank in seen:
                raise ValueError(
                    f"round {index} group {group}: expected distinct ranks of 0 to {n - 1}"
                )
            seen.add(rank)
            for what, value in (
                ("compute", rnd.compute[rank]),
                ("all-reduce", rnd.allreduce[rank]),
            ):
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(
                        f"round {index} {what} time of rank {rank} is {value!r}: expected a "
                        "positive number of seconds"
                    )


def _group_times(index: int, rnd: RoundTimes) -> list[GroupTime]:
    return [
        GroupTime(
            index,
            group,
            max(rnd.compute[r] for r in group),
            max(rnd.allreduce[r] for r in group),
        )
        for group in rnd.groups
    ]


def _worse(
    rank: int,
    group: GroupTime,
    ref: tuple[float, float],
    reference: str,
    threshold: float,
    parts: Sequence[str],
) -> Evidence:
    compute_ratio = group.compute_s / ref[0] if "compute" in parts else -math.inf
    allreduce_ratio = group.allreduce_s / ref[1] if "allreduce" in parts else -math.inf
    if compute_ratio >= allreduce_ratio:
        part, time_s, ref_s, ratio = "compute", group.compute_s, ref[0], compute_ratio
    else:
        part, time_s, ref_s, ratio = "allreduce", group.allreduce_s, ref[1], allreduce_ratio
    return Evidence(
        rank, group.round, group.members, part, time_s, ref_s, reference, ratio, ratio > threshold
    )


def judge(
    rounds: Sequence[RoundTimes], *, threshold: float = 2.0, parts: Sequence[str] = PARTS
) -> Judgement:
    """Judge every rank of a check from its rounds (the plan of :func:`next_round`).

    ``n >= 4`` ranks: a group's time, per part, is its slower member's; the reference of a round
    is the median group time of the round, or with two groups the faster one's; a rank is slow
    in a round when its group's compute or all-reduce time is more than ``threshold`` times the
    reference. ``n == 3``: a rank's reference in each of its two pairs is the pair without it.
    ``n == 2``: each rank's own compute time against its partner's (the pair's all-reduce cannot
    be attributed to either). A rank fails when slow in every round it was judged in.

    ``parts`` are the parts judged: both by default; ``("allreduce",)`` when the iterations do
    no compute (its time is then only the noise of an empty step).

    Raises
    ------
    ValueError
        The rounds do not follow the plan of :func:`next_round`, a time is not positive, or
        ``parts`` is empty, unknown, or lacks ``compute`` for 2 ranks.
    """
    if not (math.isfinite(threshold) and threshold > 1):
        raise ValueError(f"threshold {threshold!r}: expected a number above 1")
    if not parts or not set(parts) <= set(PARTS):
        raise ValueError(f"parts {tuple(parts)!r}: expected some of {PARTS}")
    if not rounds:
        raise ValueError("no rounds to judge: expected the rounds of next_round")
    n = len(rounds[0].compute)
    for index, rnd in enumerate(rounds, 1):
        _check_round(n, index, rnd)
    shape = [tuple(tuple(g) for g in rnd.groups) for rnd in rounds]
    if n == 2 and shape != [((0, 1),)]:
        raise ValueError(f"2 ranks ran {shape}: expected one round of the pair (0, 1)")
    if n == 3 and shape != list(_TRIANGLE):
        raise ValueError(f"3 ranks ran {shape}: expected the pairs {list(_TRIANGLE)} in turn")
    if n >= 4 and (len(rounds) != 2 or any(len(r) < 2 or {*map(len, r)} != {2} for r in shape)):
        raise ValueError(f"{n} ranks ran {shape}: expected two rounds of two or more pairs")
    groups = [g for index, rnd in enumerate(rounds, 1) for g in _group_times(index, rnd)]
    evidence: list[Evidence] = []
    references: dict[int, tuple[float, float]] = {}
    own = [
        statistics.median(c for c in (r.compute[rank] for r in rounds) if not math.isnan(c))
        for rank in range(n)
    ]
    compute_ratio = tuple(
        own[rank] / statistics.median(c for k, c in enumerate(own) if k != rank)
        for rank in range(n)
    )
    if n == 2:
        if "compute" not in parts:
            raise ValueError("2 ranks are judged by their compute: expected 'compute' in parts")
        for rank in (0, 1):
            ratio = compute_ratio[rank]
            evidence.append(
                Evidence(
                    rank, 0, (rank,), "compute", own[rank], own[1 - rank], "its partner", ratio,
                    ratio > threshold,
                )
            )  # fmt: skip
        return Judgement(
            n, threshold, "local compute times", tuple(evidence), tuple(groups), {}, compute_ratio
        )
    if n == 3:
        for rank in range(n):
            without = next(g for g in groups if rank not in g.members)
            ref = (without.compute_s, without.allreduce_s)
            label = f"the pair {without.members}"
            for group in groups:
                if rank in group.members:
                    evidence.append(_worse(rank, group, ref, label, threshold, parts))
        return Judgement(
            n, threshold, "pair times", tuple(evidence), tuple(groups), {}, compute_ratio
        )
    for index in range(1, len(rounds) + 1):
        mine = [g for g in groups if g.round == index]
        if len(mine) == 2:
            ref = (min(g.compute_s for g in mine), min(g.allreduce_s for g in mine))
            label = "the faster pair"
        else:
            ref = (
                statistics.median(g.compute_s for g in mine),
                statistics.median(g.allreduce_s for g in mine),
            )
            label = "median"
        references[index] = ref
        for group in mine:
            for rank in group.members:
                evidence.append(_worse(rank, group, ref, label, threshold, parts))
    evidence.sort(key=lambda e: (e.rank, e.round))
    return Judgement(
        n, threshold, "pair times", tuple(evidence), tuple(groups), references, compute_ratio
    )


# --------------------------------------------------------------------------------------------
# Summary and measurements
# --------------------------------------------------------------------------------------------


def _members(members: Sequence[int], names: Sequence[str]) -> str:
    kind = "pair" if len(members) == 2 else "group"
    return f"{kind} ({','.join(_short(names[r]) for r in members)})"


def _reference_text(ev: Evidence, names: Sequence[str], groups: Sequence[GroupTime]) -> str:
    if ev.reference.startswith("the pair"):
        without = next(g for g in groups if ev.rank not in g.members)
        return f"the partners' {_members(without.members, names)}"
    return ev.reference


def _evidence_text(ev: Evidence, names: Sequence[str], groups: Sequence[GroupTime]) -> str:
    part = "" if ev.part == "compute" else " all-reduce"
    return (
        f"round {ev.round} {_members(ev.members, names)}{part} {ev.ratio:.1f}x "
        f"{_reference_text(ev, names, groups)}"
    )


def _summary(j: Judgement, suspect: int, names: Sequence[str]) -> str:
    who = f"suspect {_short(names[suspect])}"
    mine = j.of(suspect)
    partners = [names[r] for r in j.failed_ranks if r != suspect]
    tail = ""
    if partners:
        shown = ", ".join(_short(p) for p in partners[:3]) + (", …" if len(partners) > 3 else "")
        tail = f"; partner {shown} also slow" if j.failed(suspect) else f"; partner {shown} slow"
    if j.world == 2:
        ev = mine[0]
        group = j.groups[0]
        partner = _short(names[1 - suspect])
        verb = "slow" if ev.slow else f"within {j.threshold:g}x"
        return (
            f"{who} {verb}: local compute {ev.ratio:.1f}x its partner {partner}'s (2-node "
            f"check: local compute times decided; the pair's all-reduce took "
            f"{group.allreduce_s * 1e3:.3g} ms and cannot be attributed to either node){tail}"
        )
    texts = [_evidence_text(ev, names, j.groups) for ev in mine]
    slow = [t for t, ev in zip(texts, mine, strict=True) if ev.slow]
    rounds = "both its pairs" if j.world == 3 else "both rounds"
    if j.failed(suspect):
        return (
            f"{who} slow in {rounds}: {', '.join(texts)} (pair times decided; its local "
            f"compute {j.compute_ratio[suspect]:.1f}x the partners' median){tail}"
        )
    if slow:
        return (
            f"{who} slow in one round only ({', '.join(slow)}): its partner's slowness, not its "
            f"own; {', '.join(t for t, ev in zip(texts, mine, strict=True) if not ev.slow)}{tail}"
        )
    return f"{who} within {j.threshold:g}x in {rounds}: {', '.join(texts)}{tail}"


def _measurements(
    j: Judgement,
    rounds: Sequence[RoundTimes],
    suspect: int,
    names: Sequence[str],
    setup: Mapping[str, Measurement],
    iterations: Sequence[Sequence[int]],
    parts: Sequence[str],
) -> dict[str, Measurement]:
    out: dict[str, Measurement] = dict(setup)
    out["world"] = j.world
    out["suspect_rank"] = suspect
    out["threshold"] = j.threshold
    out["decided_by"] = j.decided_by
    out["failed_ranks"] = ",".join(map(str, j.failed_ranks))
    for rank, name in enumerate(names):
        out[f"rank{rank}.node"] = name
        out[f"rank{rank}.compute_ratio"] = j.compute_ratio[rank]
    for index, rnd in enumerate(rounds, 1):
        for rank in range(j.world):
            if math.isfinite(rnd.compute[rank]):
                out[f"round{index}.rank{rank}.compute_s"] = rnd.compute[rank]
                out[f"round{index}.rank{rank}.allreduce_s"] = rnd.allreduce[rank]
                out[f"round{index}.rank{rank}.iterations"] = iterations[index - 1][rank]
        ref = j.references.get(index)
        if ref is not None:
            out[f"round{index}.reference_compute_s"] = ref[0]
            out[f"round{index}.reference_allreduce_s"] = ref[1]
        for g_index, group in enumerate(g for g in j.groups if g.round == index):
            key = f"round{index}.group{g_index}"
            out[f"{key}.ranks"] = ",".join(map(str, group.members))
            out[f"{key}.compute_s"] = group.compute_s
            out[f"{key}.allreduce_s"] = group.allreduce_s
            if ref is not None:
                ratios = {
                    "compute": group.compute_s / ref[0],
                    "allreduce": group.allreduce_s / ref[1],
                }
                out[f"{key}.ratio"] = max(ratios[p] for p in parts)
    for ev in j.of(suspect):
        key = f"suspect.round{ev.round}"
        out[f"{key}.part"] = ev.part
        out[f"{key}.ratio"] = ev.ratio
        out[f"{key}.reference_s"] = ev.reference_s
        out[f"{key}.slow"] = ev.slow
    return out


# --------------------------------------------------------------------------------------------
# Running it: torch.distributed
# --------------------------------------------------------------------------------------------


def _torch() -> ModuleType | None:
    try:
        import torch  # noqa: PLC0415 (optional dependency, loaded on first use)
        import torch.distributed  # noqa: PLC0415
    except ImportError:
        return None
    return torch if torch.distributed.is_available() else None


def matmul_step(dim: int, device: Any = "cpu", *, batch: int = 10) -> ComputeStep:
    """The default compute step: a batched matmul of ``batch`` pairs of ``dim`` x ``dim`` float32
    matrices on ``device`` (dlrover's node-check matmul), writing into a preallocated result."""
    torch = _torch()
    if torch is None:
        raise ValidationError(f"the matmul step needs PyTorch: {INSTALL_HINT}")
    a = torch.randn(batch, dim, dim, device=device)
    b = torch.randn(batch, dim, dim, device=device)
    out = torch.empty(batch, dim, dim, device=device)

    def step() -> None:
        torch.matmul(a, b, out=out)

    return step


class _CheckError(Exception):
    """The check cannot give an answer (a partner missing, a collective failing)."""


@dataclass
class _Progress:
    """Where the worker thread is, for the message of a check that ran past its time."""

    phase: str = "starting"
    result: tuple[list[str], list[RoundTimes], list[list[int]], dict[str, Measurement]] | None = (
        None
    )
    error: str | None = None


def _gather_names(torch: Any, dist: Any, node: str, world: int) -> list[str]:
    encoded = node.encode()
    mine = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
    mine[: len(encoded)] = torch.tensor(list(encoded), dtype=torch.uint8)
    gathered = [torch.zeros(_NAME_BYTES, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in gathered]


def _gather_times(torch: Any, dist: Any, values: Sequence[float], world: int) -> list[list[float]]:
    mine = torch.tensor(list(values), dtype=torch.float64)
    gathered = [torch.zeros(len(values), dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [t.tolist() for t in gathered]


def _time_group(
    torch: Any,
    dist: Any,
    group: Any,
    step: ComputeStep,
    buffer: Any,
    flag: Any,
    sync: Callable[[], None],
    options: CollectiveOptions,
    round_s: float,
) -> tuple[float, float, int]:
    """Iterate *compute, align, all-reduce* in ``group``: ``warmup`` untimed iterations, then
    timed ones until ``round_s`` has passed and at least ``min_iterations`` ran. Returns the
    medians of the compute and all-reduce times, and the timed iterations.

    The one-element all-reduce between the two parts carries the stop flag (every member sees
    the same sum, so all stop after the same iteration) and aligns the group, so a partner's slow
    compute is not counted as this rank's all-reduce time.
    """
    compute: list[float] = []
    allreduce: list[float] = []
    count = -options.warmup
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        step()
        sync()
        t1 = time.perf_counter()
        if count == 0:
            started = t1
        done = count >= options.min_iterations and t1 - started >= round_s
        flag.fill_(1.0 if done else 0.0)
        dist.all_reduce(flag, group=group)
        stop = float(flag.item()) > 0
        t2 = time.perf_counter()
        dist.all_reduce(buffer, group=group)
        sync()
        t3 = time.perf_counter()
        if count >= 0:  # perf_counter's steps are ns: a floor keeps a no-op step's time > 0
            compute.append(max(t1 - t0, 1e-9))
            allreduce.append(max(t3 - t2, 1e-9))
        count += 1
        if stop and count > 0:
            break
    return statistics.median(compute), statistics.median(allreduce), len(compute)


def _measure(
    torch: Any,
    config: CollectiveConfig,
    options: CollectiveOptions,
    compute: ComputeStep | None,
    timeout_s: float,
    progress: _Progress,
) -> None:
    dist = torch.distributed
    cuda = bool(torch.cuda.is_available())
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    allreduce_bytes = options.allreduce_bytes or ((64 if cuda else 1) << 20)
    dim = options.matmul_dim or (2048 if cuda else 128)
    rounds_planned = 3 if config.world == 3 else (1 if config.world == 2 else 2)
    # Each round's window shrinks so that the rounds take at most a quarter of the budget.
    round_s = min(options.round_s, timeout_s / (4 * rounds_planned))
    setup: dict[str, Measurement] = {
        "backend": "nccl" if cuda else "gloo",
        "device": str(device),
        "allreduce_bytes": allreduce_bytes,
        "matmul_dim": dim if compute is None and options.matmul else None,
        "compute_step": "matmul" if compute is None else "given",
        "warmup": options.warmup,
        "round_s": round_s,
        "min_iterations": options.min_iterations,
    }
    if compute is not None:
        step = compute
    elif options.matmul:
        step = matmul_step(dim, device)
    else:

        def step() -> None:
            return None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    timeout = datetime.timedelta(seconds=max(1.0, 0.9 * timeout_s))
    progress.phase = f"rendezvous at {config.master_host}:{config.master_port}"
    store = dist.TCPStore(
        config.master_host,
        config.master_port,
        config.world,
        is_master=config.rank == 0,
        timeout=timeout,
        wait_for_workers=True,
    )
    dist.init_process_group(
        backend, store=store, rank=config.rank, world_size=config.world, timeout=timeout
    )
    try:
        progress.phase = "gathering node names"
        names = _gather_names(torch, dist, config.node, config.world)
        if sorted(names) != sorted(config.nodes):
            raise _CheckError(
                "the ranks are on nodes "
                f"{', '.join(_short(n) for n in names[:6])}: expected "
                f"{', '.join(_short(n) for n in config.nodes[:6])}"
            )
        buffer = torch.zeros(max(1, allreduce_bytes // 4), dtype=torch.float32, device=device)
        flag = torch.zeros(1, dtype=torch.float32, device=device)
        rounds: list[RoundTimes] = []
        iterations: list[list[int]] = []
        suspect = names.index(config.suspect)
        while (groups := next_round(config.world, rounds, suspect=suspect)) is not None:
            index = len(rounds) + 1
            progress.phase = f"round {index}: creating groups {groups}"
            handles = [dist.new_group(list(g), timeout=timeout) for g in groups]
            mine = next((h for g, h in zip(groups, handles, strict=True) if config.rank in g), None)
            progress.phase = f"round {index}: timing groups {groups}"
            if mine is not None:
                c, a, count = _time_group(
                    torch, dist, mine, step, buffer, flag, sync, options, round_s
                )
            else:
                c, a, count = math.nan, math.nan, 0
            progress.phase = f"round {index}: gathering times"
            gathered = _gather_times(torch, dist, (c, a, float(count)), config.world)
            rounds.append(RoundTimes(groups, [t[0] for t in gathered], [t[1] for t in gathered]))
            iterations.append([int(t[2]) for t in gathered])
        progress.phase = "finishing"
        dist.barrier()
        progress.result = (names, rounds, iterations, setup)
    finally:
        dist.destroy_process_group()


def _worker(
    torch: Any,
    config: CollectiveConfig,
    options: CollectiveOptions,
    compute: ComputeStep | None,
    timeout_s: float,
    progress: _Progress,
) -> None:
    try:
        _measure(torch, config, options, compute, timeout_s, progress)
    except Exception as exc:  # the thread's answer is an error result, never an exception
        detail = exc if isinstance(exc, _CheckError) else f"{type(exc).__name__}: {exc}"
        progress.error = f"{progress.phase}: {_one_line(detail)}"


def _result(
    status: CheckStatus,
    summary: str,
    started: float,
    measurements: Mapping[str, Measurement] | None = None,
) -> CheckResult:
    return CheckResult(
        CHECK_NAME,
        status,
        summary,
        dict(measurements or {}),
        duration_s=time.monotonic() - started,
    )


def run_collective_check(
    environ: Mapping[str, str],
    *,
    timeout_s: float,
    options: CollectiveOptions | None = None,
    compute: ComputeStep | None = None,
) -> CheckResult:
    """Run the collective check on this node, with the check's other nodes doing the same.

    Parameters
    ----------
    environ
        The launcher's variables (:meth:`CollectiveConfig.from_env`).
    timeout_s
        The most wall time the check may take here: a partner that never joins, or a collective
        that hangs, gives ``error`` by then. The rendezvous and every collective time out at 90%
        of it; past it this function returns even if torch is still blocked (the blocked thread
        is a daemon, and ends when torch's own timeout fires).
    options
        Sizes, window and threshold (:class:`CollectiveOptions`; defaults documented there).
    compute
        The local work of each iteration, instead of :func:`matmul_step` (for example a site's
        own kernel). It runs on this rank only; its time is measured and judged like the matmul.

    Returns
    -------
    CheckResult
        The same measurements on every rank, the status judging the suspect: ``pass``,
        ``fail`` (slow in both rounds), ``skipped`` (a world of one, or no torch) or ``error``
        (bad configuration, a partner missing, a collective failing or timing out).
    """
    started = time.monotonic()
    if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
        return _result(
            CheckStatus.ERROR, f"timeout_s {timeout_s!r}: expected a positive number", started
        )
    try:
        config = CollectiveConfig.from_env(environ)
        options = options or CollectiveOptions()
    except ValidationError as exc:
        return _result(CheckStatus.ERROR, _one_line(exc, 400), started)
    if config.world == 1:
        return _result(CheckStatus.SKIPPED, NO_PARTNER, started, {"world": 1})
    parts = PARTS if compute is not None or options.matmul else ("allreduce",)
    if config.world == 2 and "compute" not in parts:
        return _result(
            CheckStatus.SKIPPED,
            "a 2-node check without a compute step cannot tell which node is slow",
            started,
            {"world": 2},
        )
    torch = _torch()
    if torch is None:
        return _result(
            CheckStatus.SKIPPED, f"torch.distributed is not installed: {INSTALL_HINT}", started
        )
    progress = _Progress()
    thread = threading.Thread(
        target=_worker,
        args=(torch, config, options, compute, timeout_s, progress),
        name="selfcheck-collective",
        daemon=True,
    )
    thread.start()
    thread.join(max(0.0, timeout_s - (time.monotonic() - started)))
    if thread.is_alive():
        logger.warning(
            "collective check on %s timed out after %.0f s in %s",
            _short(config.node),
            timeout_s,
            progress.phase,
        )
        hint = ": a node of the check did not join" if progress.phase.startswith("rendez") else ""
        return _result(
            CheckStatus.ERROR,
            f"timed out after {timeout_s:g} s in {_one_line(progress.phase, 120)}{hint}",
            started,
        )
    if progress.error is not None or progress.result is None:
        logger.warning("collective check on %s failed: %s", _short(config.node), progress.error)
        return _result(CheckStatus.ERROR, progress.error or "gave no result", started)
    names, rounds, iterations, setup = progress.result
    suspect = names.index(config.suspect)
    try:
        judgement = judge(rounds, threshold=options.threshold, parts=parts)
    except ValueError as exc:
        return _result(CheckStatus.ERROR, f"cannot judge the times: {_one_line(exc)}", started)
    summary = _summary(judgement, suspect, names)
    status = CheckStatus.FAIL if judgement.failed(suspect) else CheckStatus.PASS
    logger.info("collective check on %s: %s: %s", _short(config.node), status.value, summary)
    return _result(
        status,
        summary,
        started,
        _measurements(judgement, rounds, suspect, names, setup, iterations, parts),
    )
