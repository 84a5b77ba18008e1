"""get_request_detail: one LLM request with its routing decision (llm-ops-agent-tools.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kortex.errors import NotFound
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Identifier
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetRequestDetailInput(ToolInput):
    request_id: Identifier = Field(description="Request id, e.g. 'req_abc123'")


def run(args: GetRequestDetailInput, ctx: ToolContext) -> dict[str, Any]:
    r = ctx.sources.llmops.request(ctx.tenant_id, args.request_id)
    if r is None:
        raise NotFound(f"Request not found: {args.request_id}")
    related = ctx.sources.incidents.incidents_at(
        ctx.tenant_id, r.created_at, target_ids=(r.deployment_id, r.model_id, r.backend_id), limit=1)
    incident = related[0] if related else None
    return {
        "request": {
            "id": r.request_id, "user_id": r.user_id, "user_tier": r.user_tier, "deployment_id": r.deployment_id,
            "model_id": r.model_id, "backend_id": r.backend_id, "task_type": r.task_type,
            "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "cost_usd": r.cost_usd,
            "latency_ms": r.latency_ms, "status": r.status, "router_version": r.router_version,
            "experiment_id": r.experiment_id, "created_at": isoformat(r.created_at), "routing_decision": r.routing,
        },
        "quality_score": r.quality_score,
        "related_incident": None if incident is None else {
            "id": incident.ref, "title": incident.title, "target_type": incident.target_type,
            "target_id": incident.target_id, "started_at": isoformat(incident.opened_at)},
    }


SPEC = ToolSpec(
    name="get_request_detail",
    description="Full details of one LLM request: tokens, cost, latency, outcome, the routing decision "
                "(options considered and why one was chosen), its quality score and any incident open on its "
                "deployment, model or backend at the time.",
    input_model=GetRequestDetailInput,
    run=run,
    category="lookup",
    redact=("request", "quality_score", "related_incident", "truncated"),
)
