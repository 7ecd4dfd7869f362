"""Batch signatures: what a valid one proves, and every way a forged one is told apart."""

from __future__ import annotations

import logging
import os
import stat
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minder.core.errors import ValidationError
from minder.core.signing import (
    SIGNATURE_HEADER,
    AuthError,
    AuthReason,
    ClusterKey,
    FleetSigner,
    KeyFileError,
    ReplayGuard,
    Signer,
    Verified,
    Verifier,
    format_cluster_keys,
    format_node_key,
    init_cluster_keys,
    load_cluster_keys,
    load_node_key,
    node_signer,
    retire_cluster_key,
    rotate_cluster_keys,
    write_node_keys,
)

NOW = 1_800_000_000.0
KEY = ClusterKey("k1", bytes(range(32)))


def clock_ns() -> int:
    return int(NOW * 1e9)


def verifier(*keys: ClusterKey, **options: float) -> Verifier:
    return Verifier(keys or (KEY,), clock=lambda: NOW, **options)


def signed(node: str, payload: bytes, key: ClusterKey = KEY) -> bytes:
    name, value = Signer(key.node_key(node), clock_ns).header(payload)
    assert name == SIGNATURE_HEADER
    return value


def reason_of(header: bytes | None, payload: bytes, check: Verifier | None = None) -> AuthReason:
    with pytest.raises(AuthError) as raised:
        (check or verifier()).verify(header, payload)
    return raised.value.reason


def test_a_signed_batch_names_its_signer() -> None:
    header = signed("gpu-7", b"payload")
    found = verifier().verify(header, b"payload")
    assert found == Verified("gpu-7", "k1", int(NOW * 1e9))


@settings(max_examples=200, deadline=None)
@given(
    node=st.text(
        alphabet=st.characters(
            blacklist_characters=";", blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")
        ),
        min_size=1,
        max_size=40,
    ),
    payload=st.binary(max_size=512),
    flip=st.integers(min_value=0),
)
def test_any_changed_byte_breaks_the_signature(node: str, payload: bytes, flip: int) -> None:
    header = signed(node, payload)
    assert verifier().verify(header, payload).node == node
    if payload:
        i = flip % len(payload)
        changed = payload[:i] + bytes([payload[i] ^ 1]) + payload[i + 1 :]
        assert reason_of(header, changed) is AuthReason.BAD_SIGNATURE
    else:
        assert reason_of(header, b"x") is AuthReason.BAD_SIGNATURE


def test_another_nodes_key_cannot_sign_for_a_node() -> None:
    # node A's key, the header claiming node B: the MAC is checked with B's key
    stolen = Signer(KEY.node_key("gpu-a"), clock_ns)
    _, value = stolen.header(b"xid")
    forged = value.replace(b";gpu-a;", b";gpu-b;")
    assert reason_of(forged, b"xid") is AuthReason.BAD_SIGNATURE
    # and a header naming A stays A's: the consumer compares it with the batch's node
    assert verifier().verify(value, b"xid").node == "gpu-a"


def test_an_unknown_or_retired_key_id_is_refused() -> None:
    other = ClusterKey("k2", bytes(32))
    assert reason_of(signed("n", b"p", other), b"p") is AuthReason.UNKNOWN_KEY
    # a key of the same id but another secret (a forger guessing the id)
    impostor = ClusterKey("k1", bytes(32))
    assert reason_of(signed("n", b"p", impostor), b"p") is AuthReason.BAD_SIGNATURE


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"v1",
        b"v2;k1;n;1;abc",
        b"v1;k1;n;12x;abc",
        b"v1;k1;;1;abc",
        b"\xff\xfe",
        b"v1;k1;n;1;" + b"a" * 600,
    ],
)
def test_a_malformed_header_is_refused_with_a_short_reason(header: bytes) -> None:
    with pytest.raises(AuthError) as raised:
        verifier().verify(header, b"p")
    assert raised.value.reason is AuthReason.MALFORMED
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 300


def test_no_header_is_unsigned() -> None:
    assert reason_of(None, b"p") is AuthReason.UNSIGNED


def test_a_node_name_with_semicolons_cannot_be_confused() -> None:
    with pytest.raises(ValidationError):
        ClusterKey.generate().node_key("a;b")


@pytest.mark.parametrize("offset_s", [-3601.0, 301.0])
def test_signed_outside_the_window_is_refused(offset_s: float) -> None:
    late = Signer(KEY.node_key("n"), lambda: int((NOW + offset_s) * 1e9))
    _, header = late.header(b"p")
    assert reason_of(header, b"p") is AuthReason.OUTSIDE_WINDOW
    wide = verifier(max_age_s=7200.0, max_skew_s=600.0)
    assert wide.verify(header, b"p").node == "n"


def test_a_signer_never_repeats_a_sequence_number() -> None:
    frozen = Signer(KEY.node_key("n"), clock_ns)  # a clock that does not move
    seqs = [frozen.next_seq() for _ in range(1000)]
    assert seqs == sorted(set(seqs))


def test_the_replay_guard_refuses_old_numbers_but_not_a_redelivery() -> None:
    guard = ReplayGuard()
    first, second = Verified("n", "k1", 10), Verified("n", "k1", 11)
    guard.check(first, "job")
    with pytest.raises(AuthError) as raised:
        guard.check(first, "job")  # twice in one poll
    assert raised.value.reason is AuthReason.REPLAYED
    guard.rollback()  # the poll is redelivered: the same message is no replay
    guard.check(first, "job")
    guard.check(second, "job")
    guard.commit()
    for old in (first, second):
        with pytest.raises(AuthError):
            guard.check(old, "job")
    guard.check(Verified("other", "k1", 1), "job")  # each node has its own numbers
    # and each job: a node's batches of its previous job may arrive after its new job's
    guard.check(first, "previous-job")


def test_the_replay_guard_is_bounded() -> None:
    guard = ReplayGuard(max_nodes=10)
    for i in range(100):
        guard.check(Verified(f"n{i}", "k", 1), "job")
    guard.commit()
    assert len(guard) == 10


def test_fleet_signer_signs_as_each_node_would() -> None:
    fleet = FleetSigner(KEY, clock_ns)
    _, header = fleet.header("gpu-3", b"p")
    assert verifier().verify(header, b"p").node == "gpu-3"
    own = Signer(KEY.node_key("gpu-3"), clock_ns)
    assert own.key.secret == fleet.signer("gpu-3").key.secret


def test_key_files_round_trip_and_are_private(tmp_path: Path) -> None:
    path = tmp_path / "cluster.keys"
    first = init_cluster_keys(path, "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ValidationError, match="exists"):
        init_cluster_keys(path)
    second = rotate_cluster_keys(path, "b")
    assert [k.kid for k in load_cluster_keys(path)] == ["a", "b"]
    [written] = write_node_keys(second, ["gpu-1"], tmp_path / "nodes")
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    node_key = load_node_key(written)
    assert node_key == second.node_key("gpu-1")
    # during the rotation both keys verify; after the retire only the new one
    both = Verifier(load_cluster_keys(path), clock=lambda: NOW)
    old_header = Signer(first.node_key("gpu-1"), clock_ns).header(b"p")[1]
    new_header = Signer(node_key, clock_ns).header(b"p")[1]
    assert both.verify(old_header, b"p").kid == "a"
    assert both.verify(new_header, b"p").kid == "b"
    retire_cluster_key(path, "a")
    after = Verifier(load_cluster_keys(path), clock=lambda: NOW)
    assert reason_of(old_header, b"p", after) is AuthReason.UNKNOWN_KEY
    assert after.verify(new_header, b"p").kid == "b"
    with pytest.raises(ValidationError, match="only key"):
        retire_cluster_key(path, "b")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "holds no key"),
        ("k1\n", "1 fields"),
        ("k1 c2VjcmV0\n", "not 32 bytes"),
        ("bad/id AAAA\n", "invalid"),
    ],
)
def test_a_bad_cluster_key_file_is_one_line_without_the_secret(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(KeyFileError, match=match) as raised:
        load_cluster_keys(path)
    assert "\n" not in str(raised.value) and "c2VjcmV0" not in str(raised.value)


def test_a_repeated_key_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(format_cluster_keys([KEY, KEY]))
    with pytest.raises(KeyFileError, match="twice"):
        load_cluster_keys(path)


def test_the_agent_refuses_another_nodes_key(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_text(format_node_key(KEY.node_key("gpu-1")))
    os.chmod(path, 0o600)
    signer = node_signer(path, "gpu-1")
    assert signer is not None and signer.node == "gpu-1"
    with pytest.raises(ValidationError, match=r"gpu-1.*gpu-2"):
        node_signer(path, "gpu-2")


def test_the_agent_finds_its_systemd_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert node_signer(None, "gpu-1") is None
    (tmp_path / "minder-node-key").write_text(format_node_key(KEY.node_key("gpu-1")))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    signer = node_signer(None, "gpu-1")
    assert signer is not None and signer.key.kid == "k1"


def test_keys_never_show_their_secret() -> None:
    assert KEY.secret.hex() not in repr(KEY)
    assert KEY.node_key("n").secret.hex() not in repr(KEY.node_key("n"))


def test_the_replay_guard_keeps_no_job_id_a_signer_chose() -> None:
    """A node key holder picks job ids of any length: the guard keeps a digest."""
    tracemalloc.start()
    guard = ReplayGuard()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(20):
        guard.check(Verified("n", "k", 1), f"{i}" + "x" * 1_000_000)
    guard.commit()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 100_000, grown
    with pytest.raises(AuthError):
        guard.check(Verified("n", "k", 1), "0" + "x" * 1_000_000)


def test_forged_node_names_do_not_fill_the_key_cache() -> None:
    check = verifier()
    for i in range(50):
        forged = signed(f"ghost-{i}", b"p", ClusterKey("k1", bytes(32)))
        with pytest.raises(AuthError):
            check.verify(forged, b"p")
    assert check.cached_node_keys == 0
    check.verify(signed("real", b"p"), b"p")
    assert check.cached_node_keys == 1


def test_a_clock_stepped_back_restarts_the_sequence(caplog: pytest.LogCaptureFixture) -> None:
    now = [int(NOW * 1e9) + 3600 * 10**9]  # booted an hour ahead
    signer = Signer(KEY.node_key("n"), lambda: now[0])
    ahead = signer.next_seq()
    now[0] = int(NOW * 1e9)  # NTP corrects it
    with caplog.at_level(logging.WARNING):
        corrected = signer.next_seq()
    assert corrected == int(NOW * 1e9) < ahead
    assert "stepped back 3600 s" in caplog.text
    now[0] -= 10**9  # a small step back keeps the sequence increasing
    assert signer.next_seq() == corrected + 1


@pytest.mark.parametrize("node", ["gpu 01", "gpu\t1", "gpu\x0c1", "a;b", ""])
def test_node_names_that_a_key_file_could_not_hold_are_refused(node: str) -> None:
    with pytest.raises(ValidationError):
        KEY.node_key(node)


def test_group_readable_key_files_are_fine_world_readable_ones_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "node.key"
    path.write_text(format_node_key(KEY.node_key("n")))
    path.chmod(0o440)  # a Kubernetes Secret mounted for fsGroup
    with caplog.at_level(logging.WARNING):
        load_node_key(path)
    assert caplog.text == ""
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        load_node_key(path)
    assert "can be read or written by others" in caplog.text
