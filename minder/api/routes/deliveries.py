"""The outbox: where each alert event stands on its way to each destination."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from minder.api.deps import DbSession, Offset
from minder.api.schemas import DeliveryOut, DeliveryPage
from minder.storage.outbox import MAX_PAGE, DeliveryStatus, list_deliveries

router = APIRouter(prefix="/deliveries", tags=["deliveries"])


@router.get("", response_model=DeliveryPage, summary="List deliveries")
def deliveries(
    session: DbSession,
    status: DeliveryStatus | None = None,
    destination: str | None = None,
    alert_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> DeliveryPage:
    """Outbox rows, newest first: ``status=pending`` shows what waits (and its last error),
    ``status=expired`` what was given up."""
    rows, total = list_deliveries(
        session,
        status=status,
        destination=destination,
        alert_id=alert_id,
        limit=limit,
        offset=offset,
    )
    return DeliveryPage(
        items=[DeliveryOut(**row.to_dict()) for row in rows],
        total=total,
        limit=limit,
        offset=offset,
    )
