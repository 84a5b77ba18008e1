"""get_latency_trends: LLM request latency per period and deployment (llm-ops-agent-tools.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from kortex.errors import InvalidInput
from kortex.telemetry.llmops import TrendFilter
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import DeploymentId, Identifier, Since, Until, since_until
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

MAX_HOURLY = timedelta(days=31)


class GetLatencyTrendsInput(ToolInput):
    deployment_id: DeploymentId | None = None
    model_id: Identifier | None = Field(None, description="Filter by model")
    backend_id: Identifier | None = Field(None, description="Filter by backend")
    since: Since | None = Field(None, description="Start time, default '24 hours ago'")
    until: Until | None = Field(None, description="End time, default now")
    granularity: Literal["hour", "day"] = Field("hour", description="Period length")


def run(args: GetLatencyTrendsInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = since_until(args.since, args.until, ctx, "24 hours ago")
    if args.granularity == "hour" and end - start > MAX_HOURLY:
        raise InvalidInput(f"hourly trends cover at most {MAX_HOURLY.days} days; use granularity 'day'")
    trend = ctx.sources.llmops.latency_trends(
        ctx.tenant_id, TrendFilter(deployment_id=args.deployment_id, model_id=args.model_id,
                                   backend_id=args.backend_id), start, end, args.granularity)
    data = [{"period": isoformat(b.period), "deployment_id": b.deployment_id, "request_count": b.request_count,
             "latency_p50_ms": b.latency_p50_ms, "latency_p95_ms": b.latency_p95_ms, "error_rate": b.error_rate}
            for b in trend.buckets]
    result: dict[str, Any] = {
        "data": data,
        # Over every matching request, however many periods data lists (the source's cut or the
        # output cap's): these are the figures a model quotes.
        "summary": {"total_requests": trend.total_requests, "avg_latency_p50_ms": trend.avg_latency_p50_ms,
                    "avg_latency_p95_ms": trend.avg_latency_p95_ms},
        "since": isoformat(start), "until": isoformat(end), "truncated": trend.cut,
    }
    if trend.cut:
        first = data[0]["period"] if data else isoformat(end)
        result["note"] = (f"too many periods and deployments to list: data holds only the periods from {first} on; "
                          "summary covers every request of the window. Narrow the window or the filters, or use "
                          "a coarser granularity")
    return result


SPEC = ToolSpec(
    name="get_latency_trends",
    description="LLM request latency over time: request count, p50/p95 latency and error rate per period "
                "(hour or day) and deployment, plus summary: the request count and request-weighted averages over "
                "the whole window (even when data lists only its latest periods). Filter by deployment, model or "
                "backend; since defaults to '24 hours ago'.",
    input_model=GetLatencyTrendsInput,
    run=run,
    category="analysis",
    redact=("data", "summary", "since", "until", "note", "truncated"),
    list_field="data",
    keep="tail",  # oldest first: the cap keeps the latest periods
)
