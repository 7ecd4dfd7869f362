"""PyTorch flight-recorder dumps -> compact per-rank summaries (docs/hangs.md).

With ``TORCH_FR_BUFFER_SIZE`` set, every rank of a torch.distributed job keeps a ring of its
last collectives; on a timeout (NCCL's watchdog) or when asked
(``torch._C._distributed_c10d._dump_fr_trace()``) it writes them to ``<prefix><rank>``
(``TORCH_FR_DUMP_TEMP_FILE``, formerly ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default
``/tmp/nccl_trace_rank_``). A dump is a pickle (or, from ``_dump_fr_trace_json()``, a JSON
object) of ``{"version": "2.x", "pg_config": {name: {"name", "desc", "ranks"}},
"pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective",
"last_completed_collective"}}, "entries": [...], ...}``; each entry names its group
(``process_group`` = ``(name, desc)`` and the rank-local ``pg_id``), its
``collective_seq_id`` (``p2p_seq_id`` for a point-to-point op, ``is_p2p``), its
``profiling_name`` (``nccl:all_reduce``), tensor sizes and dtypes, its ``state``
(``scheduled``, ``started``, ``completed``), ``retired`` and its stack ``frames``.

**Loading a pickle executes code**: a pickle may name any importable callable (``os.system``)
and have it called while it loads. Dumps copied from a job are untrusted files, so they are
read with :class:`RestrictedUnpickler`, which refuses every global: the recorder's pickles
hold only dicts, lists, tuples, strings, numbers, booleans and None, none of which needs one.
Files are also bounded in size (:data:`MAX_DUMP_BYTES`).

Facts of the format this module relies on (checked on torch 2.13 with gloo, and on the format
NCCL builds write):

- ``pg_status`` is keyed by the rank-local ``pg_id`` that entries carry, not by the group's
  name (``process_group[0]``): the same group can have ``pg_id`` 1 on one rank and 2 on
  another. Keys are mapped to names through the entries; a key no entry maps is taken as a
  name when ``pg_config`` knows it (``0``, the default group, always is ``0``).
- Its values are integers in pickles and strings in JSON dumps (and in some releases); -1
  means none.
- ``pg_config`` is keyed by group name, with ``ranks`` a string (``'[0, 1, 2, 3]'``). Gloo
  writes one item keyed ``''`` for the default group, whose ``ranks`` are ``'[]'`` once a
  subgroup exists; it is taken as the default group's (``0``) when it lists ranks.
- Gloo leaves every entry's ``state`` at ``scheduled`` and marks completion with ``retired``;
  a retired entry, or one at or before its group's ``last_completed_collective``, counts as
  completed here (and its :class:`~minder.core.hang.FrEntry` says ``completed``).
- Entries are in recording order; a long job's ring has wrapped, so its entries start at a
  high sequence id. Older 2.x versions lack some fields (``pg_status``, ``is_p2p``,
  ``p2p_seq_id``, ``retired``, ``timeout_ms``); they default.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import logging
import os
import pickle
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, compress, repeat
from operator import is_, itemgetter
from pathlib import Path
from typing import Any

from minder.core.errors import ValidationError
from minder.core.hang import (
    MAX_DIMS,
    MAX_ENTRIES,
    MAX_GROUP_RANKS,
    MAX_GROUPS,
    MAX_RANK,
    MAX_RANK_RUNS,
    MAX_SEQ,
    MAX_TEXT,
    EntryState,
    FrEntry,
    GroupState,
    RankSummary,
    group_order,
    rank_runs,
)

logger = logging.getLogger(__name__)

MAX_DUMP_BYTES = 32 * 2**20
"""Largest dump file read (a 2,000-entry dump with its frames is well under a few MB)."""
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
"""Where the recorder writes ``<prefix><rank>`` when neither variable is set."""
PREFIX_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
"""The variables naming the dump prefix, newest first."""
SUPPORTED_MAJOR = 2
"""Dump format major version read (any ``2.x``)."""
SUFFIXES = (".json", ".pkl", ".pickle")
"""File-name suffixes tolerated after ``<prefix><rank>``."""
DEFAULT_GROUP = "0"
"""The default (world) group's name in entries and ``pg_status``."""
PARALLEL_FROM = 64
"""Directories with at least this many dumps are read by a process pool."""

_NAME = re.compile(r"^(.*?)(\d+)(\.json|\.pkl|\.pickle)?$")


class DumpError(ValidationError):
    """A file is not a readable flight-recorder dump, or a directory not one job's dumps."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that refuses every global (so no callable can run while a dump loads).

    Flight-recorder pickles (written by c10's pickler) hold only dicts, lists, tuples,
    strings, numbers, booleans and None, which load without :meth:`find_class`. A file that
    names any ``module.name`` is not such a dump and is refused before anything is imported
    or called.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(
            f"refused global {module[:64]}.{name[:64]}: a flight-recorder dump holds only "
            "plain data"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError(
            f"refused persistent id {pid!r:.40}: a flight-recorder dump holds only plain data"
        )


def dump_prefix_from_env(environ: Mapping[str, str]) -> str:
    """The ``<prefix>`` of dump file names the recorder uses given these variables:
    ``TORCH_FR_DUMP_TEMP_FILE``, else ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else
    :data:`DEFAULT_PREFIX`."""
    for name in PREFIX_VARIABLES:
        value = environ.get(name, "")
        if value:
            return value
    return DEFAULT_PREFIX


def _where(path: str | os.PathLike[str]) -> str:
    return str(path)[-160:]


def load_dump(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one dump (pickle or JSON, told apart by content) as a dict.

    Raises
    ------
    DumpError
        The file is larger than :data:`MAX_DUMP_BYTES`, truncated or corrupt, names a global,
        is not a flight-recorder dump (no ``version`` with ``entries`` or ``pg_status``), or
        has a version other than 2.x.
    OSError
        It cannot be read.
    """
    where = _where(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_DUMP_BYTES:
            raise DumpError(
                f"{where}: {size} bytes: expected a flight-recorder dump of at most "
                f"{MAX_DUMP_BYTES} bytes"
            )
        # As large as the file says (a read of MAX_DUMP_BYTES + 1 would map that much afresh for
        # every dump, page by page); then on, up to the bound, should it have grown meanwhile.
        data = f.read(size + 1)
        if len(data) > size:
            data += f.read(MAX_DUMP_BYTES + 1 - len(data))
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{where}: grew beyond {MAX_DUMP_BYTES} bytes while read")
    return parse_dump(data, where)


_PICKLE_BUFFER = 1 << 16


def parse_dump(data: bytes, where: str = "dump") -> dict[str, Any]:
    """:func:`load_dump` of bytes already read; ``where`` names them in errors."""
    if not data:
        raise DumpError(f"{where}: empty file: expected a flight-recorder dump")
    # JSON may start with blanks; a pickle starts with its protocol opcode (no copy of the data)
    head = data[:1] if data[:1] not in b" \t\r\n" else data.lstrip()[:1]
    if head == b"{":
        try:
            loaded: Any = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise DumpError(
                f"{where}: truncated or corrupt JSON ({str(exc)[:80]}): expected a "
                "flight-recorder dump"
            ) from None
    else:
        enabled = gc.isenabled()
        gc.disable()  # millions of small containers: collecting while they load only costs
        try:
            # Through a buffered reader: the unpickler then takes the bytes in large chunks
            # (its peek); from a bare BytesIO it reads opcode by opcode, 4-5x slower on the
            # recorder's protocol-2 pickles, which have no frames. 64 KiB is as fast as
            # pickle.loads; a 1 MiB buffer cost 1.2-1.3x on dumps read afresh (measured by
            # bench/hang_bench.py --per-dump).
            stream = io.BufferedReader(io.BytesIO(data), buffer_size=_PICKLE_BUFFER)
            loaded = RestrictedUnpickler(stream).load()
        except DumpError as exc:
            raise DumpError(f"{where}: {exc}") from None
        except Exception as exc:  # any failure of a corrupt pickle is one error
            raise DumpError(
                f"{where}: truncated or corrupt pickle ({type(exc).__name__}: "
                f"{str(exc)[:80]}): expected a flight-recorder dump"
            ) from None
        finally:
            if enabled:
                gc.enable()
    if (
        not isinstance(loaded, dict)
        or "version" not in loaded
        or not ("entries" in loaded or "pg_status" in loaded)
    ):
        what = type(loaded).__name__
        keys = ", ".join(str(k)[:20] for k in list(loaded)[:5]) if isinstance(loaded, dict) else ""
        raise DumpError(
            f"{where}: a {what}{f' of {keys}' if keys else ''} is not a flight-recorder dump: "
            "expected an object with version and entries"
        )
    version = str(loaded["version"])
    if _major(version) != SUPPORTED_MAJOR:
        raise DumpError(
            f"{where}: dump version {version[:16]!r}: expected a {SUPPORTED_MAJOR}.x "
            "flight-recorder dump"
        )
    if not isinstance(loaded.get("entries", []), list):
        raise DumpError(f"{where}: entries is {type(loaded['entries']).__name__}: expected a list")
    return loaded


def _major(version: str) -> int | None:
    head = version.split(".", 1)[0].strip()
    return int(head) if head.isdigit() else None


# -- summarising ----------------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    """An int from an int or a numeric string; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
    return None


def _seq(value: Any) -> int | None:
    """A sequence id from ``pg_status``: -1 (none), absent or out of range -> None."""
    n = _as_int(value)
    return n if n is not None and 0 <= n <= MAX_SEQ else None


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else str(value)[:MAX_TEXT]


_SHAPE_TYPES = (list, tuple)


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    """Tensor shapes: at most MAX_DIMS shapes of at most MAX_DIMS dims, each an int >= 0
    (others dropped, negatives as 0); () for anything that is not a list of shapes."""
    if not isinstance(value, list | tuple):
        return ()
    # The usual value, a plain list of a few short plain lists of plain non-negative ints, is
    # taken as it is, tested at C speed; anything else (subclasses included, whose iteration
    # may differ from their slices) is cut and cleaned shape by shape, to the same result.
    if (
        type(value) in _SHAPE_TYPES
        and len(value) <= MAX_DIMS
        and all(type(shape) in _SHAPE_TYPES and len(shape) <= MAX_DIMS for shape in value)
    ):
        dims = list(chain.from_iterable(value))
        if list(map(type, dims)).count(int) == len(dims) and (not dims or min(dims) >= 0):
            return tuple(map(tuple, value))
    out: list[tuple[int, ...]] = []
    for shape in value[:MAX_DIMS]:
        if isinstance(shape, list | tuple):
            cut = tuple(shape[:MAX_DIMS])
            out.append(tuple(max(0, d) for d in (_as_int(x) for x in cut) if d is not None))
    return tuple(out)


def _dtypes(value: Any) -> tuple[str, ...]:
    """Dtype names: at most MAX_DIMS, each cut to MAX_TEXT; () for anything not a list."""
    if not isinstance(value, list | tuple):
        return ()
    if (
        type(value) in _SHAPE_TYPES
        and len(value) <= MAX_DIMS
        and list(map(type, value)).count(str) == len(value)
        and (not value or max(map(len, value)) <= MAX_TEXT)
    ):
        return tuple(value)  # the usual value: a plain list of plain short strings
    return tuple(_text(d) for d in value[:MAX_DIMS])


def _rank_list(value: Any) -> tuple[int, ...] | None:
    """``pg_config``'s ``ranks``: a string ``'[0, 1]'`` (or a list); None when unreadable."""
    if isinstance(value, str):
        return _ranks_of_text(value)
    return _ranks_of_list(value)


@functools.lru_cache(maxsize=1024)
def _ranks_of_text(text: str) -> tuple[int, ...] | None:
    """:func:`_rank_list` of a string, kept: every rank's dump repeats the same groups' rank
    strings (a world group of 4,096 ranks costs a millisecond to parse, once)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return _ranks_of_list(value)


def _ranks_of_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list | tuple):
        return None
    if all(type(r) is int for r in value):  # the usual case, checked at C speed
        if value and not (min(value) >= 0 and max(value) <= MAX_RANK):
            return None
        return tuple(value)
    ranks = [_as_int(r) for r in value]
    if any(r is None or not 0 <= r <= MAX_RANK for r in ranks):
        return None
    return tuple(r for r in ranks if r is not None)


_runs_of = functools.lru_cache(maxsize=1024)(rank_runs)
""":func:`~minder.core.hang.rank_runs` of a rank tuple, kept (the same groups in every dump)."""


def _pg_name(pg: Any, pg_id: Any) -> tuple[str, str]:
    """A group's name and description from an entry's ``process_group`` and ``pg_id``."""
    if isinstance(pg, list | tuple) and pg:
        return _text(pg[0]), _text(pg[1]) if len(pg) > 1 else ""
    n = _as_int(pg_id)
    return (str(n) if n is not None else DEFAULT_GROUP), ""


_STATES = {s.value: s for s in EntryState}


def _state(entry: Mapping[str, Any], done: bool) -> EntryState:
    if done:
        return EntryState.COMPLETED
    return _STATES.get(str(entry.get("state", "scheduled")), EntryState.SCHEDULED)


EntryValues = tuple[
    int,
    int,
    str,
    EntryState,
    bool,
    tuple[tuple[int, ...], ...],
    tuple[tuple[int, ...], ...],
    tuple[str, ...],
    tuple[str, ...],
    int,
    int | None,
]
"""A :class:`~minder.core.hang.FrEntry`'s field values, in its fields' order."""


def _entry(entry: Mapping[str, Any], seq: int, p2p: bool, done: bool) -> EntryValues:
    """The :class:`~minder.core.hang.FrEntry` of a recorded entry, as its fields' values (a
    pool worker sends values; the dataclass is built once, where it is used)."""
    get = entry.get
    record_id = get("record_id")
    if type(record_id) is not int:
        record_id = _as_int(record_id)
    created = get("time_created_ns")
    if type(created) is not int:
        created = _as_int(created)
    timeout = get("timeout_ms")
    if type(timeout) is not int:
        timeout = _as_int(timeout)
    op = get("profiling_name", "")
    return (
        record_id if record_id is not None and record_id >= 0 else 0,
        seq,
        op[:MAX_TEXT] if type(op) is str else _text(op),
        _state(entry, done),
        p2p,
        _sizes(get("input_sizes")),
        _sizes(get("output_sizes")),
        _dtypes(get("input_dtypes")),
        _dtypes(get("output_dtypes")),
        created if created is not None and 0 <= created < 2**63 else 0,
        timeout if timeout is not None and 0 <= timeout <= MAX_SEQ else None,
    )


class _Group:
    __slots__ = ("desc", "entries", "name", "pg_ids", "ranks", "status")

    def __init__(self, name: str) -> None:
        self.name = name
        self.desc = ""
        self.ranks: tuple[int, ...] | None = None
        self.status: Mapping[str, Any] | None = None
        self.entries: list[Mapping[str, Any]] = []  # in recording order, when walked
        self.pg_ids: set[Any] = set()  # the recorded pg_ids of its entries, when located


_LOCATED_GROUPS = 32
"""Most ``pg_id`` values in one dump whose entries :func:`_locate` groups (a rank is in a few
groups; entries of more are walked one by one)."""
_get = dict.get
"""``dict.get`` unbound, to map over a list of entries at C speed (TypeError for a non-dict)."""


def _locate(entries: Any) -> tuple[list[Any], dict[Any, Any]] | None:
    """Each entry's recorded ``pg_id`` and, per ``pg_id`` in order of first appearance, the one
    ``process_group`` all its entries record; None when the entries must be walked one by one.

    This is the grouping :func:`_walk` does, at C speed (a dump has thousands of entries in a
    handful of groups): every entry is a dict, its ``pg_id`` hashable, and all entries of one
    ``pg_id`` record an equal ``process_group`` (None, or a list or tuple of strings), so that
    ``(process_group, pg_id)``, the group an entry joins, is known from its ``pg_id`` alone.
    Anything else (an entry that is not a dict, a ``pg_id`` shared by two process groups) is
    left to :func:`_walk`, which gives the same result for what both can read.
    """
    if type(entries) is not list:
        return None
    try:
        ids = list(map(_get, entries, repeat("pg_id")))
        distinct = set(ids)
    except TypeError:  # an entry that is not a dict, or an unhashable pg_id
        return None
    if len(distinct) > _LOCATED_GROUPS:
        return None  # the searches below cost entries x groups
    index = ids.index
    first: dict[Any, Any] = dict.fromkeys(sorted(distinct, key=index))  # as first recorded
    pgs = list(map(_get, entries, repeat("process_group")))
    for pg_id in first:
        pg = pgs[index(pg_id)]
        if pg is not None and not (
            type(pg) in (tuple, list) and all(type(part) is str for part in pg)
        ):
            return None
        first[pg_id] = pg
    if len(first) == 1:  # one pg_id (and ``pg`` is its process group): a count will do
        if pgs.count(pg) != len(pgs):
            return None
    elif pgs != list(map(first.__getitem__, ids)):
        return None
    return ids, first


def _walk(entries: Iterable[Any], join: Callable[[Any, Any], _Group]) -> int:
    """Group ``entries`` one by one (into each group's ``entries``); returns how many were
    skipped (not objects, or with unhashable fields)."""
    skipped = 0
    seen: dict[Any, _Group] = {}  # (process_group, pg_id) as recorded -> its group
    for e in entries:
        try:
            pg = e.get("process_group")
            ident = (
                pg if type(pg) is tuple else tuple(pg) if type(pg) is list else pg,
                e.get("pg_id"),
            )
            g = seen.get(ident)
        except (AttributeError, TypeError):  # not an object, or unhashable fields
            skipped += 1
            continue
        if g is None:
            g = seen[ident] = join(*ident)
        g.entries.append(e)
    return skipped


def _frontier(
    newest_first: Iterable[Mapping[str, Any]], last_completed: int | None
) -> list[EntryValues]:
    """The oldest collective not completed, preceded by the newest completed ones, plus the
    oldest point-to-point op not completed (in recording order), at most MAX_ENTRIES, of one
    group's entries given newest first.

    Entries are in recording order, so with ``last_completed`` known the search runs back
    from the newest entry and stops once past it with enough completed ones (a long ring is
    not walked through); without it, every entry is looked at.
    """
    colls: list[tuple[Mapping[str, Any], int, bool]] = []  # newest first
    p2p_open: tuple[Mapping[str, Any], int] | None = None
    completed_before = 0
    for e in newest_first:
        get = e.get
        p2p = bool(get("is_p2p", False))
        seq = get("p2p_seq_id" if p2p else "collective_seq_id")
        if type(seq) is not int:
            seq = _as_int(seq)
            if seq is None:
                continue
        if not 0 <= seq <= MAX_SEQ:
            continue
        done = get("state") == "completed" or get("retired") is True
        if p2p:
            if not done:
                p2p_open = (e, seq)  # the oldest open one wins: the search runs backwards
            continue
        if last_completed is not None and seq <= last_completed:
            done = True
            colls.append((e, seq, done))
            completed_before += 1
            if completed_before >= MAX_ENTRIES:
                break
        else:
            colls.append((e, seq, done))
    colls.reverse()
    first_open = next((i for i, (_, _, done) in enumerate(colls) if not done), None)
    room = MAX_ENTRIES - (1 if p2p_open is not None else 0)
    end = len(colls) if first_open is None else first_open + 1
    window = [_entry(e, seq, False, done) for e, seq, done in colls[max(0, end - room) : end]]
    if p2p_open is not None:
        window.append(_entry(p2p_open[0], p2p_open[1], True, False))
        window.sort(key=itemgetter(0))  # by record id
    return window


def _newest_first(
    entries: list[Any], ids: list[Any], pg_ids: set[Any], whole: bool
) -> Iterable[Mapping[str, Any]]:
    """The entries whose recorded ``pg_id`` is one of ``pg_ids``, newest first (picked at C
    speed, and lazily unless the ``whole`` group will be walked)."""
    if not whole:
        return compress(reversed(entries), map(pg_ids.__contains__, reversed(ids)))
    mine = list(compress(entries, map(pg_ids.__contains__, ids)))
    # A group walked whole (no last completed id) of point-to-point ops that all completed,
    # the usual pipeline-parallel group, has no frontier: told at C speed, not entry by entry.
    n = len(mine)
    if list(map(_get, mine, repeat("is_p2p"))).count(True) == n and (
        list(map(_get, mine, repeat("state"))).count("completed") == n
        or all(map(is_, map(_get, mine, repeat("retired")), repeat(True)))
    ):
        return ()
    mine.reverse()
    return mine


def summarize(
    dump: Mapping[str, Any],
    rank: int,
    *,
    node: str = "",
    source: str = "",
    dumped_ts: float = 0.0,
) -> RankSummary:
    """The compact :class:`~minder.core.hang.RankSummary` of one rank's dump (never its stack
    frames): :func:`_summary_values` as the dataclass."""
    return _unpack(_summary_values(dump, rank, node=node, source=source, dumped_ts=dumped_ts))


def _summary_values(
    dump: Mapping[str, Any],
    rank: int,
    *,
    node: str = "",
    source: str = "",
    dumped_ts: float = 0.0,
) -> list[Any]:
    """The values of the compact :class:`~minder.core.hang.RankSummary` of one rank's dump
    (never its stack frames).

    Per process group: its ranks (from ``pg_config``, as runs), ``pg_status``'s last
    enqueued, started and completed sequence ids (None for -1 or absent), and the frontier
    entries. Groups are ordered by name (numerically where numeric); beyond
    :data:`~minder.core.hang.MAX_GROUPS` they are counted in ``groups_dropped``.

    A dump's entries are grouped at C speed where they allow it (:func:`_locate`), else one
    by one (:func:`_walk`); each group's frontier is then searched from its newest entry and
    stops as soon as it is complete, so a long ring is not walked through in Python.

    The result is the summary's fields' values, nested as lists in their fields' order
    (:data:`_SUMMARY_FIELDS`, :data:`_GROUP_FIELDS`, :data:`_ENTRY_FIELDS`); :func:`_unpack`
    makes it the dataclass.
    """
    if not 0 <= rank <= MAX_RANK:
        raise DumpError(f"rank {rank}: expected 0..{MAX_RANK}")
    entries = dump.get("entries") or []
    groups: dict[str, _Group] = {}
    pg_ids: dict[str, str] = {}  # rank-local pg_id -> group name

    def get(name: str) -> _Group:
        g = groups.get(name)
        if g is None:
            g = groups[name] = _Group(name)
        return g

    def join(pg: Any, pg_id: Any) -> _Group:
        """The group of entries recording ``(pg, pg_id)``, first seen now."""
        name, desc = _pg_name(pg, pg_id)
        g = get(name)
        if desc and not g.desc:
            g.desc = desc
        n = _as_int(pg_id)
        if n is not None:
            pg_ids.setdefault(str(n), name)
        return g

    located = _locate(entries)
    if located is None:
        skipped = _walk(entries, join)
        if skipped:
            logger.warning("%s: skipped %d entries that are not objects", source[:64], skipped)
    else:
        ids, first = located
        for pg_id, pg in first.items():
            join(pg, pg_id).pg_ids.add(pg_id)

    default = pg_ids.get("0", DEFAULT_GROUP)
    config = dump.get("pg_config")
    if isinstance(config, Mapping):
        for key, item in config.items():
            if not isinstance(item, Mapping):
                continue
            ranks = _rank_list(item.get("ranks"))
            name = _text(key) if key != "" else default
            if key == "" and not ranks:
                continue  # gloo's default-group item once subgroups exist: no ranks
            g = get(name)
            if ranks:
                g.ranks = ranks
            config_desc = item.get("desc")
            if isinstance(config_desc, str) and config_desc and not g.desc:
                g.desc = config_desc[:MAX_TEXT]
    if default in groups and not groups[default].desc:
        groups[default].desc = "default_pg"

    status = dump.get("pg_status")
    if isinstance(status, Mapping):
        mapped = set(pg_ids.values())
        for raw_key, value in status.items():
            if not isinstance(value, Mapping):
                continue
            key = _text(raw_key)
            target = pg_ids.get(key)
            if target is None:
                # No entry of this pg_id is left in the ring: its key is a name only when the
                # group is known by that name and no other pg_id claims it.
                if key in groups and key not in mapped:
                    target = key
                elif key == "0" and default not in mapped:
                    target = default
                else:
                    logger.debug("%s: pg_status %s maps to no group", source[:64], key[:20])
                    continue
            get(target).status = value

    ordered = sorted(groups.values(), key=lambda g: group_order(g.name))
    kept = ordered[:MAX_GROUPS]
    states: list[list[Any]] = []
    for g in kept:
        s = g.status or {}
        last_completed = _seq(s.get("last_completed_collective"))
        runs: tuple[tuple[int, int, int], ...] = ()
        if g.ranks and len(g.ranks) > MAX_GROUP_RANKS:
            logger.warning(
                "%s: group %s lists %d ranks: expected at most %d; its rank list is left out",
                source[:64],
                g.name[:64],
                len(g.ranks),
                MAX_GROUP_RANKS,
            )
        elif g.ranks:
            runs = _runs_of(g.ranks)
            if len(runs) > MAX_RANK_RUNS:
                logger.warning(
                    "%s: group %s lists ranks in %d runs: expected at most %d; its rank list "
                    "is left out",
                    source[:64],
                    g.name[:64],
                    len(runs),
                    MAX_RANK_RUNS,
                )
                runs = ()
        # GroupState's fields, in order (see _unpack)
        states.append(
            [
                g.name,
                g.desc,
                runs,
                _seq(s.get("last_enqueued_collective")),
                _seq(s.get("last_started_collective")),
                last_completed,
                _frontier(
                    reversed(g.entries)
                    if located is None or not g.pg_ids
                    else _newest_first(entries, ids, g.pg_ids, last_completed is None),
                    last_completed,
                ),
            ]
        )
    # RankSummary's fields, in order
    return [
        rank,
        _text(dump.get("version", ""))[:16],
        states,
        node[:253],
        dumped_ts,
        source[:MAX_TEXT],
        len(entries),
        len(ordered) - len(kept),
    ]


_GROUP_FIELDS = (
    "group",
    "desc",
    "ranks",
    "last_enqueued",
    "last_started",
    "last_completed",
    "entries",
)
"""The order of :func:`_summary_values`'s group values (GroupState's fields)."""
_SUMMARY_FIELDS = (
    "rank",
    "version",
    "groups",
    "node",
    "dumped_ts",
    "source",
    "entries_total",
    "groups_dropped",
)
"""The order of :func:`_summary_values`'s values (RankSummary's fields)."""
_ENTRY_FIELDS = (
    "record_id",
    "seq",
    "op",
    "state",
    "p2p",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
    "created_ns",
    "timeout_ms",
)
"""The order of :func:`_entry`'s values (FrEntry's fields)."""
_GROUPS_AT = _SUMMARY_FIELDS.index("groups")
_ENTRIES_AT = _GROUP_FIELDS.index("entries")


def _unpack(values: list[Any]) -> RankSummary:
    """The :class:`~minder.core.hang.RankSummary` of :func:`_summary_values`'s values (plain
    lists and tuples, which a pool worker's result is: they pickle and load several times
    faster than frozen dataclasses, whose state goes through Python code field by field)."""
    groups = []
    for group in values[_GROUPS_AT]:
        group[_ENTRIES_AT] = tuple([FrEntry(*e) for e in group[_ENTRIES_AT]])
        groups.append(GroupState(*group))
    values[_GROUPS_AT] = tuple(groups)
    return RankSummary(*values)


# -- files and directories ------------------------------------------------------------------


def rank_of(name: str, prefix: str | None = None) -> int | None:
    """The rank in a dump file's name ``<prefix><rank>[.json|.pkl]``; None when the name is
    not one (with ``prefix`` None, any name ending in digits is)."""
    m = _NAME.match(name)
    if m is None or (prefix is not None and m.group(1) != prefix):
        return None
    rank = int(m.group(2))
    return rank if rank <= MAX_RANK else None


def read_summary(
    path: str | os.PathLike[str], *, prefix: str | None = None, node: str = ""
) -> RankSummary:
    """Read and summarise one dump file; its rank is from its name ``<prefix><rank>``
    (``prefix`` is the file-name part: a path prefix's directory is ignored).

    Raises :class:`DumpError` for a name that is not ``<prefix><rank>`` and everything
    :func:`load_dump` refuses.
    """
    return _unpack(_read_values(path, prefix, node))


def _read_values(path: str | os.PathLike[str], prefix: str | None, node: str) -> list[Any]:
    """:func:`read_summary` as :func:`_summary_values`'s values."""
    p = Path(path)
    file_prefix = None if prefix is None else os.path.basename(prefix)
    rank = rank_of(p.name, file_prefix)
    if rank is None:
        expected = f"{file_prefix}<rank>" if file_prefix is not None else "<prefix><rank>"
        raise DumpError(f"{_where(p)}: file name {p.name[:64]!r}: expected {expected}")
    dump = load_dump(p)
    return _summary_values(dump, rank, node=node, source=p.name, dumped_ts=p.stat().st_mtime)


def infer_prefix(names: Iterable[str]) -> str:
    """The one prefix of ``<prefix><rank>`` names (as PyTorch's loader infers it).

    Raises :class:`DumpError` when no name ends in a rank or several prefixes do.
    """
    prefixes: dict[str, int] = {}
    for name in names:
        m = _NAME.match(name)
        if m is not None:
            prefixes[m.group(1)] = prefixes.get(m.group(1), 0) + 1
    if not prefixes:
        raise DumpError("no file is named <prefix><rank>: expected flight-recorder dumps")
    if len(prefixes) > 1:
        seen = ", ".join(repr(p[:40]) for p in sorted(prefixes, key=lambda p: -prefixes[p])[:4])
        raise DumpError(f"file names have several prefixes ({seen}): pass the prefix to use")
    return next(iter(prefixes))


def _read_one(args: tuple[str, str]) -> list[Any]:
    """Read and summarise one ``(path, prefix)`` as :func:`_summary_values`'s values (what a
    pool worker returns: plain lists and tuples pickle and load quickly)."""
    path, prefix = args
    enabled = gc.isenabled()
    # A dump is plain, acyclic data freed by reference counting: collecting while its tens of
    # thousands of containers are alive (after they load, while they are summarised) only
    # costs, as much again as loading them.
    gc.disable()
    try:
        return _read_values(path, prefix, "")
    finally:
        if enabled:
            gc.enable()


def _world(summary: RankSummary) -> tuple[tuple[int, int, int], ...] | None:
    for g in summary.groups:
        if g.group == DEFAULT_GROUP and g.ranks:
            return g.ranks
    return None


def pool_chunksize(dumps: int, workers: int) -> int:
    """Dumps per task when ``workers`` processes read ``dumps``: chunks of a few dozen, so few
    round trips, and no worker left with a long chunk while the others are done."""
    return max(1, min(32, dumps // (4 * workers)))


def read_dump_dir(
    directory: str | os.PathLike[str],
    prefix: str | None = None,
    *,
    workers: int | None = None,
) -> list[RankSummary]:
    """Read every ``<prefix><rank>`` dump of one job's directory, ordered by rank.

    The prefix is inferred from the file names when not given (:func:`infer_prefix`); files
    without it are skipped (counted in the log). Large directories are read by a process pool
    of ``workers`` (default: the machine's CPUs).

    Raises
    ------
    DumpError
        With one line: the directory is missing or holds no dump; a file is truncated, corrupt
        or not a dump (named); the files are of mixed jobs (two files for one rank, default
        groups whose rank lists disagree).
    """
    root = Path(directory)
    if not root.is_dir():
        raise DumpError(f"{_where(root)}: not a directory: expected a directory of dumps")
    names = sorted(
        p.name
        for p in root.iterdir()
        if not p.name.startswith(".") and not p.name.endswith(".tmp") and p.is_file()
    )
    if not names:
        raise DumpError(f"{_where(root)}: empty directory: expected <prefix><rank> dumps")
    if prefix is None:
        try:
            prefix = infer_prefix(names)
        except DumpError as exc:
            raise DumpError(f"{_where(root)}: {exc}") from None
    else:
        prefix = os.path.basename(prefix)
    by_rank: dict[int, str] = {}
    skipped = 0
    for name in names:
        rank = rank_of(name, prefix)
        if rank is None:
            skipped += 1
            continue
        if rank in by_rank:
            raise DumpError(
                f"{_where(root)}: two files for rank {rank} ({by_rank[rank][:64]!r}, "
                f"{name[:64]!r}): expected one job's dumps, one per rank"
            )
        by_rank[rank] = name
    if skipped:
        logger.info("%s: skipped %d files not named %s<rank>", _where(root), skipped, prefix[:64])
    if not by_rank:
        raise DumpError(f"{_where(root)}: no file is named {prefix[:64]}<rank>: expected dumps")
    jobs = [(str(root / by_rank[r]), prefix) for r in sorted(by_rank)]
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n > 1 and len(jobs) >= PARALLEL_FROM:
        from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415 - only when used

        with ProcessPoolExecutor(max_workers=n) as pool:
            chunk = pool_chunksize(len(jobs), n)
            summaries = [_unpack(v) for v in pool.map(_read_one, jobs, chunksize=chunk)]
    else:
        summaries = [_unpack(_read_one(job)) for job in jobs]
    _check_one_job(root, summaries)
    return summaries


def _check_one_job(root: Path, summaries: Sequence[RankSummary]) -> None:
    worlds: dict[tuple[tuple[int, int, int], ...], int] = {}
    for s in summaries:
        world = _world(s)
        if world is not None:
            worlds.setdefault(world, s.rank)
    if len(worlds) > 1:
        (a, ra), (b, rb) = list(worlds.items())[:2]
        na, nb = sum(len(range(*r)) for r in a), sum(len(range(*r)) for r in b)
        raise DumpError(
            f"{_where(root)}: rank {ra} has a world of {na} ranks and rank {rb} one of {nb} "
            "(default groups disagree): expected one job's dumps"
        )
    if worlds:
        world_ranks = {r for run in next(iter(worlds)) for r in range(*run)}
        outside = [s.rank for s in summaries if s.rank not in world_ranks]
        if outside:
            raise DumpError(
                f"{_where(root)}: rank {outside[0]} is outside the world of "
                f"{len(world_ranks)} ranks: expected one job's dumps"
            )
