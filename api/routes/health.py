"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import KortexDep
from kortex.health import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (it answers without touching any backing service)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(k: KortexDep) -> JSONResponse:
    """Ready (200) when the database answers with the schema this code needs and Redis answers;
    503 with each failed check named otherwise."""
    checks = readiness(k)
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                        status_code=200 if ready else 503)
