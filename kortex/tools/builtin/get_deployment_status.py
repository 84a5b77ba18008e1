"""get_deployment_status: current health of the LLM platform's deployments (llm-ops-agent-tools.md)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from kortex.telemetry.llmops import DeploymentFilter, DeploymentStatus
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Identifier
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

STALE_AFTER = timedelta(minutes=5)
STATUSES = ("healthy", "degraded", "down")


class GetDeploymentStatusInput(ToolInput):
    model_id: Identifier | None = Field(None, description="Filter by model, e.g. 'gpt-4'")
    backend_id: Identifier | None = Field(None, description="Filter by backend, e.g. 'aws'")
    status: Literal["healthy", "degraded", "down"] | None = Field(None, description="Filter by status")


#: deployments one call lists; more say ``truncated`` (filter by model, backend or status)
MAX_DEPLOYMENTS = 500


def _shown(d: DeploymentStatus, ctx: ToolContext) -> dict[str, Any]:
    return {"id": d.deployment_id, "model_id": d.model_id, "backend_id": d.backend_id, "status": d.status,
            "latency_p50_ms": d.latency_p50_ms, "latency_p95_ms": d.latency_p95_ms, "error_rate": d.error_rate,
            "queue_depth": d.queue_depth, "cost_per_1k_tokens": d.cost_per_1k_tokens,
            "rate_limit_remaining": d.rate_limit_remaining, "sample_count": d.sample_count,
            "updated_at": isoformat(d.updated_at), "is_stale": ctx.now - d.updated_at > STALE_AFTER}


def run(args: GetDeploymentStatusInput, ctx: ToolContext) -> dict[str, Any]:
    where = DeploymentFilter(model_id=args.model_id, backend_id=args.backend_id, status=args.status)
    found = ctx.sources.llmops.deployments(ctx.tenant_id, where, limit=MAX_DEPLOYMENTS + 1)
    cut = len(found) > MAX_DEPLOYMENTS
    deployments = [_shown(d, ctx) for d in found[:MAX_DEPLOYMENTS]]
    # The summary is the fleet's: past the cap the source counts it, not the list.
    by_status = (ctx.sources.llmops.deployment_counts(ctx.tenant_id, where) if cut
                 else Counter(d["status"] for d in deployments))
    summary = {"total": sum(by_status.values()), **{status: by_status.get(status, 0) for status in STATUSES}}
    if cut:
        return {"deployments": deployments, "summary": summary, "truncated": True,
                "note": f"only the first {len(deployments)} of {summary['total']} deployments by id are listed "
                        "(summary counts them all); filter by model_id, backend_id or status"}
    return {"deployments": deployments, "summary": summary}


SPEC = ToolSpec(
    name="get_deployment_status",
    description=(
        "Current health of the LLM platform's deployments (model/backend pairs): status, p50/p95 latency, "
        "error rate, queue depth, cost, remaining rate limit, and whether the figures are stale. Filter by "
        "model, backend or status."
    ),
    input_model=GetDeploymentStatusInput,
    run=run,
    category="lookup",
    redact=("deployments", "summary", "truncated", "note"),
    list_field="deployments",
)
