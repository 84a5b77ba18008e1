"""What LLM providers and models this deployment offers (rfc-005 §5.3); never secrets."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from api.deps import KortexDep, TenantDep, allowed
from api.openapi import ERRORS
from kortex.access import Permission
from kortex.llm.base import ModelInfo

router = APIRouter(prefix="/v1/llm", tags=["llm"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)

PROBE_TIMEOUT = 2.0


class ModelOut(BaseModel):
    id: str
    display_name: str
    tier: Literal["fast", "balanced", "powerful"]
    context_tokens: int
    supports_tools: bool
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cache_read_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None

    @classmethod
    def of(cls, model: ModelInfo) -> ModelOut:
        return cls(**model.model_dump(include=set(cls.model_fields)))


class ProviderOut(BaseModel):
    name: str
    available: bool
    reason: str | None = None
    reachable: bool | None = None
    problems: list[str] = []  # configuration worth fixing that does not stop the provider
    local: bool
    synthetic: bool
    default: bool
    models: list[ModelOut]


class ProvidersOut(BaseModel):
    mode: str
    default_provider: str
    default_model: str | None
    fallback_providers: list[str]
    providers: list[ProviderOut]


@router.get("/providers", response_model=ProvidersOut)
def list_providers(k: KortexDep, tenant: TenantDep) -> ProvidersOut:
    """LLM providers and their models (tier, context, price), whether each can be used and why not;
    never a secret."""
    llm = k.settings.llm
    unreachable = k.loop.run(k.providers.probe(PROBE_TIMEOUT), timeout=PROBE_TIMEOUT + 3)
    return ProvidersOut(
        mode="local-only" if llm.local_only else llm.mode, default_provider=llm.default_provider,
        default_model=llm.default_model, fallback_providers=llm.fallback_providers,
        providers=[ProviderOut(name=s.name, available=s.available, reason=s.reason, reachable=s.reachable,
                               problems=list(s.problems), local=s.local, synthetic=s.synthetic, default=s.name == llm.default_provider,
                               models=[ModelOut.of(m) for m in s.models])
                   for s in k.providers.status(unreachable)],
    )
