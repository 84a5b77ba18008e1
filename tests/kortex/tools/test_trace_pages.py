"""get_traces pages by bytes as well as by count: every span comes back exactly once whatever
its size, a big first page still has its root, and broken traces (cycles, missing parents)
are reported instead of losing spans."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

from kortex.messages import ToolCall
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from kortex.tools.builtin import get_traces
from kortex.tools.capping import cap_result
from kortex.tools.spec import ToolContext
from tests.conftest import Harness


def _span(i: int, parent: str | None, start: Any, tags: dict | None = None, trace: str = "bigtags01") -> dict:
    return {"trace_id": trace, "span_id": f"s{i:03d}", "parent_span_id": parent, "request_id": None,
            "service": "api", "operation": f"op {i}", "start_ts": start + timedelta(milliseconds=i),
            "duration_us": 1000, "status": "error" if i % 7 == 0 else "ok",
            "error_message": "boom" if i % 7 == 0 else None, "tags": tags or {}}


def _write(h: Harness, tenant: str, spans: list[dict]) -> None:
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "spans", spans)


def _walk(node: dict, seen: list[str]) -> None:
    seen.append(node["span_id"])
    for child in node["children"]:
        _walk(child, seen)


def _all_pages(h: Harness, tenant: str, request_id: str, cap: int) -> tuple[list[str], int]:
    seen: list[str] = []
    cursor, pages = None, 0
    while True:
        result = h.call(tenant, "get_traces", {"request_id": request_id, **({"cursor": cursor} if cursor else {})})
        assert not result.is_error, result.content
        content = result.content
        assert len(json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()) <= cap
        pages += 1
        if content["root"] is not None:
            _walk(content["root"], seen)
        for fragment in content["fragments"]:
            _walk(fragment, seen)
        cursor = content.get("next_cursor")
        if not cursor:
            return seen, pages
        assert pages < 100


def test_big_spans_page_by_bytes_and_none_is_lost(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    tags = {"http.url": "https://api.example.com/" + "x" * 600, "note": "y" * 300}
    spans = [_span(0, None, start, tags)] + [_span(i, "s000" if i <= 20 else f"s{i - 20:03d}", start, tags)
                                            for i in range(1, 300)]
    _write(harness, tenant, spans)
    seen, pages = _all_pages(harness, tenant, "bigtags01", 64 * 1024)
    assert len(seen) == len(set(seen)) == 300 and pages >= 5  # ~1 KB a span: about 60 a page


def test_a_first_page_too_big_for_one_result_keeps_its_root(harness_factory) -> None:
    h = harness_factory(tools={"result_cap_bytes": 8192})
    tenant = h.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    spans = [_span(0, None, start)] + [_span(i, "s000", start, {"sql": "SELECT " + "c, " * 150}) for i in range(1, 100)]
    _write(h, tenant, spans)
    first = h.call(tenant, "get_traces", {"request_id": "bigtags01"}).content
    assert first["root"]["span_id"] == "s000" and 0 < len(first["root"]["children"]) < 99
    assert first["next_cursor"] and first["span_count"] == 100
    seen, pages = _all_pages(h, tenant, "bigtags01", 8192)
    assert sorted(seen) == sorted(s["span_id"] for s in spans) and pages > 5


def test_when_the_cap_still_trims_fragments_the_page_ends_before_the_first_lost_span(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    spans = [_span(0, None, start)] + [_span(i, "s000" if i <= 10 else f"s{i - 10:03d}", start, {"k": "v" * 100})
                                       for i in range(1, 250)]
    _write(harness, tenant, spans)
    first = harness.call(tenant, "get_traces", {"request_id": "bigtags01"}).content
    args = get_traces.GetTracesInput(request_id="bigtags01", cursor=first["next_cursor"])
    ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=None, call_id="c", step=0, now=utcnow(),
                      sources=harness.k.sources, services=dict(harness.k.services))
    raw = get_traces.run(args, ctx)  # sized for 64 KiB: 100 spans in 10 fragments
    assert len(raw["fragments"]) == 10
    capped, truncated = cap_result(raw, get_traces.SPEC, 6000, args, ctx)
    kept = [f["span_id"] for f in capped["fragments"]]
    assert truncated and 0 < len(kept) < 10
    shown: list[str] = []
    for fragment in capped["fragments"]:
        _walk(fragment, shown)
    before: list[str] = []
    _walk(first["root"], before)
    for fragment in first["fragments"]:
        _walk(fragment, before)
    rest: list[str] = []
    cursor = capped["next_cursor"]
    while cursor:  # page on from the cursor the cap left
        content = harness.call(tenant, "get_traces", {"request_id": "bigtags01", "cursor": cursor}).content
        for fragment in content["fragments"]:
            _walk(fragment, rest)
        cursor = content.get("next_cursor")
    page_order = [s for _, s, _ in raw["_order"]]
    lost = [s for s in page_order if s not in shown]
    assert lost and set(lost) <= set(rest)  # what the cap dropped comes on the next pages
    assert page_order[:len(shown)] == sorted(shown, key=page_order.index)  # the page ends at one point
    assert len(before) + len(shown) + len(rest) == len(spans)  # and nothing comes twice
    assert set(before) | set(shown) | set(rest) == {s["span_id"] for s in spans}
    assert {e["span_id"] for e in capped["errors"]} <= set(shown)


def test_cycles_and_missing_parents_are_reported_not_lost(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    spans = [_span(0, None, start, trace="loopy01"), _span(1, "s000", start, trace="loopy01"),
             _span(2, "s003", start, trace="loopy01"), _span(3, "s002", start, trace="loopy01"),  # 2 <-> 3
             _span(4, "s003", start, trace="loopy01"),  # hangs off the cycle
             _span(5, "gone", start, trace="loopy01"), _span(6, "s006", start, trace="loopy01")]  # orphan, self-loop
    _write(harness, tenant, spans)
    content = harness.call(tenant, "get_traces", {"request_id": "loopy01"}).content
    seen: list[str] = []
    _walk(content["root"], seen)
    fragments = {f["span_id"]: f for f in content["fragments"]}
    for fragment in fragments.values():
        _walk(fragment, seen)
    assert sorted(seen) == [f"s{i:03d}" for i in range(7)]
    assert content["cycles"] is True and content["orphans"] == 2
    assert fragments["s002"]["cycle"] is True and fragments["s002"]["parent_span_id"] == "s003"
    assert [c["span_id"] for c in fragments["s002"]["children"]] == ["s003"]
    assert fragments["s005"]["missing_parent"] is True and fragments["s006"]["missing_parent"] is True
    assert get_traces.parents([])[0] == {}


def test_include_logs_shares_the_budget(harness_factory) -> None:
    h = harness_factory(tools={"result_cap_bytes": 8192})
    tenant = h.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    _write(h, tenant, [_span(i, None if i == 0 else "s000", start, trace="logged01") for i in range(20)])
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "logs", [
            {"product": "api", "ts": start + timedelta(milliseconds=i), "level": "info", "severity": 20, "host": "h",
             "message": f"line {i} " + "z" * 400, "trace_id": "logged01", "attrs": None} for i in range(60)])
    result = h.k.pipeline.run(ToolCall(id="c", name="get_traces", arguments={"request_id": "logged01",
                                                                            "include_logs": True}),
                              ToolContext(tenant_id=tenant, session_id=None, turn_id=None, call_id="c", step=0,
                                          now=utcnow(), sources=h.k.sources, services=dict(h.k.services)))
    content = result.content
    assert not result.is_error and content["root"]["span_id"] == "s000"
    assert 0 < len(content["logs"]) < 60 and content["logs_truncated"] is True


MIXED_CASE = [f"{c}{i:03d}" for i in range(60) for c in ("a", "B")]


def _mixed_case_trace(h: Harness, tenant: str) -> None:
    """A root and 120 children that start in the same microsecond, with ids whose case differs:
    a collation other than C sorts them a000, B000, a001..., code points B000..B059, a000..."""
    start = utcnow() - timedelta(minutes=5)
    spans = [{**_span(0, None, start, trace="mixedcase"), "span_id": "root", "status": "ok", "error_message": None}]
    spans += [{**_span(0, "root", start + timedelta(milliseconds=1), trace="mixedcase"), "span_id": span_id,
               "status": "ok", "error_message": None} for span_id in MIXED_CASE]
    _write(h, tenant, spans)


def _pages_of(h: Harness, tenant: str, sources: Any) -> list[str]:
    seen: list[str] = []
    cursor = None
    for step in range(10):
        ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=None, call_id="c1", step=step, now=utcnow(),
                          sources=sources, services=dict(h.k.services))
        args = {"request_id": "mixedcase", **({"cursor": cursor} if cursor else {})}
        result = h.k.pipeline.run(ToolCall(id="c1", name="get_traces", arguments=args), ctx)
        assert not result.is_error, result.content
        if result.content["root"] is not None:
            _walk(result.content["root"], seen)
        for fragment in result.content["fragments"]:
            _walk(fragment, seen)
        cursor = result.content.get("next_cursor")
        if not cursor:
            break
    return seen


def check_mixed_case_span_ids_page_exactly_once(h: Harness) -> None:
    tenant = h.tenant("mixedcase")
    _mixed_case_trace(h, tenant)
    assert sorted(_pages_of(h, tenant, h.k.sources)) == sorted(["root", *MIXED_CASE])
    # The store's own order is the code points' too, so a trace cut at its span limit keeps the first.
    trace = h.k.sources.traces.get_trace(tenant, "mixedcase")
    assert trace is not None and [s.span_id for s in trace.spans] == ["root", *sorted(MIXED_CASE)]


def test_spans_page_once_whatever_order_the_source_sorts_ids_in(harness: Harness) -> None:
    store = harness.k.sources.traces

    class Collated:
        """The store behind a database whose collation ignores case (en_US, ICU)."""

        def get_trace(self, tenant_id: str, request_id: str) -> Any:
            trace = store.get_trace(tenant_id, request_id)
            return None if trace is None else replace(
                trace, spans=sorted(trace.spans, key=lambda s: (s.start, s.span_id.casefold())))

    check_mixed_case_span_ids_page_exactly_once(harness)
    seen = _pages_of(harness, harness.tenant("mixedcase"), replace(harness.k.sources, traces=Collated()))
    assert sorted(seen) == sorted(["root", *MIXED_CASE])
