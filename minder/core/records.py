"""The per-node batch (docs/architecture.md §3.2): one message per node per interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

SCHEMA_VERSION = 1
"""Version of the batch envelope this code writes and reads."""

METRICS_TOPIC = "minder.metrics.v1"
ALERTS_TOPIC = "minder.alerts.v1"
DEADLETTER_TOPIC = "minder.deadletter.v1"
TRACES_TOPIC = "minder.traces.v1"


class EventKind(StrEnum):
    """Discrete hard-fault events a node reports besides its samples."""

    XID = "xid"
    """An NVIDIA XID error; ``code`` holds the XID number."""
    ECC = "ecc"
    """An uncorrectable (double-bit) ECC error."""
    GPU_LOST = "gpu_lost"
    """A GPU fell off the bus / NVML lost its handle."""
    LINK_DOWN = "link_down"
    """An RDMA/IB port left the ACTIVE state."""
    NVLINK_ERROR = "nvlink_error"
    """NVLink errors beyond replay (link down, recovery failed)."""
    RECOVERY_ACTION = "recovery_action"
    """NVML asks for a GPU reset or node reboot; ``code`` holds the action."""
    LEAVE = "leave"
    """The node leaves the job on purpose (its agent stops cleanly, e.g. on SIGTERM): not a
    fault. The service drops the node from the job until it reports again."""


@dataclass(frozen=True, slots=True)
class Event:
    """One hard-fault event."""

    kind: EventKind
    device: str
    ts: float
    code: int | None = None
    message: str = ""


Sample = tuple[str, str, float]
"""``(metric, device, value)``; ``device`` is ``""`` for host metrics."""


@dataclass(slots=True)
class NodeBatch:
    """Everything one node measured in one interval.

    Attributes
    ----------
    job
        Job id; also the Kafka key, so one job's batches stay in one partition.
    node
        Machine name, unique within the job.
    ts
        End of the interval, unix seconds.
    interval_s
        Length of the interval the rates and counts cover.
    labels
        Placement and role: ``group`` (peer group such as ``pp3``), ``domain`` (switch or rack),
        and any others the agent discovered.
    samples
        Canonical ``(metric, device, value)`` triples.
    events
        Hard-fault events seen during the interval.
    """

    job: str
    node: str
    ts: float
    interval_s: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    schema: int = SCHEMA_VERSION

    @property
    def group(self) -> str:
        """Peer group of the node (empty when the job has one)."""
        return self.labels.get("group", "")

    @property
    def domain(self) -> str:
        """Shared failure domain of the node (empty when unknown)."""
        return self.labels.get("domain", self.labels.get("switch", ""))
