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
    volume = ctx.sources.llmops.request_volume(ctx.tenant_id, args.group_by, start, end, args.granularity)
    period = (lambda p: p.date().isoformat()) if args.granularity == "day" else isoformat
    data = [{"period": period(r.period), "group": r.group, "request_count": r.request_count,
             "total_cost_usd": r.total_cost_usd} for r in volume.rows]
    result: dict[str, Any] = {
        "data": data,
        # Over the whole window, however many periods data lists (the source's cut or the
        # output cap's): these are the figures a model quotes.
        "totals": {group: {"requests": u.requests, "cost_usd": u.cost_usd} for group, u in volume.totals.items()},
        "group_by": args.group_by, "since": isoformat(start), "until": isoformat(end), "truncated": volume.cut,
    }
    if volume.cut:
        first = data[0]["period"] if data else isoformat(end)
        result["note"] = (f"too many periods and groups to list: data holds only the periods from {first} on; "
                          "totals cover the whole window. Narrow the window or use a coarser granularity")
    return result


SPEC = ToolSpec(
    name="get_request_volume",
    description="LLM request counts and cost per period (hour or day), grouped by tier, model, backend or "
                "deployment, with totals per group over the whole window (even when data lists only its latest "
                "periods). since defaults to '7 days ago'; hourly periods cover at most 31 days.",
    input_model=GetRequestVolumeInput,
    run=run,
    category="analysis",
    redact=("data", "totals", "group_by", "since", "until", "note", "truncated"),
    list_field="data",
    keep="tail",  # oldest first: the cap keeps the latest periods
)
