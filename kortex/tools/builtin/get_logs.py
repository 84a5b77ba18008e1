"""get_logs: log lines of a product in a time window, newest first, 100 a page (rfc-005 §6.2.1).

With ``group``, every matching line of the window (up to 5000, newest first) is also grouped into
templates (kortex/telemetry/logtemplates.py) with counts, first and last time and hosts, and with
``split_at`` how many of each came before that moment and how many after: the counts a model
quotes, so it need not count a page of lines itself."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from kortex.errors import InvalidInput
from kortex.telemetry import logql, logtemplates
from kortex.telemetry.sources import MAX_LOG_PAGE, LogLine, LogQuery
from kortex.timeparse import ensure_utc, isoformat, parse_instant
from kortex.tools.builtin.common import Product, TimeRange, cursors, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetLogsInput(ToolInput):
    product: Product
    time_range: TimeRange
    query: str | None = Field(
        None, max_length=500,
        description='Optional filter: plain text the message contains (any case), or LogQL line filters and '
                    'label matchers, e.g. \'{host="web-1"} |= "timeout" != "healthz" |~ "5\\d\\d"\' '
                    '(labels: host, level, trace_id)')
    level: Literal["debug", "info", "warn", "error", "fatal"] | None = Field(
        None, description="Optional minimum severity")
    limit: int = Field(MAX_LOG_PAGE, ge=1, le=MAX_LOG_PAGE, description="Lines per page, at most 100")
    cursor: str | None = Field(None, max_length=4000,
                               description="Opaque cursor returned by a prior call. Omit on the first page.")
    group: bool = Field(False, description="Also group every matching line of the window (up to 5000) into "
                                           "message templates with counts, first/last time and hosts")
    split_at: str | None = Field(None, max_length=64,
                                 description="With group: a time (ISO or relative); each template counts the "
                                             "lines before it and after it")

MAX_GROUPED = 5000


def _bind(args: GetLogsInput, ctx: ToolContext) -> dict[str, Any]:
    return {"tool": "get_logs", "tenant": ctx.tenant_id, "product": args.product, "range": args.time_range,
            "query": args.query, "level": args.level}


def _cursor(ctx: ToolContext, args: GetLogsInput, start: datetime, end: datetime, last: tuple[str, int]) -> str:
    # The window is pinned in the cursor: "last 30m" must mean the same span on every page, to
    # the microsecond (rounded to milliseconds, a later page would hold lines outside the first's).
    return cursors(ctx).encode({"s": start.isoformat(), "e": end.isoformat(), "ts": last[0], "id": last[1]},
                               _bind(args, ctx))


def run(args: GetLogsInput, ctx: ToolContext) -> dict[str, Any]:
    started = time.monotonic()
    flt = logql.parse(args.query)
    before = None
    if args.cursor:
        pos = cursors(ctx).decode(args.cursor, _bind(args, ctx))
        try:
            start, end = ensure_utc(datetime.fromisoformat(pos["s"])), ensure_utc(datetime.fromisoformat(pos["e"]))
            before = (ensure_utc(datetime.fromisoformat(pos["ts"])), int(pos["id"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidInput("cursor is not valid; omit it to start from the first page") from None
    else:
        start, end = window(args.time_range, ctx)
    page = ctx.sources.logs.query_logs(
        ctx.tenant_id,
        LogQuery(product=args.product, start=start, end=end, filter=flt, min_level=args.level,
                 limit=args.limit, before=before),
    )
    # Full precision: a key rounded to milliseconds would skip lines within the same millisecond.
    keys = [(line.ts.isoformat(), line.id) for line in page.lines]
    result: dict[str, Any] = {
        "lines": [{"ts": isoformat(line.ts), "level": line.level, "host": line.host, "message": line.message,
                   **({"trace_id": line.trace_id} if line.trace_id else {})}
                  for line in page.lines],
        "truncated": False,
        "total_matches": page.total_matches,
        "query_latency_ms": int((time.monotonic() - started) * 1000),
        "_keys": keys,
        "_window": (start.isoformat(), end.isoformat()),
    }
    if page.has_more and keys:
        result["next_cursor"] = _cursor(ctx, args, start, end, keys[-1])
    if args.group:
        result.update(_grouped(args, ctx, flt, start, end, page.lines, page.has_more))
    return result


def _grouped(args: GetLogsInput, ctx: ToolContext, flt: Any, start: datetime, end: datetime,
             first: list[LogLine], more: bool) -> dict[str, Any]:
    split_at = parse_instant(args.split_at, now=ctx.now) if args.split_at else None
    lines = list(first)
    while more and lines and len(lines) < MAX_GROUPED:
        page = ctx.sources.logs.query_logs(ctx.tenant_id, LogQuery(
            product=args.product, start=start, end=end, filter=flt, min_level=args.level, limit=MAX_LOG_PAGE,
            before=(lines[-1].ts, lines[-1].id)))
        lines.extend(page.lines)
        more = page.has_more
    out: dict[str, Any] = {"templates": logtemplates.group(lines, split_at=split_at), "grouped_lines": len(lines),
                           "grouped_all": not more}
    if split_at is not None:
        out["split_at"] = isoformat(split_at)
        out["before_split"] = sum(1 for line in lines if line.ts < split_at)
        out["after_split"] = len(lines) - out["before_split"]
    return out


def on_truncate(result: dict[str, Any], args: GetLogsInput, kept: int, ctx: ToolContext) -> dict[str, Any]:
    """The output cap dropped lines: the next page starts right after the last line kept."""
    keys = result.get("_keys") or []
    if kept and kept <= len(keys):
        start, end = (ensure_utc(datetime.fromisoformat(v)) for v in result["_window"])
        result["next_cursor"] = _cursor(ctx, args, start, end, tuple(keys[kept - 1]))
    return result


SPEC = ToolSpec(
    name="get_logs",
    description=(
        "Query log entries of a product within a time range. Returns up to 100 lines, newest first, "
        "with total_matches; lines that belong to a request carry its trace_id (see get_traces). query takes "
        "plain text or LogQL line filters. When next_cursor is present, call again with the same arguments "
        "plus cursor to fetch the next page. group=true adds the window's message templates with counts, "
        "first/last time and hosts (split_at: counts before and after that time)."
    ),
    input_model=GetLogsInput,
    run=run,
    category="query",
    redact=("lines[].ts", "lines[].level", "lines[].host", "lines[].message", "lines[].trace_id", "truncated",
            "total_matches",
            "next_cursor", "query_latency_ms", "templates", "grouped_lines", "grouped_all", "split_at",
            "before_split", "after_split"),
    list_field="lines",
    on_truncate=on_truncate,
)
