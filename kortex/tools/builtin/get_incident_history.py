"""get_incident_history: free-text search over past incidents (rfc-005 §6.2.6).

Words of the query are matched in titles (weight 2), findings and resolutions (weight 1);
results are ranked by that score, then newest first, and page with a signed cursor."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kortex.telemetry.sources import IncidentQuery
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Cursor, Product, TimeRange, cursors, decode_time, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

SUMMARY_CHARS = 400


class GetIncidentHistoryInput(ToolInput):
    query: str = Field(min_length=1, max_length=300,
                       description="Free text searched in titles, findings and resolutions, e.g. 'pool exhausted'")
    product: Product | None = Field(None, description="Optional product filter")
    time_range: TimeRange | None = Field(None, description="Optional window the incident opened in")
    limit: int = Field(10, ge=1, le=25, description="Incidents per page, at most 25")
    cursor: Cursor = None


def _bind(args: GetIncidentHistoryInput, ctx: ToolContext) -> dict[str, Any]:
    return {"tool": "get_incident_history", "tenant": ctx.tenant_id, "query": args.query, "product": args.product,
            "range": args.time_range}


def _clip(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS].rsplit(" ", 1)[0] + " …"


def run(args: GetIncidentHistoryInput, ctx: ToolContext) -> dict[str, Any]:
    start = end = None
    after = None
    if args.cursor:
        pos = cursors(ctx).decode(args.cursor, _bind(args, ctx))
        after = (pos.get("score"), decode_time(pos.get("at")), pos.get("id"))
        if pos.get("s"):
            start, end = decode_time(pos["s"]), decode_time(pos["e"])
    elif args.time_range:
        start, end = window(args.time_range, ctx)
    page = ctx.sources.incidents.search_incidents(ctx.tenant_id, IncidentQuery(
        text=args.query, product=args.product, start=start, end=end, limit=args.limit, after=after))
    result: dict[str, Any] = {
        "incidents": [
            {"id": h.incident.ref, "title": h.incident.title, "product": h.incident.product,
             "severity": h.incident.severity, "opened_at": isoformat(h.incident.opened_at),
             "closed_at": isoformat(h.incident.closed_at) if h.incident.closed_at else None,
             "status": "closed" if h.incident.closed_at else "open",
             "findings": _clip(h.incident.findings), "resolution_summary": _clip(h.incident.resolution),
             "match_score": h.score}
            for h in page.hits
        ],
        "truncated": False,
        "_keys": [(h.position[0], h.position[1].isoformat(), h.position[2]) for h in page.hits],
        # "last 30d" stays the same 30 days on every page
        "_window": (start.isoformat(), end.isoformat()) if start is not None and end is not None else None,
    }
    if page.has_more and page.hits:
        result["next_cursor"] = _cursor(args, ctx, result, len(page.hits))
    return result


def _cursor(args: GetIncidentHistoryInput, ctx: ToolContext, result: dict[str, Any], kept: int) -> str:
    score, opened, row_id = result["_keys"][kept - 1]
    position: dict[str, Any] = {"score": score, "at": opened, "id": row_id}
    if result["_window"]:
        position.update(s=result["_window"][0], e=result["_window"][1])
    return cursors(ctx).encode(position, _bind(args, ctx))


def on_truncate(result: dict[str, Any], args: GetIncidentHistoryInput, kept: int,
                ctx: ToolContext) -> dict[str, Any]:
    """The output cap dropped incidents: page on from the last one kept, so none is skipped."""
    if kept:
        result["next_cursor"] = _cursor(args, ctx, result, kept)
    return result


SPEC = ToolSpec(
    name="get_incident_history",
    description=(
        "Search past incidents by free text across titles, findings and resolutions, optionally filtered by "
        "product or by the window they opened in. Best matches first; use it to find how a similar problem "
        "was resolved before."
    ),
    input_model=GetIncidentHistoryInput,
    run=run,
    category="lookup",
    redact=("incidents[].id", "incidents[].title", "incidents[].product", "incidents[].severity",
            "incidents[].opened_at", "incidents[].closed_at", "incidents[].status", "incidents[].findings",
            "incidents[].resolution_summary", "incidents[].match_score", "next_cursor", "truncated"),
    list_field="incidents",
    on_truncate=on_truncate,
)
