"""The tool catalog: what a tenant's sessions may call."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from api.deps import KortexDep, TenantDep, allowed
from api.openapi import ERRORS
from kortex.access import Permission
from kortex.tools.catalog import CatalogEntry, catalog

router = APIRouter(prefix="/v1/tools", tags=["tools"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)


class ToolCatalogOut(BaseModel):
    tools: list[CatalogEntry]


@router.get("", response_model=ToolCatalogOut)
def list_tools(k: KortexDep, tenant: TenantDep) -> ToolCatalogOut:
    """The read-only tools this tenant's turns may call: name, description, input JSON Schema, effect
    and timeout."""
    return ToolCatalogOut(tools=catalog(k.tools, k.policy, k.pipeline))
