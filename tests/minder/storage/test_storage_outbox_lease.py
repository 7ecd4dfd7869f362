"""Outbox leases on SQLite and PostgreSQL: a renewed lease keeps a row from other workers, a
lease that is not renewed frees it, and a renewal never takes back a row another worker holds."""

from __future__ import annotations

import time

from minder.core.alert import Alert, AlertKind
from minder.storage import SessionFactory
from minder.storage.outbox import (
    Destination,
    claim_due,
    mark_delivered,
    record_alert_with_events,
    renew_leases,
)

DEST = Destination("webhook:ops", frozenset({"alert.opened"}))


def _enqueue(sessions: SessionFactory, machine: str) -> None:
    alert = Alert(job="j", machine=machine, kind=AlertKind.RULE, metric="gpu_xid_count",
                  score=1.0, first_ts=1000.0, detected_ts=1001.0)  # fmt: skip
    with sessions.begin() as session:
        record_alert_with_events(session, alert, [DEST])


def test_a_renewed_lease_keeps_the_row_and_a_lapsed_one_frees_it(sessions: SessionFactory) -> None:
    _enqueue(sessions, "n1")
    now = time.time()
    with sessions.begin() as session:
        [row] = claim_due(session, DEST.name, now=now, owner="a", lease_s=15)
    with sessions.begin() as session:
        assert renew_leases(session, [row.id], owner="a", until=now + 10 + 15) == 1
    # past the first lease, inside the renewed one: nobody else may take it
    with sessions.begin() as session:
        assert claim_due(session, DEST.name, now=now + 20, owner="b", lease_s=15) == []
    # the renewals stopped (a crash): once the renewed lease ran out, another worker claims it
    with sessions.begin() as session:
        [again] = claim_due(session, DEST.name, now=now + 26, owner="b", lease_s=15)
    assert again.id == row.id and again.delivery_id == row.delivery_id


def test_a_renewal_skips_rows_marked_or_taken_over(sessions: SessionFactory) -> None:
    for machine in ("n1", "n2", "n3"):
        _enqueue(sessions, machine)
    now = time.time()
    with sessions.begin() as session:
        first, second, third = claim_due(session, DEST.name, now=now, owner="a", lease_s=15)
    with sessions.begin() as session:
        assert mark_delivered(session, first.id, owner="a")
    # "a" stopped renewing; "b" claims the lapsed rows
    with sessions.begin() as session:
        taken = claim_due(session, DEST.name, now=now + 16, owner="b", lease_s=15)
    assert [r.id for r in taken] == [second.id, third.id]
    with sessions.begin() as session:
        assert renew_leases(session, [first.id, second.id, third.id], owner="a",
                            until=now + 60) == 0  # fmt: skip
        assert renew_leases(session, [second.id, third.id], owner="b", until=now + 60) == 2
        assert renew_leases(session, [], owner="b", until=now + 60) == 0
    # "a"'s renewal did not extend "b"'s lease, "b"'s own did: still held at +40
    with sessions.begin() as session:
        assert claim_due(session, DEST.name, now=now + 40, owner="c", lease_s=15) == []
        assert mark_delivered(session, second.id, owner="b")
