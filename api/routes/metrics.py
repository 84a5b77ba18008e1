"""Prometheus's view of this API: every process of it (multiprocess mode adds the uvicorn
workers up), in the text exposition format."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from kortex import metrics
from kortex.errors import AuthError, NotFound

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
def scrape(request: Request) -> Response:
    """Turns, steps, tool and LLM calls, open streams, delivery lag and refusals, for Prometheus
    (kortex/metrics.py names them). Needs `Authorization: Bearer <metrics token>` when
    `[metrics] token` is set; 404 when `[metrics] enabled` is false."""
    settings = request.app.state.kortex.settings.metrics
    if not settings.enabled:
        raise NotFound("metrics are disabled")
    if settings.token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), settings.token.get_secret_value()):
            raise AuthError("send 'Authorization: Bearer <metrics token>'")
    registry = metrics.registry() or REGISTRY
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
