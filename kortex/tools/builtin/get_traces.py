"""get_traces: a distributed trace by trace or correlation id, as a span tree (rfc-005 §6.2.3).

Spans are paged in start order: at most 100 a page, and no more than fit the output cap
(``ToolContext.result_cap_bytes``, measured as the model will see them). The first page holds
the root; a later page holds its spans as ``fragments``: subtrees whose parent was on an
earlier page. The cursor continues after the last span actually returned, so every span is
returned once, whatever their size (if the output cap still trims a page, the trees it keeps
lose their spans past the first one it dropped, so the next page holds them all).

Broken traces are reported, never dropped: a span whose parent is not in the trace is a
fragment marked ``missing_parent`` (counted in ``orphans``); parent links that form a cycle
are cut at the cycle's earliest span, which becomes a fragment marked ``cycle`` (and the trace
``cycles: true``).

Deep traces are flattened, never cut short: each level of the tree nests its spans two levels
deeper in the result, and a tool result may nest at most ``MAX_RESULT_DEPTH`` (128) levels (a
page of 100 spans in a chain nested over 200, past what can be published). A span more than
``TREE_DEPTH`` levels below the top of its tree starts a fragment of its own, marked
``too_deep``, under its ``parent_span_id``. Tags stored before
ingest bounded their depth are shown to ``MAX_DEPTH`` levels, deeper values replaced by a note."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import Field

from kortex.errors import NotFound
from kortex.nesting import MAX_DEPTH, deeper_than
from kortex.redaction import scrub
from kortex.telemetry.sources import LogQuery, Span
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Cursor, Identifier, cursors, decode_time
from kortex.tools.capping import encoded_size
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

PAGE = 100
_PER_SPAN = 96    # bytes a span costs beyond its own fields: nesting, commas, a fragment's parent id
_RESERVE = 1024   # the rest of the result: ids, counts, flags, the cursor
#: levels of spans in one tree of a page: a fragment under the root's children at the deepest
#: nests 2 * 32 + 1 levels, its tags (at most ``MAX_DEPTH``) 33 more, 97 in all, under the
#: pipeline's ``MAX_RESULT_DEPTH`` of 128. Real call chains are rarely that deep.
TREE_DEPTH = 32
_DEEPER = f"…[nested deeper than {MAX_DEPTH} levels; not shown]"


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
        "status": span.status, "tags": _clipped(span.tags), "children": [],
    }
    if span.error_message:
        node["error"] = span.error_message
    return node


def _clipped(tags: Any) -> Any:
    """``tags`` as they are when they nest at most ``MAX_DEPTH`` levels (ingest allows no more);
    else a copy whose containers past that depth are a note."""
    return _cut(tags, MAX_DEPTH) if deeper_than(tags, MAX_DEPTH) else tags


def _cut(value: Any, levels: int) -> Any:
    """``value`` with its containers more than ``levels`` deep replaced (recursion bounded by it)."""
    if not isinstance(value, dict | list | tuple):
        return value
    if levels == 0:
        return _DEEPER
    if isinstance(value, dict):
        return {k: _cut(v, levels - 1) for k, v in value.items()}
    return [_cut(v, levels - 1) for v in value]


def _error(span: Span) -> dict[str, Any]:
    return {"span_id": span.span_id, "service": span.service, "operation": span.operation,
            "message": span.error_message or "error"}


def parents(spans: list[Span]) -> tuple[dict[str, str | None], set[str], set[str]]:
    """Each span's parent within the trace, with cycles cut; and the spans whose link was cut
    (one per cycle, its earliest) and those whose parent is missing from the trace."""
    ids = {s.span_id for s in spans}
    parent: dict[str, str | None] = {}
    orphans: set[str] = set()
    for s in spans:
        if s.parent_span_id is None or s.parent_span_id == s.span_id:
            parent[s.span_id] = None
            if s.parent_span_id == s.span_id:
                orphans.add(s.span_id)  # its own parent: nothing to hang it on
        elif s.parent_span_id in ids:
            parent[s.span_id] = s.parent_span_id
        else:
            parent[s.span_id] = None
            orphans.add(s.span_id)
    order = {s.span_id: (s.start, s.span_id) for s in spans}
    cut: set[str] = set()
    state: dict[str, int] = {}  # 1: on the current path, 2: known to reach a root
    for s in spans:
        path: list[str] = []
        current: str | None = s.span_id
        while current is not None and state.get(current) is None:
            state[current] = 1
            path.append(current)
            current = parent[current]
        if current is not None and state.get(current) == 1:  # walked into the path: a cycle
            loop = path[path.index(current):]
            first = min(loop, key=lambda i: order[i])
            parent[first] = None
            cut.add(first)
        for i in path:
            state[i] = 2
    return parent, cut, orphans


def _too_deep(page: list[Span], parent: dict[str, str | None]) -> set[str]:
    """The spans of ``page`` whose parent is on it but which start a fragment of their own, being
    ``TREE_DEPTH`` levels below the top of their tree (a top: the root, a fragment, or a span
    cut so); without a recursion, for a chain of any length."""
    on_page = {s.span_id for s in page}
    level: dict[str, int] = {}
    cut: set[str] = set()
    for span in page:
        path: list[str] = []
        current: str | None = span.span_id
        while current is not None and current not in level:
            path.append(current)
            up = parent[current]
            current = up if up in on_page else None
        base = level[current] if current is not None else 0
        for span_id in reversed(path):  # from the highest on down
            base = base + 1 if base < TREE_DEPTH else 1
            if base == 1 and parent[span_id] in on_page:
                cut.add(span_id)
            level[span_id] = base
    return cut


def _page(remaining: list[Span], budget: int, t0_us: int) -> list[Span]:
    """The longest prefix of ``remaining`` (at most PAGE spans, at least one) within ``budget``."""
    page: list[Span] = []
    used = 0
    for span in remaining[:PAGE]:
        cost = encoded_size(scrub(_node(span, t0_us))) + _PER_SPAN
        if span.status == "error":
            cost += encoded_size(scrub(_error(span)))
        if page and used + cost > budget:
            break
        page.append(span)
        used += cost
    return page


def _logs(args: GetTracesInput, ctx: ToolContext, trace_id: str, t0: Any, span_us: int,
          budget: int) -> tuple[list[dict[str, Any]], bool]:
    found = ctx.sources.logs.query_logs(ctx.tenant_id, LogQuery(
        product=None, trace_id=trace_id, start=t0 - timedelta(minutes=1),
        end=t0 + timedelta(microseconds=span_us) + timedelta(minutes=1)))
    lines: list[dict[str, Any]] = []
    used = 0
    for line in found.lines:
        entry = {"ts": isoformat(line.ts), "level": line.level, "host": line.host, "service": line.product,
                 "message": line.message}
        used += encoded_size(scrub(entry)) + 1
        if used > budget:
            return lines, True
        lines.append(entry)
    return lines, found.has_more


def run(args: GetTracesInput, ctx: ToolContext) -> dict[str, Any]:
    trace = ctx.sources.traces.get_trace(ctx.tenant_id, args.request_id)
    if trace is None or not trace.spans:
        raise NotFound(f"no trace has id or correlation id {args.request_id!r}")
    # The cursor compares (start, span_id) as Python does: page in that very order, whatever
    # order (a database collation) the source returned them in.
    spans = sorted(trace.spans, key=lambda s: (s.start, s.span_id))
    after = None
    if args.cursor:
        pos = cursors(ctx).decode(args.cursor, _bind(args, ctx))
        after = (decode_time(pos.get("s")), str(pos.get("id")))
    remaining = [s for s in spans if after is None or (s.start, s.span_id) > after]
    t0 = min(s.start for s in spans)
    t0_us = int(t0.timestamp() * 1_000_000)
    end_us = max(int(s.start.timestamp() * 1_000_000) + s.duration_us for s in spans)
    if trace.ends_at is not None:  # the trace goes on past the spans read: its end is the source's
        end_us = max(end_us, int(trace.ends_at.timestamp() * 1_000_000))
    parent, cut, orphans = parents(spans)
    budget = ctx.result_cap_bytes - _RESERVE
    logs: list[dict[str, Any]] = []
    logs_cut = False
    if args.include_logs and after is None:  # the logs may have half of the page, the spans the rest
        logs, logs_cut = _logs(args, ctx, trace.trace_id, t0, end_us - t0_us, budget // 2)
        budget -= encoded_size(scrub(logs))
    page = _page(remaining, budget, t0_us)
    has_more = len(remaining) > len(page)

    nodes = {s.span_id: _node(s, t0_us) for s in page}
    deep = _too_deep(page, parent)
    root: dict[str, Any] | None = None
    tops: list[tuple[Span, dict[str, Any]]] = []
    for span in page:
        node = nodes[span.span_id]
        up = parent[span.span_id]
        if up is not None and up in nodes and span.span_id not in deep:
            nodes[up]["children"].append(node)
        elif up is None and span.parent_span_id is None and root is None and after is None:
            root = node
            tops.append((span, node))
        else:
            tops.append((span, node))
    top_ids = {span.span_id for span, _ in tops}

    def top_of(span_id: str) -> str:
        while span_id not in top_ids:
            span_id = parent[span_id]  # type: ignore[assignment]  # a non-top span's parent is on the page
        return span_id

    # Fragments in the order their first span comes: the first span of the page is then in the
    # root tree or the first fragment, which the output cap always keeps.
    first_at: dict[str, int] = {}
    for i, span in enumerate(page):
        first_at.setdefault(top_of(span.span_id), i)
    fragments: list[dict[str, Any]] = []
    group: dict[str, int] = {}  # top span id -> -1 (the root tree) or its fragment's index
    for span, node in sorted(tops, key=lambda t: first_at[t[0].span_id]):
        if node is root:
            group[span.span_id] = -1
            continue
        marks: dict[str, Any] = {"parent_span_id": span.parent_span_id}
        if span.span_id in cut:
            marks["cycle"] = True
        if span.span_id in orphans:
            marks["missing_parent"] = True
        if span.span_id in deep:
            marks["too_deep"] = True
        group[span.span_id] = len(fragments)
        fragments.append({**marks, **node})

    result: dict[str, Any] = {
        "trace_id": trace.trace_id,
        "span_count": trace.span_total or len(spans),  # the whole trace's, as duration_us
        "duration_us": end_us - t0_us,
        "root": root,
        "fragments": fragments,
        "errors": [_error(s) for s in page if s.status == "error"],
        "logs": logs,
        "truncated": False,
        # emission order and the group of each span, for on_truncate
        "_order": [(s.start.isoformat(), s.span_id, group[top_of(s.span_id)]) for s in page],
    }
    if cut:
        result["cycles"] = True
    if orphans:
        result["orphans"] = len(orphans)
    if logs_cut:
        result["logs_truncated"] = True
    if trace.truncated:
        result["trace_truncated"] = True  # the trace itself has more spans than we read
        result["note"] = (f"only the first {len(spans)} of {result['span_count']} spans (by start time) are "
                          "returned, over all pages; span_count and duration_us cover the whole trace")
    if has_more:
        last = page[-1]
        result["next_cursor"] = _cursor(args, ctx, last.start.isoformat(), last.span_id)
    return result


def _cursor(args: GetTracesInput, ctx: ToolContext, start: str, span_id: str) -> str:
    return cursors(ctx).encode({"s": start, "id": span_id}, _bind(args, ctx))


def _without(node: dict[str, Any], late: set[str]) -> dict[str, Any]:
    """``node`` (copied, never changed in place) without the subtrees of ``late`` spans."""
    children = [_without(c, late) for c in node["children"] if c["span_id"] not in late]
    return {**node, "children": children}


def _ids(node: dict[str, Any], into: set[str]) -> set[str]:
    into.add(node["span_id"])
    for child in node["children"]:
        _ids(child, into)
    return into


def on_truncate(result: dict[str, Any], args: GetTracesInput, kept: int, ctx: ToolContext) -> dict[str, Any]:
    """The output cap dropped fragments from ``kept`` on. The page then ends just before the
    first span they held: kept trees lose their spans that come after it (those come on the
    next page, from the cursor), so every span is returned once."""
    order = result.get("_order") or []
    first_dropped = next((i for i, (_, _, g) in enumerate(order) if g >= kept), None)
    if not first_dropped:
        return result
    late = {span_id for _, span_id, g in order[first_dropped:] if g < kept}
    trees = ([result["root"]] if result.get("root") else []) + list(result["fragments"][:kept])
    early = {span_id for _, span_id, _ in order[:first_dropped]}
    # A span that starts before its parent (clock skew) would go with the parent's subtree
    # and be lost behind the cursor: then the page keeps its trees whole and those spans repeat.
    if not any(_subtrees(t, late) & early for t in trees):
        if result.get("root"):
            result["root"] = _without(result["root"], late)
        result["fragments"] = [_without(f, late) for f in result["fragments"][:kept] if f["span_id"] not in late]
        result["errors"] = [e for e in result.get("errors", []) if e["span_id"] in early]
    start, span_id, _ = order[first_dropped - 1]
    result["next_cursor"] = _cursor(args, ctx, start, span_id)
    return result


def _subtrees(node: dict[str, Any], late: set[str]) -> set[str]:
    """Every span under (and including) a ``late`` span of ``node``'s tree."""
    if node["span_id"] in late:
        return _ids(node, set())
    found: set[str] = set()
    for child in node["children"]:
        found |= _subtrees(child, late)
    return found


SPEC = ToolSpec(
    name="get_traces",
    description=(
        "Look up a distributed trace by trace id or correlation (request) id. Returns the span tree with "
        "timings (microseconds from the trace start), tags and errors, up to 100 spans a page; include_logs adds "
        "the log lines of the trace. When next_cursor is present, call again with the same arguments plus cursor "
        "for the next spans. Spans nested more than 32 levels deep continue as fragments (too_deep) under their "
        "parent_span_id. Request ids appear as trace_id in get_logs lines."
    ),
    input_model=GetTracesInput,
    run=run,
    category="query",
    redact=("trace_id", "span_count", "duration_us", "root", "fragments", "errors", "logs", "truncated",
            "trace_truncated", "cycles", "orphans", "logs_truncated", "next_cursor", "note"),
    list_field="fragments",
    on_truncate=on_truncate,
)
