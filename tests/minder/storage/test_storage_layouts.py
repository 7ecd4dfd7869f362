"""Wire layouts in the shared database (SQLite and PostgreSQL): insert-if-absent, race-safe, and
what a restarted worker's decoder reads back."""

from __future__ import annotations

import threading

import msgpack
import pytest
from sqlalchemy import Engine, func, select

from minder.core.codec import BatchEncoder, Decoder, LayoutCache, layout_definition, layout_id
from minder.core.errors import DecodeError, ValidationError
from minder.core.records import NodeBatch
from minder.storage import SessionFactory, SqlLayoutStore, load_layout, save_layout
from minder.storage.layouts import layout_key
from minder.storage.models import WireLayoutRow

METRICS = ["gpu_util_ratio", "gpu_power_watts", "cpu_util_ratio", "train_step_seconds"]
DEVICES = ["gpu0", "gpu0", "", "rank0"]


def test_a_layout_round_trips_and_the_first_definition_stays(sessions: SessionFactory) -> None:
    lid = layout_id(METRICS, DEVICES)
    definition = layout_definition(METRICS, DEVICES)
    with sessions.begin() as session:
        assert save_layout(session, lid, definition, now=123.5)
        assert not save_layout(session, lid, layout_definition(["cpu_util_ratio"], [""]))
        assert save_layout(session, 0, layout_definition(["cpu_util_ratio"], [""]))
    with sessions() as session:
        assert load_layout(session, lid) == definition
        assert load_layout(session, 0) == layout_definition(["cpu_util_ratio"], [""])
        assert load_layout(session, 2**64 - 1) is None  # the largest id: unsigned, no overflow
        row = session.get(WireLayoutRow, f"{lid:016x}")
        assert row is not None and row.first_seen_at == 123.5


def test_bad_ids_and_definitions_are_refused() -> None:
    assert layout_key(2**64 - 1) == "ffffffffffffffff" and layout_key(7) == "0000000000000007"
    for bad in (-1, 2**64, True, "7"):
        with pytest.raises(ValidationError, match=r"layout id .*: expected a layout id"):
            layout_key(bad)  # type: ignore[arg-type]


def test_bad_definition_is_refused(sessions: SessionFactory) -> None:
    with (
        sessions.begin() as session,
        pytest.raises(ValidationError, match="definition is list: expected a map"),
    ):
        save_layout(session, 7, [1, 2])  # type: ignore[arg-type]


def test_replicas_racing_on_one_layout_all_succeed_and_one_row_stays(
    sessions: SessionFactory, engine: Engine
) -> None:
    lid = layout_id(METRICS, DEVICES)
    stores = [SqlLayoutStore(sessions) for _ in range(4)]
    start = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def save(store: SqlLayoutStore, rank: int) -> None:
        start.wait()
        try:
            store.save(lid, layout_definition(METRICS, [*DEVICES[:3], f"rank{rank}"]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(s, i)) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(WireLayoutRow)).scalar() == 1
    assert stores[0].load(lid) in [
        layout_definition(METRICS, [*DEVICES[:3], f"rank{i}"]) for i in range(4)
    ]


def _node(node: str, ts: float) -> NodeBatch:
    samples = [(m, d, 1.0) for m, d in zip(METRICS, DEVICES, strict=True)]
    return NodeBatch(job="j", node=node, ts=ts, samples=samples)


def test_a_restarted_worker_decodes_with_the_layouts_the_database_holds(
    sessions: SessionFactory,
) -> None:
    encoder = BatchEncoder()
    payloads = [encoder.encode(_node("n1", 1763700000.0 + s)) for s in range(4)]
    before = Decoder(LayoutCache(store=SqlLayoutStore(sessions)))
    before.decode(payloads[0])  # the announcement, then the worker is killed
    after = Decoder(LayoutCache(store=SqlLayoutStore(sessions)))
    decoded = [after.decode(p) for p in payloads[1:]]
    assert [b.sample_count for b in decoded] == [4, 4, 4]
    assert after.layouts.store_loaded == 1 and after.layouts.store_failures == 0
    # A row that does not match its id (written by hand, by a bug) is refused, never used.
    with sessions.begin() as session:
        save_layout(session, 5, layout_definition(METRICS, DEVICES))
    stray = dict(msgpack.unpackb(payloads[1], raw=False), layout=5)
    with pytest.raises(DecodeError, match=r"^unknown layout 0x0000000000000005 .* invalid"):
        after.decode(msgpack.packb(stray))
