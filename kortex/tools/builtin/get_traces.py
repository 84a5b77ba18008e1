"""get_traces: a distributed trace by trace or correlation id, as a span tree (rfc-005 §6.2.3).

At most 100 spans a page. The first page holds the root; a later page holds the next spans
(in start order) as ``fragments``: subtrees whose parent was on an earlier page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field

from kortex.errors import NotFound
from kortex.telemetry.sources import LogQuery, Span
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Cursor, Identifier, cursors, decode_time
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

PAGE = 100


class GetTracesInput(ToolInput):
    request_id: Identifier = Field(description="Trace id or correlation (request) id")
    include_logs: bool = Field(False, description="Include log lines correlated to the trace (first page only)")
    cursor: Cursor = None


def _bind(args: GetTracesInput, ctx: ToolContext) -> dict[str, Any]:
    return {"tool": "get_traces", "tenant": ctx.tenant_id, "request_id": args.request_id,
            "include_logs": args.include_logs}


def _node(span: Span, t0_us: int) -> dict[str, Any]:
    node: dict[str, Any] = {
        "span_id": span.span_id, "service": span.service, "operation": span.operation,
        "start_us": int(span.start.timestamp() * 1_000_000) - t0_us, "duration_us": span.duration_us,
        "status": span.status, "tags": span.tags, "children": [],
    }
    if span.error_message:
        node["error"] = span.error_message
    return node


def run(args: GetTracesInput, ctx: ToolContext) -> dict[str, Any]:
    trace = ctx.sources.traces.get_trace(ctx.tenant_id, args.request_id)
    if trace is None or not trace.spans:
        raise NotFound(f"no trace has id or correlation id {args.request_id!r}")
    spans = trace.spans
    after = None
    if args.cursor:
        pos = cursors(ctx).decode(args.cursor, _bind(args, ctx))
        after = (decode_time(pos.get("s")), str(pos.get("id")))
    remaining = [s for s in spans if after is None or (s.start, s.span_id) > after]
    page, has_more = remaining[:PAGE], len(remaining) > PAGE
    t0 = min(s.start for s in spans)
    t0_us = int(t0.timestamp() * 1_000_000)
    end_us = max(int(s.start.timestamp() * 1_000_000) + s.duration_us for s in spans)
    nodes = {s.span_id: _node(s, t0_us) for s in page}
    root: dict[str, Any] | None = None
    fragments: list[dict[str, Any]] = []
    for span in page:
        node = nodes[span.span_id]
        parent = nodes.get(span.parent_span_id) if span.parent_span_id else None
        if parent is not None and parent is not node:
            parent["children"].append(node)
        elif span.parent_span_id is None and root is None and after is None:
            root = node
        else:
            fragments.append({"parent_span_id": span.parent_span_id, **node})
    result: dict[str, Any] = {
        "trace_id": trace.trace_id,
        "span_count": len(spans),
        "duration_us": end_us - t0_us,
        "root": root,
        "fragments": fragments,
        "errors": [{"span_id": s.span_id, "service": s.service, "operation": s.operation,
                    "message": s.error_message or "error"} for s in page if s.status == "error"],
        "logs": [],
        "truncated": False,
    }
    if trace.truncated:
        result["trace_truncated"] = True  # the trace itself has more spans than we read
    if args.include_logs and after is None:
        logs = ctx.sources.logs.query_logs(ctx.tenant_id, LogQuery(
            product=None, trace_id=trace.trace_id, start=t0 - timedelta(minutes=1),
            end=t0 + timedelta(microseconds=end_us - t0_us) + timedelta(minutes=1)))
        result["logs"] = [{"ts": isoformat(line.ts), "level": line.level, "host": line.host,
                           "service": line.product, "message": line.message} for line in logs.lines]
    if has_more:
        last = page[-1]
        result["next_cursor"] = cursors(ctx).encode({"s": last.start.isoformat(), "id": last.span_id},
                                                    _bind(args, ctx))
    return result


SPEC = ToolSpec(
    name="get_traces",
    description=(
        "Look up a distributed trace by trace id or correlation (request) id. Returns the span tree with "
        "timings (microseconds from the trace start), tags and errors, 100 spans a page; include_logs adds "
        "the log lines of the trace. Request ids appear as trace_id in get_logs lines."
    ),
    input_model=GetTracesInput,
    run=run,
    category="query",
    redact=("trace_id", "span_count", "duration_us", "root", "fragments", "errors", "logs", "truncated",
            "trace_truncated", "next_cursor"),
    list_field="fragments",
)
