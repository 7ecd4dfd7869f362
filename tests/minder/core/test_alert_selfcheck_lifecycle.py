"""The alert life cycle with self-checks: only the service sets ``confirmed`` and
``cleared_by_selfcheck``; a confirmed alert ends by a person, a cleared one is final."""

from __future__ import annotations

import pytest

from minder.core.alert import (
    SERVICE_STATUSES,
    Alert,
    AlertKind,
    AlertStatus,
    allowed_statuses,
    check_transition,
)
from minder.core.errors import ValidationError

S = AlertStatus


def _alert(status: AlertStatus = S.OPEN) -> Alert:
    return Alert(job="j", machine="m", kind=AlertKind.RULE, metric="gpu_xid_count", score=1.0,
                 first_ts=1.0, detected_ts=2.0, status=status)  # fmt: skip


@pytest.mark.parametrize("start", [S.OPEN, S.ACKNOWLEDGED])
@pytest.mark.parametrize("verdict", [S.CONFIRMED, S.CLEARED_BY_SELFCHECK])
def test_only_the_service_sets_a_verdict_status(start: AlertStatus, verdict: AlertStatus) -> None:
    with pytest.raises(ValidationError, match="only Minder's self-check sets it"):
        check_transition(start, verdict)
    with pytest.raises(ValidationError, match="only Minder's self-check"):
        _alert(start).with_status(verdict)
    check_transition(start, verdict, by_service=True)
    assert _alert(start).with_status(verdict, by_service=True).status is verdict


def test_a_confirmed_alert_ends_by_a_person_or_by_a_later_passed_check() -> None:
    for person in (S.RESOLVED, S.FALSE_POSITIVE):
        assert _alert(S.CONFIRMED).with_status(person).status is person
    with pytest.raises(ValidationError, match="'confirmed' to 'acknowledged'"):
        check_transition(S.CONFIRMED, S.ACKNOWLEDGED)
    with pytest.raises(ValidationError, match="'confirmed' to 'open'"):
        check_transition(S.CONFIRMED, S.OPEN, by_service=True)
    # a check an operator asked for after a repair may pass: only the service sets that
    check_transition(S.CONFIRMED, S.CLEARED_BY_SELFCHECK, by_service=True)
    with pytest.raises(ValidationError):
        check_transition(S.CONFIRMED, S.CLEARED_BY_SELFCHECK)
    # setting the same status again changes nothing, for anyone
    check_transition(S.CONFIRMED, S.CONFIRMED)


def test_cleared_by_selfcheck_is_final() -> None:
    for status in AlertStatus:
        if status is S.CLEARED_BY_SELFCHECK:
            continue
        with pytest.raises(ValidationError, match="none \\(final status\\)"):
            check_transition(S.CLEARED_BY_SELFCHECK, status, by_service=True)
    for final in (S.RESOLVED, S.FALSE_POSITIVE):
        with pytest.raises(ValidationError, match="final status"):
            check_transition(final, S.CONFIRMED, by_service=True)


def test_allowed_statuses_name_a_persons_choices_apart_from_the_services() -> None:
    assert {S.CONFIRMED, S.CLEARED_BY_SELFCHECK} == SERVICE_STATUSES
    assert allowed_statuses(S.OPEN) == [S.ACKNOWLEDGED, S.RESOLVED, S.FALSE_POSITIVE]
    assert allowed_statuses(S.OPEN, by_service=True) == [
        S.ACKNOWLEDGED, S.RESOLVED, S.FALSE_POSITIVE, S.CONFIRMED, S.CLEARED_BY_SELFCHECK,
    ]  # fmt: skip
    assert allowed_statuses(S.CONFIRMED) == [S.RESOLVED, S.FALSE_POSITIVE]
    assert allowed_statuses(S.CLEARED_BY_SELFCHECK, by_service=True) == []


def test_statuses_round_trip_through_to_dict() -> None:
    for status in (S.CONFIRMED, S.CLEARED_BY_SELFCHECK):
        alert = _alert(status)
        assert Alert.from_dict(alert.to_dict()).status is status
