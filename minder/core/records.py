"""The per-node batch (docs/architecture.md §3.2): one message per node per interval."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

# Only packed batches (decoded by the service) hold arrays: the agent needs no numpy. So the
# annotations naming ``np`` are strings at run time (``typing.get_type_hints`` of these classes
# needs ``numpy`` in its namespace).
if TYPE_CHECKING:
    import numpy as np

    from minder.core.hang import RankSummary

SCHEMA_VERSION = 1
"""The envelope with named samples (columns or triples), msgpack or JSON."""
PACKED_SCHEMA_VERSION = 2
"""The packed envelope: a layout id and little-endian float32 values (docs/architecture.md
§3.2); the layout's names travel only now and then."""
SCHEMA_VERSIONS = (SCHEMA_VERSION, PACKED_SCHEMA_VERSION)
"""Envelope versions this code reads."""

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


@dataclass(frozen=True, slots=True, eq=False)
class Layout:
    """The ordered ``(metric, device)`` pairs of packed batches (schema 2), known by ``id``.

    Built and validated once by the codec when a layout is first seen, then shared by every
    batch that names its id, so whatever a receiver derives from it (value bounds here, window
    series indices in ``detectors.window``) is derived once per layout, not per message.

    Attributes
    ----------
    id
        64-bit content hash of the pairs (:func:`minder.core.codec.layout_id`): the same
        pairs have the same id on every node, different pairs (as good as) never share one.
    metrics, devices
        The pairs, position by position.
    lower, upper
        Per position, the bounds a value must lie within (float32, as the values travel).
    upper_bits
        When every lower bound is 0: ``upper`` as the uint32 bit patterns of its float32
        values. Non-negative floats order like their bit patterns, and NaN, infinity and
        negative numbers all have larger patterns than any finite upper bound, so one integer
        comparison validates a whole value block.
    """

    id: int
    metrics: tuple[str, ...] = field(repr=False)
    devices: tuple[str, ...] = field(repr=False)
    lower: np.ndarray = field(repr=False)
    upper: np.ndarray = field(repr=False)
    upper_bits: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.metrics)

    def pairs(self) -> list[tuple[str, str]]:
        """The ``(metric, device)`` pairs in order."""
        return list(zip(self.metrics, self.devices, strict=True))


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
        Canonical ``(metric, device, value)`` triples. Empty in a batch decoded from the packed
        envelope (schema 2): its samples are ``layout`` and ``values``; read
        :attr:`sample_count` and :meth:`all_samples` to cover both forms.
    events
        Hard-fault events seen during the interval.
    schema
        Envelope version it was decoded from (or is meant for).
    layout, values
        Packed samples (schema 2): the layout, and one float32 value per position of it.
    flight_recorder
        Summaries of the flight-recorder dumps the node's ranks wrote since the last batch
        (:mod:`minder.core.hang`); empty nearly always.
    """

    job: str
    node: str
    ts: float
    interval_s: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    schema: int = SCHEMA_VERSION
    layout: Layout | None = None
    values: np.ndarray | None = None
    flight_recorder: list[RankSummary] = field(default_factory=list)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a plain dataclass would be

    def __eq__(self, other: object) -> bool:
        """Field by field; packed values compared element-wise."""
        if not isinstance(other, NodeBatch):
            return NotImplemented
        if (self.values is None) != (other.values is None):
            return False
        return (
            self.job == other.job
            and self.node == other.node
            and self.ts == other.ts
            and self.interval_s == other.interval_s
            and self.labels == other.labels
            and self.samples == other.samples
            and self.events == other.events
            and self.flight_recorder == other.flight_recorder
            and self.schema == other.schema
            and (self.layout is None) == (other.layout is None)
            and (self.layout is None or other.layout is None or self.layout.id == other.layout.id)
            and (
                self.values is None
                or other.values is None
                or _same_values(self.values, other.values)
            )
        )

    @property
    def sample_count(self) -> int:
        """Samples the batch carries, in either form."""
        return len(self.samples) + (0 if self.values is None else len(self.values))

    def all_samples(self) -> list[Sample]:
        """The ``(metric, device, value)`` triples of either form (packed values widened to
        float)."""
        if self.layout is None or self.values is None:
            return list(self.samples)
        return [
            *self.samples,
            *zip(self.layout.metrics, self.layout.devices, self.values.tolist(), strict=True),
        ]

    @property
    def group(self) -> str:
        """Peer group of the node (empty when the job has one)."""
        return self.labels.get("group", "")

    @property
    def domain(self) -> str:
        """Shared failure domain of the node (empty when unknown)."""
        return self.labels.get("domain", self.labels.get("switch", ""))


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Packed values element-wise equal (numpy is loaded wherever a batch holds arrays)."""
    import numpy as np  # noqa: PLC0415

    return bool(np.array_equal(a, b))
