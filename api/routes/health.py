"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import KortexDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(k: KortexDep) -> JSONResponse:
    checks: dict[str, str] = {}
    for name, probe in (("database", k.db.ping), ("redis", k.redis.ping)):
        try:
            probe()
            checks[name] = "ok"
        except Exception as exc:  # any failure means not ready; say which
            checks[name] = f"failed: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                        status_code=200 if ready else 503)
