"""Prometheus exposition of the app's registry."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client.exposition import choose_encoder

from minder.api.deps import Context

router = APIRouter(tags=["metrics"])


def metrics(request: Request, context: Context) -> Response:
    """Every metric of the registry, in the text format the scraper asks for."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(context.registry), media_type=content_type)


router.add_api_route(
    "/metrics",
    metrics,
    methods=["GET"],
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
