"""Custom what-ifs: "this worker 20 % faster", "all PP communication free".

A what-if selects ops (by op type or type family, stage, DP rank, global rank) and changes their
replayed duration (duration for compute, transfer for comm) starting from the original replay
without launch delays; it reports the step time and the speed-up over the original replay.

Spec grammar (CLI ``--what-if``): ``SELECTORS:EFFECT`` where ``SELECTORS`` is ``all`` or
comma-separated ``key=value`` pairs (values may be ``a|b`` alternatives) or family names, and
``EFFECT`` is one of ``free`` (duration 0), ``ideal`` (ideal duration), ``faster=20%`` (duration
÷ 1.2), ``slower=20%`` (duration × 1.2) or ``scale=0.5``. Keys: ``optype``, ``stage``, ``dp``,
``rank``. Families: ``compute``, ``comm``, ``pp-comm``, ``dp-comm``, ``forward-pp-comm``,
``backward-pp-comm`` or any op type name. Examples: ``stage=3,dp=1:faster=20%``,
``pp-comm:free``, ``optype=forward-compute|backward-compute,stage=3:scale=0.8``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minder.core.errors import ValidationError
from whatif import optypes
from whatif.model import JobModel

FAMILIES: dict[str, tuple[str, ...]] = {
    "compute": optypes.COMPUTE,
    "comm": optypes.COMM,
    "pp-comm": optypes.P2P,
    "dp-comm": optypes.DP_COMM,
    "forward-pp-comm": (optypes.FORWARD_SEND, optypes.FORWARD_RECV),
    "backward-pp-comm": (optypes.BACKWARD_SEND, optypes.BACKWARD_RECV),
}


@dataclass(frozen=True)
class WhatIf:
    """A change to the replayed durations of the selected ops.

    ``None`` in a selector means "any". ``factor`` multiplies the original replayed duration;
    ``to_ideal`` replaces it by the ideal duration first.
    """

    name: str
    optypes: tuple[str, ...] | None = None
    stages: tuple[int, ...] | None = None
    dp_ranks: tuple[int, ...] | None = None
    ranks: tuple[int, ...] | None = None
    factor: float = 1.0
    to_ideal: bool = False

    def __post_init__(self) -> None:
        if not np.isfinite(self.factor) or self.factor < 0:
            raise ValidationError(
                f"what-if {self.name!r}: factor must be a finite number ≥ 0, got {self.factor}"
            )
        if self.optypes is not None:
            unknown = [t for t in self.optypes if t not in optypes.ALL]
            if unknown:
                raise ValidationError(
                    f"what-if {self.name!r}: unknown op type(s) {unknown}; expected op types "
                    f"{list(optypes.ALL)} or families {list(FAMILIES)}"
                )

    @classmethod
    def parse(cls, spec: str) -> WhatIf:
        """Parse a CLI spec (see the module docstring)."""
        text = spec.strip()
        if ":" not in text:
            raise ValidationError(
                f"what-if {spec!r}: expected SELECTORS:EFFECT, e.g. 'stage=3,dp=1:faster=20%' "
                "or 'pp-comm:free'"
            )
        selectors, effect = text.rsplit(":", 1)
        kinds: list[str] = []
        stages = dp_ranks = ranks = None
        for raw in selectors.split(","):
            part = raw.strip()
            if not part or part == "all":
                continue
            if "=" not in part:
                if part in FAMILIES:
                    kinds.extend(FAMILIES[part])
                elif part in optypes.ALL:
                    kinds.append(part)
                else:
                    raise ValidationError(
                        f"what-if {spec!r}: unknown selector {part!r}; expected key=value "
                        f"(optype, stage, dp, rank), 'all', a family {list(FAMILIES)} or an op type"
                    )
                continue
            key, value = (x.strip() for x in part.split("=", 1))
            values = [v.strip() for v in value.split("|") if v.strip()]
            if key == "optype":
                for v in values:
                    kinds.extend(FAMILIES.get(v, (v,)))
            elif key in ("stage", "dp", "rank"):
                try:
                    numbers = tuple(int(v) for v in values)
                except ValueError:
                    raise ValidationError(
                        f"what-if {spec!r}: {key} needs integers, got {value!r}"
                    ) from None
                if key == "stage":
                    stages = numbers
                elif key == "dp":
                    dp_ranks = numbers
                else:
                    ranks = numbers
            else:
                raise ValidationError(
                    f"what-if {spec!r}: unknown key {key!r}; expected optype, stage, dp or rank"
                )
        factor, to_ideal = _parse_effect(spec, effect.strip())
        return cls(
            name=text,
            optypes=tuple(dict.fromkeys(kinds)) if kinds else None,
            stages=stages,
            dp_ranks=dp_ranks,
            ranks=ranks,
            factor=factor,
            to_ideal=to_ideal,
        )

    def selection(self, model: JobModel, worker_rank: np.ndarray | None = None) -> np.ndarray:
        """Boolean ``(ops, dp)``: the ops this what-if changes.

        Parameters
        ----------
        model
            The job model.
        worker_rank
            ``(pp, dp)`` global rank of each worker (−1 unknown); needed for ``ranks``.
        """
        t = model.template
        op_mask = np.ones(t.n_ops, dtype=bool)
        if self.optypes is not None:
            op_mask &= np.isin(t.optype, list(self.optypes))
        if self.stages is not None:
            op_mask &= np.isin(t.stage, list(self.stages))
        dp_mask = np.ones(model.dp_size, dtype=bool)
        if self.dp_ranks is not None:
            bad = [d for d in self.dp_ranks if not 0 <= d < model.dp_size]
            if bad:
                raise ValidationError(
                    f"what-if {self.name!r}: dp rank(s) {bad} outside 0..{model.dp_size - 1}"
                )
            dp_mask = np.isin(np.arange(model.dp_size), list(self.dp_ranks))
        selected = op_mask[:, None] & dp_mask[None, :]
        if self.ranks is not None:
            if worker_rank is None or (worker_rank < 0).all():
                raise ValidationError(
                    f"what-if {self.name!r}: the trace has no global ranks; select by stage and dp"
                )
            hit = np.isin(worker_rank, list(self.ranks))  # (pp, dp)
            missing = sorted(set(self.ranks) - set(worker_rank[hit].tolist()))
            if missing:
                raise ValidationError(f"what-if {self.name!r}: rank(s) {missing} not in the trace")
            selected &= hit[t.stage]
        if not selected.any():
            raise ValidationError(f"what-if {self.name!r} selects no op of this trace")
        return selected


def _parse_effect(spec: str, effect: str) -> tuple[float, bool]:
    if effect == "free":
        return 0.0, False
    if effect == "ideal":
        return 1.0, True
    if "=" in effect:
        key, value = (x.strip() for x in effect.split("=", 1))
        try:
            number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            raise ValidationError(
                f"what-if {spec!r}: {key} needs a number, got {value!r}"
            ) from None
        if key == "faster" and number > -1:
            return 1.0 / (1.0 + number), False
        if key == "slower" and number > -1:
            return 1.0 + number, False
        if key == "scale":
            return number, False
    raise ValidationError(
        f"what-if {spec!r}: unknown effect {effect!r}; expected free, ideal, faster=N%, "
        "slower=N% or scale=X"
    )
