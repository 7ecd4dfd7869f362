"""Training labels from the verdicts on alerts: what ``minder labels export`` writes.

Two kinds of verdict count, a person's and a self-check's (docs/selfcheck-service.md):

* a confirmed fault: an alert an operator *resolved*, or one a self-check of its drained node
  *confirmed* (status ``confirmed``: a check failed, the node stays out);
* a healthy machine: an alert an operator marked a *false positive*, or one a self-check
  *cleared* (status ``cleared_by_selfcheck``: every check passed, the node was returned).

So the self-checks label the detector's alerts without a person, and teach it too.

``minder train --labels`` (``detectors.training``) takes every row of its labels file as a fault
of ``machine`` in ``job`` from ``start_ts`` to ``end_ts``: there is no value of ``fault`` it treats
as "no fault" (``fault`` is only a name, listed in the model's info), and time no row covers is
normal data. So a false positive cannot be a row of that file without teaching the model the
opposite of the operator's verdict. :func:`export_labels` therefore writes:

* the labels file: one row per confirmed fault, columns ``job, machine, start_ts,
  end_ts, fault`` and, after them, columns training ignores (``device, domain, alert_id, kind,
  metric, score, status, detected_ts, resolved_at``);
* the false positives beside it (by default :func:`sidecar_path`: ``<name>.false_positives
  <ext>``), in the same columns with ``status`` ``false_positive`` or ``cleared_by_selfcheck``:
  not training input today (their time stays normal data), kept for evaluation and for a
  trainer that learns from them.

``status`` says whose verdict a row is: ``resolved`` and ``false_positive`` a person's,
``confirmed`` and ``cleared_by_selfcheck`` a self-check's.

``fault`` names the fault as ``minder simulate --labels`` does where the alert says it
(:data:`RULE_FAULTS`, silence → ``machine_unreachable``, hang → ``hang``), else
``<kind>:<metric>`` (e.g. ``similarity:gpu_power_w``). A domain alert (``machine`` is the
domain, ``evidence.domain_members`` its machines) gives one row per member machine, as simulated
labels do for a switch reboot, because training matches labels to machines by name. An alert
that names no machine (a job-level ``hang`` alert) gives none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import pandas as pd

from minder.core.errors import MinderError, ValidationError
from minder.core.table import table_format

Alert = Mapping[str, Any]
"""A stored alert as the API returns it (``minder.api.schemas.AlertOut`` as JSON)."""

TRAIN_COLUMNS = ("job", "machine", "start_ts", "end_ts", "fault")
"""What ``minder train --labels`` requires (``detectors.training.LABEL_COLUMNS``)."""
EXTRA_COLUMNS = (
    "device",
    "domain",
    "alert_id",
    "kind",
    "metric",
    "score",
    "status",
    "detected_ts",
    "resolved_at",
)
"""Written after :data:`TRAIN_COLUMNS`; training ignores them."""
COLUMNS = TRAIN_COLUMNS + EXTRA_COLUMNS
FLOAT_COLUMNS = ("start_ts", "end_ts", "score", "detected_ts", "resolved_at")

LONG_LABEL_S = 86_400.0
"""A fault label longer than this after its last report is worth a warning (see ``--end``)."""

RESOLVED = "resolved"
FALSE_POSITIVE = "false_positive"
CONFIRMED = "confirmed"
"""A self-check of the alert's drained node failed: a confirmed fault."""
CLEARED_BY_SELFCHECK = "cleared_by_selfcheck"
"""A self-check of the alert's drained node passed and the node was returned: a false positive."""
FAULT_STATUSES = (RESOLVED, CONFIRMED)
"""Alert statuses whose alerts are confirmed faults (label rows)."""
FALSE_POSITIVE_STATUSES = (FALSE_POSITIVE, CLEARED_BY_SELFCHECK)
"""Alert statuses whose alerts mark healthy machines (the false positives' file)."""
REVIEWED_STATUSES = FAULT_STATUSES + FALSE_POSITIVE_STATUSES
"""The statuses ``minder labels export`` fetches."""

RULE_FAULTS: dict[str, str] = {
    "gpu_xid_count": "gpu_xid",
    "gpu_ecc_dbe_count": "ecc_error",
    "gpu_lost": "gpu_lost",
    "rdma_port_up": "nic_down",
    "rdma_link_downed_count": "nic_down",
    "gpu_pcie_link_width": "pcie_downgrade",
    "gpu_pcie_link_gen": "pcie_downgrade",
    "gpu_nvlink_error_count": "nvlink_error",
    "rdma_symbol_error_count": "aoc_error",
}
"""Rule metrics that name the fault, as the simulator's fault types (``collectors.sim.kinds``)."""


class LabelEnd(StrEnum):
    """Where a confirmed fault's label ends."""

    resolved = "resolved"
    """When the verdict was given: the operator resolved the alert, or a self-check confirmed
    it (its ``updated_at``, wall time)."""
    last_seen = "last-seen"
    """The latest report of the fault (``last_seen_ts``, data time)."""


def fault_name(alert: Alert) -> str:
    """The ``fault`` of an alert's label: a fault type where the alert names one, else
    ``<kind>:<metric>``."""
    if alert["kind"] == "rule" and alert["metric"] in RULE_FAULTS:
        return RULE_FAULTS[alert["metric"]]
    if alert["kind"] == "silence":
        return "machine_unreachable"
    if alert["kind"] == "hang":
        return "hang"
    return f"{alert['kind']}:{alert['metric']}"


def label_rows(alert: Alert, end: LabelEnd) -> list[dict[str, Any]]:
    """The label rows of one reviewed alert (one per member machine of a domain alert).

    ``end_ts`` is never before ``start_ts`` nor before the fault's last report. A
    ``suspicious_source`` alert has none: it says a report came from outside its job, not that
    the machine was faulty; nor has an alert that names no machine (the job-level ``hang``
    alert: the machines its hang waited on have alerts, and rows, of their own).
    """
    if alert["kind"] == "suspicious_source" or not alert["machine"]:
        return []
    start = float(alert["first_ts"])
    last_seen = max(float(alert["last_seen_ts"]), start)
    end_ts = max(float(alert["updated_at"]), last_seen) if end is LabelEnd.resolved else last_seen
    members = alert["evidence"].get("domain_members") if alert["domain"] else None
    machines = (
        [str(m) for m in members]
        if isinstance(members, list) and members and alert["machine"] == alert["domain"]
        else [alert["machine"]]
    )
    return [
        {
            "job": alert["job"],
            "machine": machine,
            "start_ts": start,
            "end_ts": end_ts,
            "fault": fault_name(alert),
            "device": ",".join(alert["devices"]),
            "domain": alert["domain"],
            "alert_id": alert["id"],
            "kind": alert["kind"],
            "metric": alert["metric"],
            "score": float(alert["score"]),
            "status": alert["status"],
            "detected_ts": float(alert["detected_ts"]),
            "resolved_at": float(alert["updated_at"]),
        }
        for machine in machines
    ]


def labels_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The label rows as a table of :data:`COLUMNS`, by job, start and machine."""
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame = frame.astype({c: "float64" for c in FLOAT_COLUMNS})
    frame = frame.astype({c: "str" for c in COLUMNS if c not in FLOAT_COLUMNS})
    return frame.sort_values(["job", "start_ts", "machine"], kind="stable").reset_index(drop=True)


def write_labels(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    """Write ``frame`` as ``fmt`` (``parquet`` or ``csv``) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, float_format="%.3f")


def sidecar_path(path: Path) -> Path:
    """``labels.csv`` → ``labels.false_positives.csv`` (``.csv.gz`` and ``.parquet`` alike)."""
    name = path.name
    for suffix in (".csv.gz", ".csv", ".parquet", ".pq"):
        if name.lower().endswith(suffix):
            stem = name[: -len(suffix)]
            return path.with_name(f"{stem}.false_positives{name[len(stem) :]}")
    return path.with_name(f"{name}.false_positives")


@dataclass(frozen=True, slots=True)
class LabelExport:
    """What :func:`export_labels` wrote.

    Attributes
    ----------
    labels, false_positives_file
        The two files.
    rows, false_positive_rows
        Rows written to each.
    confirmed_faults, false_positives
        Alerts that are confirmed faults (resolved, or confirmed by a self-check) and false
        positives (marked so, or cleared by a self-check).
    faults
        The ``fault`` names of the label rows.
    resolved_long_after
        Confirmed faults resolved more than :data:`LONG_LABEL_S` after their last report (their
        label spans that long when it ends when they were resolved).
    confirmed_by_selfcheck, cleared_by_selfcheck
        Of ``confirmed_faults`` and ``false_positives``: the alerts a self-check decided.
    """

    labels: Path
    false_positives_file: Path
    rows: int
    confirmed_faults: int
    false_positives: int
    false_positive_rows: int
    faults: tuple[str, ...]
    resolved_long_after: int
    confirmed_by_selfcheck: int = 0
    cleared_by_selfcheck: int = 0

    def summary(self) -> dict[str, Any]:
        """The JSON summary of ``minder labels export``."""
        return {
            "labels": str(self.labels),
            "false_positives_file": str(self.false_positives_file),
            "rows": self.rows,
            "confirmed_faults": self.confirmed_faults,
            "false_positives": self.false_positives,
            "false_positive_rows": self.false_positive_rows,
            "confirmed_by_selfcheck": self.confirmed_by_selfcheck,
            "cleared_by_selfcheck": self.cleared_by_selfcheck,
            "faults": list(self.faults),
        }


def check_destinations(output: Path, false_positives: Path | None = None) -> tuple[Path, str, str]:
    """``(false positives path, labels format, false positives format)`` for ``output``; the
    false positives go to :func:`sidecar_path` unless given.

    Raises
    ------
    TableError
        A file whose name says no table format.
    ValidationError
        Both paths are the same file.
    """
    fp_path = false_positives or sidecar_path(output)
    fmt, fp_fmt = table_format(output), table_format(fp_path)
    if fp_path.resolve() == output.resolve():
        raise ValidationError(
            f"--false-positives {str(fp_path)!r} is the labels file: give another path"
        )
    return fp_path, fmt, fp_fmt


def export_labels(
    alerts: Iterable[Alert],
    output: Path,
    false_positives: Path | None = None,
    end: LabelEnd = LabelEnd.resolved,
) -> LabelExport:
    """Write the labels of the reviewed ``alerts`` (:data:`FAULT_STATUSES` as faults,
    :data:`FALSE_POSITIVE_STATUSES` as false positives; others are left out) to ``output`` and
    their false positives beside it.

    Raises
    ------
    TableError, ValidationError
        See :func:`check_destinations`.
    MinderError
        A file cannot be written (the message says so).
    """
    fp_path, fmt, fp_fmt = check_destinations(output, false_positives)
    reviewed = list(alerts)
    faults = [a for a in reviewed if a["status"] in FAULT_STATUSES]
    wrong = [a for a in reviewed if a["status"] in FALSE_POSITIVE_STATUSES]
    fault_rows = [row for a in faults for row in label_rows(a, end)]
    fp_rows = [row for a in wrong for row in label_rows(a, LabelEnd.last_seen)]
    try:
        write_labels(labels_frame(fault_rows), output, fmt)
        write_labels(labels_frame(fp_rows), fp_path, fp_fmt)
    except (OSError, ValueError, ImportError) as exc:
        raise MinderError(f"cannot write the labels: {exc}") from None
    long_after = {
        a["id"]
        for a in faults
        if a["updated_at"] - max(a["last_seen_ts"], a["first_ts"]) > LONG_LABEL_S
    }
    return LabelExport(
        labels=output,
        false_positives_file=fp_path,
        rows=len(fault_rows),
        confirmed_faults=len(faults),
        false_positives=len(wrong),
        false_positive_rows=len(fp_rows),
        faults=tuple(sorted({row["fault"] for row in fault_rows})),
        resolved_long_after=len(long_after) if end is LabelEnd.resolved else 0,
        confirmed_by_selfcheck=sum(a["status"] == CONFIRMED for a in faults),
        cleared_by_selfcheck=sum(a["status"] == CLEARED_BY_SELFCHECK for a in wrong),
    )
