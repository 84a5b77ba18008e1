"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from api.deps import KortexDep
from kortex.container import Kortex
from kortex.storage.migrate import schema_state

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def _schema(k: Kortex) -> None:
    with k.db.connect() as conn:
        problem = schema_state(conn).problem()
    if problem:
        raise _NotReady(problem)


class _NotReady(Exception):
    pass


@router.get("/readyz")
def readyz(k: KortexDep) -> JSONResponse:
    """Ready when the database answers with the schema this code needs and Redis answers: a
    process on an unmigrated database would fail every request."""
    checks: dict[str, str] = {}
    for name, probe in (("database", k.db.ping), ("schema", lambda: _schema(k)), ("redis", k.redis.ping)):
        if name == "schema" and checks["database"] != "ok":
            checks[name] = "unknown: the database did not answer"
            continue
        try:
            probe()
            checks[name] = "ok"
        except _NotReady as exc:
            checks[name] = f"failed: {exc}"
        except Exception as exc:  # any failure means not ready; say which
            checks[name] = f"failed: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks},
                        status_code=200 if ready else 503)
