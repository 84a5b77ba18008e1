"""The Loki log source behind get_logs, against a fake Loki (httpx.MockTransport) that
understands the LogQL the source sends."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from kortex.errors import UpstreamError
from kortex.messages import ToolCall
from kortex.telemetry.loki import LokiLogs
from kortex.timeparse import utcnow
from kortex.tools.spec import ToolContext
from tests.conftest import Harness

_MATCHER = re.compile(r'(\w+)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"')
_LINE = re.compile(r'(\|=|!=|\|~|!~)\s*"((?:[^"\\]|\\.)*)"')


class FakeLoki:
    """Streams of (ns, line) per label set; answers query_range (backward) and count_over_time."""

    def __init__(self) -> None:
        self.streams: dict[tuple[tuple[str, str], ...], list[tuple[int, str]]] = {}
        self.requests: list[httpx.Request] = []

    def add(self, labels: dict[str, str], ts: datetime, line: str) -> None:
        key = tuple(sorted(labels.items()))
        self.streams.setdefault(key, []).append((int(ts.timestamp() * 1_000_000) * 1000, line))

    def _select(self, query: str) -> list[tuple[dict[str, str], int, str]]:
        selector, _, rest = query.partition("}")
        matchers = [(k, op, v.replace('\\"', '"')) for k, op, v in _MATCHER.findall(selector)]
        lines = [(op, v.replace('\\"', '"').replace("\\\\", "\\")) for op, v in _LINE.findall(rest)]
        out = []
        for key, entries in self.streams.items():
            labels = dict(key)
            ok = True
            for k, op, v in matchers:
                value = labels.get(k, "")
                hit = value == v if op in ("=", "!=") else re.fullmatch(v, value) is not None
                ok &= hit if op in ("=", "=~") else not hit
            for ns, text in entries:
                keep = ok
                for op, v in lines:
                    hit = v in text if op in ("|=", "!=") else re.search(v, text) is not None
                    keep &= hit if op in ("|=", "|~") else not hit
                if keep:
                    out.append((labels, ns, text))
        return out

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        params = dict(request.url.params)
        if request.url.path == "/loki/api/v1/query":
            inner = re.fullmatch(r"sum\(count_over_time\((.*)\[(\d+)s\]\)\)", params["query"])
            assert inner, params["query"]
            at, span = int(params["time"]), int(inner.group(2)) * 1_000_000_000
            count = sum(1 for _, ns, _ in self._select(inner.group(1)) if at - span < ns <= at)
            return httpx.Response(200, json={"status": "success", "data": {
                "resultType": "vector", "result": [{"metric": {}, "value": [at / 1e9, str(count)]}] if count else []}})
        start, end, limit = int(params["start"]), int(params["end"]), int(params["limit"])
        assert params["direction"] == "backward"
        hits = sorted((h for h in self._select(params["query"]) if start <= h[1] < end), key=lambda h: -h[1])[:limit]
        streams: dict[str, dict[str, Any]] = {}
        for labels, ns, text in hits:
            entry = streams.setdefault(json.dumps(labels, sort_keys=True), {"stream": labels, "values": []})
            entry["values"].append([str(ns), text])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "streams",
                                                                         "result": list(streams.values())}})


def sent_query(fake: FakeLoki, index: int) -> str:
    """The LogQL of the index-th query_range request the source sent."""
    ranges = [r for r in fake.requests if r.url.path.endswith("query_range")]
    return str(dict(ranges[index].url.params)["query"])


@pytest.fixture
def loki(harness: Harness) -> FakeLoki:
    fake = FakeLoki()
    harness.k.sources.logs = LokiLogs("http://loki:3100", transport=httpx.MockTransport(fake))
    return fake


def test_get_logs_pages_through_loki_without_gaps_or_repeats(harness: Harness, loki: FakeLoki) -> None:
    tenant = harness.tenant("acme")
    now = utcnow()
    for i in range(250):
        level = "error" if i % 3 == 0 else "info"
        # pairs of lines share a timestamp: the keyset must still keep both
        loki.add({"product": "checkout", "level": level, "host": f"h{i % 2}"}, now - timedelta(seconds=i // 2 + 1),
                 f"request {i} {'failed: timeout' if level == 'error' else 'ok'}")
    loki.add({"product": "payments", "level": "error", "host": "p"}, now - timedelta(seconds=5), "other product")
    lines, pages = harness.page_through(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h",
                                                             "level": "error", "limit": 30}, "lines")
    messages = [line["message"] for line in lines]
    assert len(messages) == len(set(messages)) == 84 and pages == 3
    assert all(line["level"] == "error" and "failed" in line["message"] for line in lines)
    first = harness.call(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h", "level": "error"})
    assert first.content["total_matches"] == 84
    assert all(r.headers["X-Scope-OrgID"] == tenant for r in loki.requests)  # Loki's tenant is ours
    sent = [dict(r.url.params)["query"] for r in loki.requests if r.url.path.endswith("query_range")]
    assert sent[0] == '{product="checkout",level=~"error|fatal"}'
    filtered = harness.call(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h",
                                                 "query": '{host="h1"} |= "failed" != "request 3 "'}).content
    assert filtered["lines"] and all(line["host"] == "h1" for line in filtered["lines"])
    plain = harness.call(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h", "query": "TIMEOUT"})
    assert plain.content["total_matches"] == 84  # plain text ignores case here too, as a (?i) regex
    assert sent_query(loki, -1).endswith('|~ "(?i)TIMEOUT"')


def test_loki_failures_are_upstream_errors(harness: Harness) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="ingester not ready")

    source = LokiLogs("http://loki:3100", transport=httpx.MockTransport(down))
    with pytest.raises(UpstreamError, match="503"):
        from kortex.telemetry.sources import LogQuery

        source.query_logs("t", LogQuery(product="p", start=datetime(2026, 1, 1, tzinfo=UTC),
                                        end=datetime(2026, 1, 2, tzinfo=UTC)))
    harness.k.sources.logs = source
    tenant = harness.tenant("acme")
    ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=None, call_id="c", step=0, now=utcnow(),
                      sources=harness.k.sources, services=dict(harness.k.services))
    result = harness.k.pipeline.run(ToolCall(id="c", name="get_logs",
                                             arguments={"product": "p", "time_range": "last 1h"}), ctx)
    assert result.error_code == "upstream" and result.content["code"] == "UPSTREAM_ERROR"
