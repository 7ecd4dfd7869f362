"""The one error hierarchy of Minder.

Every message names the value received and what was allowed, so an operator can fix the input
without reading the code.
"""

from __future__ import annotations


class MinderError(Exception):
    """Base of every error Minder raises on purpose."""


class ValidationError(MinderError, ValueError):
    """A record, table, file or setting does not follow its contract."""


class UnknownMetricError(ValidationError):
    """A metric name is not in the canonical table (docs/architecture.md §3.1)."""


class DecodeError(ValidationError):
    """A wire message cannot be decoded into a batch; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TableError(ValidationError):
    """A canonical metric table is malformed.

    Parameters
    ----------
    message
        What is wrong and what was expected.
    column
        The offending column, when one is to blame.
    row
        The 0-based data row (header excluded), when one is to blame.
    """

    def __init__(self, message: str, *, column: str | None = None, row: int | None = None) -> None:
        where = []
        if column is not None:
            where.append(f"column {column!r}")
        if row is not None:
            where.append(f"row {row}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.column = column
        self.row = row


class ScenarioError(ValidationError):
    """A simulator scenario file is malformed."""


class ModelError(MinderError):
    """A saved model cannot be loaded (wrong version, missing file)."""


class StorageError(MinderError):
    """The database cannot be reached or used (connection refused, authentication, disk)."""


class BrokerError(MinderError):
    """The message broker cannot be started, reached or used."""


class NotFoundError(MinderError, LookupError):
    """A requested entity (job, alert, report) does not exist."""


class TraceError(ValidationError):
    """A job trace (what-if analysis input) is malformed or cannot be analysed.

    Parameters
    ----------
    message
        What is wrong and what was expected.
    where
        Where the problem is (a file, a column, a step/rank/op), when one is to blame.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
