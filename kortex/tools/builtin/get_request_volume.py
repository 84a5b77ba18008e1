"""get_request_volume: request counts and cost over time by tier, model, backend or deployment
(llm-ops-agent-tools.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from kortex.errors import InvalidInput
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Since, Until, since_until
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

MAX_HOURLY = timedelta(days=31)


class GetRequestVolumeInput(ToolInput):
    group_by: Literal["tier", "model", "backend", "deployment"] = Field("tier", description="Grouping")
    since: Since | None = Field(None, description="Start time, default '7 days ago'")
    until: Until | None = Field(None, description="End time, default now")
    granularity: Literal["hour", "day"] = Field("day", description="Period length")


def run(args: GetRequestVolumeInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = since_until(args.since, args.until, ctx, "7 days ago")
    if args.granularity == "hour" and end - start > MAX_HOURLY:
        raise InvalidInput(f"hourly volume covers at most {MAX_HOURLY.days} days; use granularity 'day'")
    rows, cut = ctx.sources.llmops.request_volume(ctx.tenant_id, args.group_by, start, end, args.granularity)
    totals: dict[str, dict[str, float]] = {}
    for r in rows:
        entry = totals.setdefault(r.group, {"requests": 0, "cost_usd": 0.0})
        entry["requests"] += r.request_count
        entry["cost_usd"] = round(entry["cost_usd"] + r.total_cost_usd, 6)
    period = (lambda p: p.date().isoformat()) if args.granularity == "day" else isoformat
    result: dict[str, Any] = {
        "data": [{"period": period(r.period), "group": r.group, "request_count": r.request_count,
                  "total_cost_usd": r.total_cost_usd} for r in rows],
        "totals": totals, "group_by": args.group_by, "since": isoformat(start), "until": isoformat(end),
        "truncated": cut,
    }
    if cut:
        first = period(rows[0].period) if rows else isoformat(end)
        result["note"] = (f"too many periods and groups: only those from {first} on are shown, and the totals cover "
                          "only them; narrow the window or use a coarser granularity")
    return result


SPEC = ToolSpec(
    name="get_request_volume",
    description="LLM request counts and cost per period (hour or day), grouped by tier, model, backend or "
                "deployment, with totals per group. since defaults to '7 days ago'; hourly periods cover at most "
                "31 days.",
    input_model=GetRequestVolumeInput,
    run=run,
    category="analysis",
    redact=("data", "totals", "group_by", "since", "until", "note", "truncated"),
    list_field="data",
    keep="tail",  # oldest first: the cap keeps the latest periods
)
