"""get_recent_requests: requests the LLM platform served, newest first (llm-ops-agent-tools.md).

Pages of at most 100 with a signed cursor; the window is pinned in the cursor so relative
times mean the same span on every page. The page comes with its counts by status and its busiest
users with their share, so a model quotes them instead of counting rows itself, and with how many
requests match on all pages (total_matches, as get_logs gives)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import Field

from kortex.telemetry.llmops import MAX_REQUEST_PAGE, LLMRequest, RequestQuery
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import (
    Cursor,
    DeploymentId,
    Identifier,
    Since,
    Until,
    cursors,
    decode_time,
    since_until,
)
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetRecentRequestsInput(ToolInput):
    user_id: Identifier | None = Field(None, description="Filter by user")
    user_tier: Literal["premium", "standard", "budget"] | None = Field(None, description="Filter by tier")
    deployment_id: DeploymentId | None = None
    model_id: Identifier | None = Field(None, description="Filter by model")
    backend_id: Identifier | None = Field(None, description="Filter by backend")
    status: Literal["success", "error", "timeout"] | None = Field(None, description="Filter by outcome")
    since: Since | None = Field(None, description="Start time, default '24 hours ago' (ISO or relative)")
    until: Until | None = Field(None, description="End time, default now")
    limit: int = Field(50, ge=1, le=MAX_REQUEST_PAGE, description="Requests per page, at most 100")
    cursor: Cursor = None


def summary(r: LLMRequest) -> dict[str, Any]:
    return {"id": r.request_id, "user_id": r.user_id, "user_tier": r.user_tier, "deployment_id": r.deployment_id,
            "model_id": r.model_id, "backend_id": r.backend_id, "task_type": r.task_type,
            "latency_ms": r.latency_ms, "cost_usd": r.cost_usd, "status": r.status,
            "created_at": isoformat(r.created_at)}


TOP_USERS = 5


def tally(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The page's requests (as ``summary`` shows them) by status and its busiest users, shares
    in percent of the page."""
    total = len(requests)
    statuses = Counter(r["status"] for r in requests)
    users = Counter(r["user_id"] for r in requests)
    tiers = {r["user_id"]: r["user_tier"] for r in requests}
    busiest = sorted(users.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_USERS]
    return {"by_status": dict(sorted(statuses.items())),
            "failed_pct": round(100 * (total - statuses.get("success", 0)) / total, 1) if total else 0.0,
            "by_user": [{"user_id": user, "user_tier": tiers[user], "count": count,
                         "share_pct": round(100 * count / total, 1)} for user, count in busiest]}


def _bind(args: GetRecentRequestsInput, ctx: ToolContext) -> dict[str, Any]:
    return {"tool": "get_recent_requests", "tenant": ctx.tenant_id,
            **args.model_dump(exclude={"cursor", "limit"})}


def run(args: GetRecentRequestsInput, ctx: ToolContext) -> dict[str, Any]:
    before = None
    if args.cursor:
        pos = cursors(ctx).decode(args.cursor, _bind(args, ctx))
        start, end = decode_time(pos.get("s")), decode_time(pos.get("e"))
        before = (decode_time(pos.get("at")), int(pos.get("id", 0)))
    else:
        start, end = since_until(args.since, args.until, ctx, "24 hours ago")
    page = ctx.sources.llmops.requests(ctx.tenant_id, RequestQuery(
        start=start, end=end, user_id=args.user_id, user_tier=args.user_tier, deployment_id=args.deployment_id,
        model_id=args.model_id, backend_id=args.backend_id, status=args.status, limit=args.limit, before=before))
    shown = [summary(r) for r in page.requests]
    # count and the tallies describe this page; total_matches, every page (as get_logs' does).
    result: dict[str, Any] = {"requests": shown, "count": len(shown), "total_matches": page.total_matches,
                              **tally(shown), "has_more": page.has_more, "since": isoformat(start), "until": isoformat(end),
                              "_keys": [(r.created_at.isoformat(), r.row_id) for r in page.requests],
                              "_window": (start.isoformat(), end.isoformat())}
    if page.has_more and page.requests:
        result["next_cursor"] = _cursor(args, ctx, result, len(page.requests))
    return result


def _cursor(args: GetRecentRequestsInput, ctx: ToolContext, result: dict[str, Any], kept: int) -> str:
    at, row_id = result["_keys"][kept - 1]
    start, end = result["_window"]
    return cursors(ctx).encode({"s": start, "e": end, "at": at, "id": row_id}, _bind(args, ctx))


def on_truncate(result: dict[str, Any], args: GetRecentRequestsInput, kept: int, ctx: ToolContext) -> dict[str, Any]:
    """The output cap dropped requests: page on from the last one kept, so none is skipped, and
    count the page that is shown (the tallies of the dropped ones would describe requests the
    model never sees, and count them again on the next page)."""
    if kept:
        result["next_cursor"] = _cursor(args, ctx, result, kept)
        result["has_more"] = True
        result["count"] = kept
        result.update(tally(result["requests"][:kept]))
    return result


SPEC = ToolSpec(
    name="get_recent_requests",
    description=(
        "Recent requests served by the LLM platform, newest first, filtered by user, tier, deployment, model, "
        "backend, status and time (since/until accept ISO times or '1 hour ago', 'last 30m', 'yesterday'). "
        "The page's counts by status, its failed share (failed_pct) and its busiest users with their share "
        "(by_user) come with it, and total_matches: how many requests match on all pages. When has_more is true, "
        "call again with next_cursor."
    ),
    input_model=GetRecentRequestsInput,
    run=run,
    category="query",
    redact=("requests", "count", "total_matches", "by_status", "failed_pct", "by_user", "has_more", "since", "until", "next_cursor", "truncated"),
    list_field="requests",
    on_truncate=on_truncate,
)
