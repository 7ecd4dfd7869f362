"""The node agent's on-disk spool: order, restart, bound (oldest dropped first), torn tails."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from minder.core.errors import ValidationError
from minder.stream.spool import HEADER_BYTES, Spool


def _payload(i: int, size: int = 20) -> bytes:
    return f"batch-{i:06d}".encode().ljust(size, b".")


def _drain(spool: Spool) -> list[bytes]:
    out = []
    while (record := spool.peek()) is not None:
        out.append(record.payload)
        assert spool.ack(record.seq) == 1
    return out


def test_fifo_order_len_and_bytes(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        assert spool.peek() is None and len(spool) == 0 and spool.bytes == 0
        seqs = [spool.append(_payload(i)) for i in range(10)]
        assert seqs == sorted(seqs) and len(set(seqs)) == 10
        assert len(spool) == 10
        assert spool.bytes == 10 * (HEADER_BYTES + 20)
        run = spool.peek_many(4)
        assert [r.payload for r in run] == [_payload(i) for i in range(4)]
        # Acknowledging a run removes it and nothing newer.
        assert spool.ack(run[-1].seq) == 4
        assert spool.oldest_seq == seqs[4]
        assert _drain(spool) == [_payload(i) for i in range(4, 10)]
        assert spool.bytes == 0


def test_peek_many_respects_byte_limit_but_returns_at_least_one(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        for i in range(5):
            spool.append(_payload(i, size=100))
        assert len(spool.peek_many(10, max_bytes=250)) == 2
        assert len(spool.peek_many(10, max_bytes=10)) == 1


def test_restart_continues_in_order_and_forgets_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)  # many small segments
    for i in range(20):
        spool.append(_payload(i))
    first = spool.peek_many(7)
    spool.ack(first[-1].seq)
    spool.close()

    reopened = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)
    assert len(reopened) == 13
    for i in range(20, 25):
        reopened.append(_payload(i))
    reopened.close()

    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=100)
    assert _drain(again) == [_payload(i) for i in range(7, 25)]
    again.close()
    # Everything acknowledged: the segment files are gone, only head and lock stay.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head", "lock"]
    assert len(Spool(tmp_path, max_bytes=1 << 20)) == 0


def test_full_spool_drops_oldest_first_and_counts(tmp_path: Path) -> None:
    record = HEADER_BYTES + 20
    with Spool(tmp_path, max_bytes=5 * record) as spool:
        for i in range(12):
            spool.append(_payload(i))
        assert len(spool) == 5
        assert spool.bytes <= spool.max_bytes
        assert spool.dropped_total == 7
        assert spool.appended_total == 12
        assert _drain(spool) == [_payload(i) for i in range(7, 12)]


def test_ack_after_the_record_was_dropped_removes_nothing_newer(tmp_path: Path) -> None:
    record = HEADER_BYTES + 20
    with Spool(tmp_path, max_bytes=3 * record) as spool:
        for i in range(3):
            spool.append(_payload(i))
        in_flight = spool.peek()
        assert in_flight is not None
        spool.append(_payload(3))  # overflow drops record 0 while it is "being sent"
        assert spool.ack(in_flight.seq) == 0
        assert _drain(spool) == [_payload(i) for i in (1, 2, 3)]


def test_lower_bound_at_reopen_drops_oldest(tmp_path: Path) -> None:
    record = HEADER_BYTES + 20
    with Spool(tmp_path, max_bytes=100 * record) as spool:
        for i in range(10):
            spool.append(_payload(i))
    with Spool(tmp_path, max_bytes=4 * record) as smaller:
        assert smaller.dropped_total == 6
        assert _drain(smaller) == [_payload(i) for i in range(6, 10)]


def test_record_larger_than_the_spool_is_refused(tmp_path: Path) -> None:
    with (
        Spool(tmp_path, max_bytes=64) as spool,
        pytest.raises(ValidationError, match="cannot fit a spool of max_bytes=64"),
    ):
        spool.append(b"x" * 64)


@pytest.mark.parametrize("cut", [3, HEADER_BYTES + 5])
def test_torn_tail_is_discarded_with_a_log(
    tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture
) -> None:
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        for i in range(4):
            spool.append(_payload(i))
    (segment,) = tmp_path.glob("seg-*.spool")
    # A crash in the middle of the fifth append: part of a header, or a header and half a payload.
    record = (HEADER_BYTES + 20) * 4
    with segment.open("ab") as handle:
        handle.write((b"MSP1" + b"\x14\x00\x00\x00" + b"\x00" * 4 + b"batch-000004")[:cut])
    assert segment.stat().st_size == record + cut
    with caplog.at_level(logging.WARNING, logger="minder.stream.spool"):
        spool = Spool(tmp_path, max_bytes=1 << 20)
    assert "torn" in caplog.text
    assert spool.torn_total == 1
    assert segment.stat().st_size == record  # cut back to the last whole record
    spool.append(_payload(99))
    assert _drain(spool) == [*(_payload(i) for i in range(4)), _payload(99)]
    spool.close()


def test_corrupt_payload_is_detected_by_crc(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        for i in range(3):
            spool.append(_payload(i))
    (segment,) = tmp_path.glob("seg-*.spool")
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF  # flip a byte of the last payload
    segment.write_bytes(bytes(data))
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        assert spool.torn_total == 1
        assert _drain(spool) == [_payload(0), _payload(1)]


def test_second_process_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    with (
        Spool(tmp_path, max_bytes=1024),
        pytest.raises(ValidationError, match="in use by another process"),
    ):
        Spool(tmp_path, max_bytes=1024)
    Spool(tmp_path, max_bytes=1024).close()  # free again once closed


def test_invalid_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="max_bytes is 0"):
        Spool(tmp_path, max_bytes=0)
    with pytest.raises(ValidationError, match="segment_bytes is -1"):
        Spool(tmp_path, max_bytes=10, segment_bytes=-1)


def test_concurrent_append_and_ack_keep_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 22, segment_bytes=4096)
    received: list[bytes] = []
    done = threading.Event()

    def consume() -> None:
        while not (done.is_set() and len(spool) == 0):
            run = spool.peek_many(16)
            if run:
                received.extend(r.payload for r in run)
                spool.ack(run[-1].seq)

    reader = threading.Thread(target=consume)
    reader.start()
    for i in range(2000):
        spool.append(_payload(i))
    done.set()
    reader.join(timeout=30)
    assert received == [_payload(i) for i in range(2000)]
    spool.close()


def test_unreadable_segment_is_a_validation_error_naming_it_and_frees_the_lock(
    tmp_path: Path,
) -> None:
    with Spool(tmp_path, max_bytes=1 << 20) as spool:
        spool.append(_payload(0))
    blocker = tmp_path / "seg-00000000000000000099.spool"
    blocker.mkdir()  # unreadable as a file, even for root: EISDIR
    with pytest.raises(ValidationError, match="cannot open the spool") as caught:
        Spool(tmp_path, max_bytes=1 << 20)
    assert str(blocker) in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)
    blocker.rmdir()
    with Spool(tmp_path, max_bytes=1 << 20) as spool:  # the failed open released the lock
        assert _drain(spool) == [_payload(0)]


def test_unlistable_directory_is_a_validation_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path) -> object:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", refuse)
    with pytest.raises(ValidationError, match="Permission denied") as caught:
        Spool(tmp_path / "spool", max_bytes=1024)
    assert str(tmp_path / "spool") in str(caught.value)
