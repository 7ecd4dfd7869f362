"""Forged batches: whoever can write to the metrics topic but holds no node's key.

An attacker on the network forges XID batches for a healthy node of a running job: unsigned,
signed with another node's key (a node they control), and under the victim's name with that
stolen key. With enforcement on, none of them may alert, act, or spend the circuit breaker's
budget; each is dead-lettered and counted. A forged "ghost" node must not join the job. The
job's real fault afterwards is alerted and acted on: the breaker still has its budget.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fault_harness import FAULTY, HEALTHY, HEALTHY_PARTITION, FaultService, Figures, wait_until

from minder.actions.base import ActionOutcome
from minder.core.codec import encode_batch
from minder.core.records import Event, EventKind, NodeBatch
from minder.core.signing import Signer
from minder.stream import read_dead_letters

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

VICTIM = "healthy-n0005"
ACCOMPLICE = "healthy-n0006"
"""A node of the job whose key the attacker stole (its agent's key file)."""
GHOST = "healthy-n0999"


class RecordingActuator:
    """A scheduler target that records what it is asked to do (test fake of
    :class:`~minder.actions.base.NodeActuator`); its scheduler knows one running job,
    ``healthy``, on the eight nodes of the harness's scenario."""

    name = "recording"

    def __init__(self) -> None:
        self.applied: list[str] = []
        self.lock = threading.Lock()

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        if job_id != HEALTHY:
            return None
        return frozenset(f"{HEALTHY}-n{i:04d}" for i in range(8))

    def apply(self, node: str, *, alert_id: str, reason: str) -> ActionOutcome:
        with self.lock:
            self.applied.append(node)
        return ActionOutcome(self.name, node, "drain", True, f"drained for {alert_id}")

    def undo(self, node: str, *, alert_id: str) -> ActionOutcome:
        return ActionOutcome(self.name, node, "resume", False, "not ours")


def forged_xid(service: FaultService, node: str) -> NodeBatch:
    ts = service.start_ts + 11
    return NodeBatch(
        HEALTHY,
        node,
        ts,
        samples=[("gpu_util_ratio", "gpu0", 0.9)],
        events=[Event(EventKind.XID, "gpu0", ts, code=79, message="GPU has fallen off the bus")],
    )


def test_forged_xid_batches_neither_alert_act_nor_spend_the_breaker(
    make_service: Any, figures: Figures
) -> None:
    actuator = RecordingActuator()
    service: FaultService = make_service(actuator, actions={"enforce": True})
    service.warm_up()
    stolen = Signer(service.cluster_key.node_key(ACCOMPLICE))
    victim = encode_batch(forged_xid(service, VICTIM))
    ghost = encode_batch(forged_xid(service, GHOST))
    key = HEALTHY.encode()
    name, value = stolen.header(victim)
    renamed = (name, value.replace(f";{ACCOMPLICE};".encode(), f";{VICTIM};".encode()))
    forgeries = [
        (victim, None),  # unsigned
        (victim, [stolen.header(victim)]),  # the accomplice's key on the victim's batch
        (victim, [renamed]),  # the victim's name in the header, the accomplice's key behind it
        (ghost, None),  # a ghost node joining the job
    ]
    for payload, headers in forgeries:
        service.send_raw(payload, key, HEALTHY_PARTITION, headers)
    service.flush()
    assert wait_until(lambda: service.consumed(HEALTHY_PARTITION), 30) is not None

    healthy = service.fault_then_alert(figures, timeout_s=40)
    assert healthy.on_time(), healthy
    drained = wait_until(lambda: FAULTY in actuator.applied, 30)
    figures.record("real fault drained after the forgeries", drained, "s")
    assert drained is not None, actuator.applied

    alerted = {alert.machine for alert in service.stack.service.alerts}
    assert alerted == {FAULTY}, alerted
    assert actuator.applied == [FAULTY]
    assert GHOST not in service.stack.service.jobs[HEALTHY].window.machine_index
    assert service.metric("minder_actions_breaker_tripped") == 0

    def counted(reason: str) -> float:
        labels = {"reason": reason, "action": "dead_lettered"}
        return service.metric("minder_batches_unauthenticated_total", **labels) or 0.0

    assert wait_until(lambda: counted("unsigned") == 2, 10) is not None
    assert counted("misattributed") == 1
    assert counted("bad_signature") == 1
    letters = read_dead_letters(service.broker.bootstrap, service.deadletter_topic)
    assert sorted(letter.reason_class for letter in letters) == [
        "bad_signature",
        "misattributed",
        "unsigned",
        "unsigned",
    ]
