"""Liveness and readiness."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import KortexDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(k: KortexDep) -> JSONResponse:
    checks: dict[str, str] = {}

    async def check(name: str, probe: object) -> None:
        try:
            await asyncio.wait_for(probe, 2.0)  # type: ignore[arg-type]
            checks[name] = "ok"
        except Exception as exc:  # any failure means not ready; say which
            checks[name] = f"failed: {exc.__class__.__name__}"

    await asyncio.gather(check("database", k.db.ping()), check("redis", k.redis.ping()))
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                        status_code=200 if ready else 503)
