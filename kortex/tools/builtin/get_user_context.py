"""get_user_context: a user of the LLM platform and today's budget use (llm-ops-agent-tools.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kortex.errors import NotFound
from kortex.tools.builtin.common import Identifier
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetUserContextInput(ToolInput):
    user_id: Identifier = Field(description="User id")


def run(args: GetUserContextInput, ctx: ToolContext) -> dict[str, Any]:
    llmops = ctx.sources.llmops
    user = llmops.user(ctx.tenant_id, args.user_id)
    if user is None:
        raise NotFound(f"User not found: {args.user_id}")
    day_start = ctx.now.replace(hour=0, minute=0, second=0, microsecond=0)
    usage = llmops.user_usage(ctx.tenant_id, user.user_id, day_start, ctx.now)
    budget = user.daily_budget_usd
    return {"user": {
        "id": user.user_id, "tier": user.tier, "latency_sla_ms": user.latency_sla_ms, "daily_budget_usd": budget,
        "daily_budget_used_usd": round(usage.cost_usd, 4),
        "daily_budget_remaining_usd": None if budget is None else round(max(0.0, budget - usage.cost_usd), 4),
        "requests_today": usage.requests,
    }}


SPEC = ToolSpec(
    name="get_user_context",
    description="A user of the LLM platform: tier, latency SLA, daily budget and how much of it was used "
                "today (UTC), and how many requests they sent today.",
    input_model=GetUserContextInput,
    run=run,
    category="lookup",
    redact=("user", "truncated"),
)
