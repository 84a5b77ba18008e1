"""Telemetry ingest into the embedded store, scoped to the API key's tenant.

``POST /v1/ingest/{kind}`` with ``{"items": [...]}`` (1 to 5000 items, 1 MiB at most). The batch
is validated whole: one bad item rejects it with 422 and the index, field and reason of
each bad item; a good batch is stored in one transaction."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from api.deps import KortexDep, TenantDep, allowed
from api.openapi import ERRORS
from kortex.access import Permission
from kortex.telemetry import ingest
from kortex.telemetry.intake import ingest_batch as store_batch

router = APIRouter(prefix="/v1/ingest", tags=["ingest"], dependencies=[Depends(allowed(Permission.INGEST))], responses=ERRORS)


class IngestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Any] = Field(min_length=1, max_length=ingest.MAX_ITEMS)


class IngestResult(BaseModel):
    kind: str
    accepted: int


@router.post("/{kind}", response_model=IngestResult)
def ingest_batch(kind: str, body: IngestBody, k: KortexDep, tenant: TenantDep) -> IngestResult:
    """Write telemetry of one kind into the tenant's embedded store: 1 to 5000 items, validated whole
    (422 names each bad item's index, field and reason), stored in one transaction."""
    return IngestResult(kind=kind, accepted=store_batch(k, tenant.id, kind, body.items))
