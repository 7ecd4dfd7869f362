"""The decoder's layout cache backed by a shared store (docs/architecture.md §3.2): a worker that
restarts or takes a partition over decodes batches whose layout another worker learnt."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest

from minder.core import codec
from minder.core.codec import (
    BatchEncoder,
    Decoder,
    LayoutCache,
    LayoutStore,
    layout_definition,
)
from minder.core.errors import DecodeError, ValidationError
from minder.core.records import NodeBatch

T0 = 1763700000.0


class MemoryStore:
    """A layout store in a dict, counting its calls; ``fail`` makes every call raise."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.loads: list[int] = []
        self.saves: list[int] = []
        self.fail = False

    def load(self, layout_id: int) -> dict[str, Any] | None:
        self.loads.append(layout_id)
        if self.fail:
            raise ConnectionError("database unreachable")
        return self.rows.get(layout_id)

    def save(self, layout_id: int, definition: dict[str, Any]) -> None:
        self.saves.append(layout_id)
        if self.fail:
            raise ConnectionError("database unreachable")
        self.rows.setdefault(layout_id, definition)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(codec.time, "monotonic", fake)
    return fake


def _node(node: str, ts: float, rank: int = 0) -> NodeBatch:
    samples = [
        ("gpu_util_ratio", "gpu0", 0.5),
        ("gpu_power_watts", "gpu0", 300.0),
        ("cpu_util_ratio", "", 0.25),
        ("train_step_seconds", f"rank{rank}", 1.5),
    ]
    return NodeBatch(job="j2", node=node, ts=ts, samples=samples)


def _stream(node: str, seconds: int, rank: int = 0) -> list[bytes]:
    """A node's packed batches: the first inlines the layout, the next 9 do not."""
    encoder = BatchEncoder()
    return [encoder.encode(_node(node, T0 + s, rank)) for s in range(seconds)]


def _decoder(store: LayoutStore, **options: Any) -> Decoder:
    return Decoder(LayoutCache(store=store, **options))


def test_a_worker_that_never_saw_the_announcement_decodes_what_another_saved() -> None:
    store = MemoryStore()
    first = _decoder(store)
    payloads = _stream("n1", 5)
    for payload in payloads[:2]:
        first.decode(payload)
    assert len(store.rows) == 1 and first.layouts.store_saved == 1
    lid = next(iter(store.rows))
    assert store.rows[lid] == layout_definition(
        *zip(*[(m, d) for m, d, _ in _node("n1", T0).samples], strict=True)
    )

    restarted = _decoder(store)  # takes over mid-stream: the announcement is behind it
    decoded = [restarted.decode(payload) for payload in payloads[2:]]
    assert [b.ts for b in decoded] == [T0 + 2, T0 + 3, T0 + 4]
    assert decoded[0].all_samples()[3] == ("train_step_seconds", "rank0", 1.5)
    assert restarted.layouts.store_loaded == 1 and store.loads == [lid]  # then from the cache
    assert store.saves == [lid]  # a layout loaded from the store is not saved back
    # Without the store the same worker refuses them, as before.
    with pytest.raises(DecodeError, match=r"^unknown layout"):
        Decoder().decode(payloads[2])


def test_a_layout_is_saved_once_per_process_and_as_its_validated_pairs() -> None:
    store = MemoryStore()
    decoder = _decoder(store)
    for payload in _stream("n1", 25) + _stream("n2", 25):  # same layout, 6 announcements
        decoder.decode(payload)
    assert len(store.saves) == 1
    # Whatever else an agent's definition carries stays out of the store.
    fields = msgpack.unpackb(_stream("n3", 1, rank=3)[0], raw=False)
    fields["layout_def"]["comment"] = "x" * 1000
    other = _decoder(MemoryStore())
    other.decode(msgpack.packb(fields))
    assert other.layouts.store is not None
    saved = other.layouts.store.rows[fields["layout"]]  # type: ignore[attr-defined]
    assert "comment" not in saved and saved["devices"][-1] == "rank3"


def test_a_new_store_gets_the_known_layouts_at_their_next_announcement() -> None:
    old, new = MemoryStore(), MemoryStore()
    decoder = _decoder(old)
    payloads = _stream("n1", 11)
    for payload in payloads[:10]:
        decoder.decode(payload)
    decoder.layouts.store = new  # the service's database changed (another stack)
    decoder.decode(payloads[10])  # re-announced: known here, unknown to the new store
    assert len(old.rows) == len(new.rows) == 1 and decoder.layouts.store_saved == 2


def test_an_unknown_id_is_asked_once_per_period_and_still_refused(clock: Clock) -> None:
    store = MemoryStore()
    decoder = _decoder(store, miss_ttl_s=5.0)
    payloads = _stream("n1", 10)[1:]  # never announced anywhere
    for payload in payloads:
        with pytest.raises(DecodeError, match=r"^unknown layout 0x[0-9a-f]{16} from job 'j2'"):
            decoder.decode(payload)
    assert len(store.loads) == 1 and decoder.layouts.store_misses == 1
    clock.now += 5.0
    with pytest.raises(DecodeError, match=r"^unknown layout"):
        decoder.decode(payloads[0])
    assert len(store.loads) == 2
    # Once the layout is stored (another worker learnt it), the next lookup finds it.
    announcing = _decoder(store)
    announcing.decode(_stream("n1", 1)[0])
    clock.now += 5.0
    assert decoder.decode(payloads[0]).node == "n1" and len(store.loads) == 3


def test_the_remembered_misses_are_bounded(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    monkeypatch.setattr(codec, "MAX_STORE_MISSES", 2)
    store = MemoryStore()
    decoder = _decoder(store, miss_ttl_s=60.0)
    unknown = [_stream(f"n{r}", 2, rank=r)[1] for r in range(3)]  # three distinct layouts
    for payload in unknown + unknown[1:]:
        with pytest.raises(DecodeError, match=r"^unknown layout"):
            decoder.decode(payload)
    assert len(store.loads) == 3  # the last two are remembered
    with pytest.raises(DecodeError, match=r"^unknown layout"):
        decoder.decode(unknown[0])  # the oldest was forgotten: asked again
    assert len(store.loads) == 4


def test_a_failing_store_never_breaks_decoding(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    store.fail = True
    decoder = _decoder(store, retry_s=5.0)
    payloads = _stream("n1", 12)
    with caplog.at_level(logging.WARNING, logger="minder.core.codec"):
        assert [decoder.decode(p).ts for p in payloads[:10]] == [T0 + s for s in range(10)]
        with pytest.raises(DecodeError, match=r"^unknown layout"):
            decoder.decode(_stream("n9", 2, rank=9)[1])  # the store is left alone meanwhile
    assert store.saves != [] and store.loads == [] and decoder.layouts.store_failures == 1
    assert decoder.layouts.store_saved == 0
    warnings = [r for r in caplog.records if "layout store save" in r.getMessage()]
    assert len(warnings) == 1 and "database unreachable" in warnings[0].getMessage()
    # Back up: the layout is saved at its node's next announcement.
    store.fail = False
    clock.now += 5.0
    decoder.decode(payloads[10])  # the 11th batch re-announces
    assert store.rows and decoder.layouts.store_saved == 1 and len(store.saves) == 2
    # A lookup that raises is a miss: the batch is refused as without a store.
    store.fail = True
    clock.now += 5.0
    with (
        caplog.at_level(logging.WARNING, logger="minder.core.codec"),
        pytest.raises(DecodeError, match=r"^unknown layout"),
    ):
        decoder.decode(_stream("n9", 2, rank=9)[1])
    assert decoder.layouts.store_failures == 2 and len(store.loads) == 1
    # logged at most once a minute
    assert len([r for r in caplog.records if "layout store" in r.getMessage()]) == 1


def test_a_stored_definition_that_does_not_hash_to_its_id_is_refused(clock: Clock) -> None:
    store = MemoryStore()
    payloads = _stream("n1", 3)
    lid = msgpack.unpackb(payloads[1], raw=False)["layout"]
    # Tampered: another layout's pairs stored under this id.
    store.rows[lid] = layout_definition(
        ["gpu_util_ratio", "gpu_power_watts", "cpu_util_ratio", "train_step_seconds"],
        ["gpu0", "gpu0", "", "rank7"],
    )
    decoder = _decoder(store)
    with pytest.raises(
        DecodeError,
        match=r"^unknown layout 0x[0-9a-f]{16} .* the layout store's definition is invalid: "
        r"layout_def hashes to 0x[0-9a-f]{16} but the batch names layout",
    ):
        decoder.decode(payloads[1])
    assert decoder.layouts.store_refused == 1 and len(decoder.layouts) == 0
    with pytest.raises(DecodeError, match=r"^unknown layout"):  # not asked again at once
        decoder.decode(payloads[2])
    assert len(store.loads) == 1
    # Something that is not a definition at all is refused the same way.
    store.rows[lid] = ["not", "a", "map"]  # type: ignore[assignment]
    clock.now += 10.0
    with pytest.raises(DecodeError, match="definition is invalid: layout_def is list"):
        decoder.decode(payloads[2])
    # The node's own announcement is still learnt (and not saved over the stored row).
    assert decoder.decode(payloads[0]).node == "n1"


def test_store_options_are_checked() -> None:
    with pytest.raises(ValidationError, match=r"miss_ttl_s is -1\.0: expected a finite number"):
        LayoutCache(miss_ttl_s=-1.0)
    with pytest.raises(ValidationError, match="retry_s is inf"):
        LayoutCache(retry_s=float("inf"))
