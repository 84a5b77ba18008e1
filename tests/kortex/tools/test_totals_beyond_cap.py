"""The figures a model quotes (totals, counts, averages) describe everything that matched, even
when the rows beside them were cut to a cap; and a cut result says so. The checks run here on
SQLite and on PostgreSQL in tests/integration/test_totals_beyond_cap_pg.py."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from kortex.storage.schema import llm_requests
from kortex.telemetry import embedded, embedded_llmops, ingest
from kortex.timeparse import utcnow
from kortex.tools.builtin import get_active_incidents, get_deployment_status
from kortex.tools.builtin.common import percentile
from tests.conftest import Harness

DEPLOYMENTS = ("gpt-4/aws", "gpt-4/azure", "llama-70b/k8s")
TIERS = ("premium", "standard", "budget")


@pytest.fixture
def h(harness: Harness) -> Harness:
    """SQLite here; tests/integration/test_totals_beyond_cap_pg.py runs the same tests on PostgreSQL."""
    return harness


def _tenant(h: Harness, name: str) -> str:
    return h.tenant(f"{name}-{uuid.uuid4().hex[:8]}")  # a database of its own or not


def _requests(h: Harness, tenant: str, now: datetime, hours: int = 6, per_bucket: int = 9) -> int:
    """``per_bucket`` requests per hour and deployment over the last ``hours`` hours; the older
    hours are the slower ones, so figures over the newest hours alone differ from the whole."""
    rows: list[dict[str, Any]] = []
    for hour in range(hours):
        at = now - timedelta(hours=hour, minutes=20)
        for d, deployment in enumerate(DEPLOYMENTS):
            for i in range(per_bucket):
                rows.append({
                    "request_id": f"r-{hour}-{d}-{i}", "user_id": f"u{i % 4}", "user_tier": TIERS[(i + d) % 3],
                    "deployment_id": deployment, "model_id": deployment.split("/")[0],
                    "backend_id": deployment.split("/")[1], "cost_usd": 0.001 * (1 + i + hour),
                    "latency_ms": 100 * (hour + 1) + 37 * i + 11 * d,
                    "status": "error" if (i + hour) % 5 == 0 else "success",
                    "created_at": at + timedelta(microseconds=i)})  # all in one hour
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "llm-requests", ingest.validate_batch("llm-requests", rows, now=now))
    return len(rows)


def _db_totals(h: Harness, tenant: str, start: datetime, end: datetime) -> dict[str, tuple[int, float]]:
    t = llm_requests
    with h.k.db.connect() as conn:
        rows = conn.execute(select(t.c.user_tier, func.count(), func.sum(t.c.cost_usd))
                            .where(t.c.tenant_id == tenant, t.c.created_at >= start, t.c.created_at < end)
                            .group_by(t.c.user_tier)).all()
    return {r[0]: (int(r[1]), round(float(r[2]), 6)) for r in rows}


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_request_volume_totals_cover_the_whole_window(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = _tenant(h, "volume")
    now = utcnow()
    _requests(h, tenant, now)
    args = {"group_by": "tier", "since": "last 6h", "granularity": "hour"}
    whole = h.call(tenant, "get_request_volume", args, now=now).content
    assert whole["truncated"] is False and "note" not in whole and len(whole["data"]) >= 15
    monkeypatch.setattr(embedded_llmops, "MAX_VOLUME_ROWS", 7)
    cut = h.call(tenant, "get_request_volume", args, now=now)
    content = cut.content
    assert cut.truncated and content["truncated"] is True and 0 < len(content["data"]) < len(whole["data"])
    expected = _db_totals(h, tenant, _ts(content["since"]), _ts(content["until"]))
    assert {g: (t["requests"], t["cost_usd"]) for g, t in content["totals"].items()} == expected
    assert content["totals"] == whole["totals"]
    assert "whole window" in content["note"] and content["data"][0]["period"] in content["note"]
    assert content["data"] == whole["data"][-len(content["data"]):]  # the newest periods, each one whole


def test_latency_trend_summary_covers_every_request(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = _tenant(h, "latency")
    now = utcnow()
    seeded = _requests(h, tenant, now)
    args = {"since": "last 6h", "granularity": "hour"}
    whole = h.call(tenant, "get_latency_trends", args, now=now).content
    assert whole["truncated"] is False and whole["summary"]["total_requests"] == seeded
    assert len(whole["data"]) == 6 * len(DEPLOYMENTS)
    monkeypatch.setattr(embedded_llmops, "MAX_TREND_ROWS", 7)
    cut = h.call(tenant, "get_latency_trends", args, now=now)
    content = cut.content
    assert cut.truncated and content["truncated"] is True and 0 < len(content["data"]) < len(whole["data"])
    assert content["summary"] == whole["summary"]  # every request, every period: not the newest ones alone
    assert content["data"][0]["period"] in content["note"] and "every request" in content["note"]
    assert content["data"] == whole["data"][-len(content["data"]):]  # the newest periods, each one whole


def test_latency_buckets_are_those_of_their_requests(h: Harness) -> None:
    """The database picks the latencies either side of each percentile: the same figures as
    interpolating over every latency of the bucket."""
    tenant = _tenant(h, "buckets")
    now = utcnow()
    _requests(h, tenant, now, hours=3, per_bucket=23)
    t = llm_requests
    with h.k.db.connect() as conn:
        rows = conn.execute(select(t.c.created_at, t.c.deployment_id, t.c.latency_ms, t.c.status)
                            .where(t.c.tenant_id == tenant)).all()
    trend = h.call(tenant, "get_latency_trends", {"since": "last 6h", "granularity": "hour"}, now=now).content
    assert len(trend["data"]) == 3 * len(DEPLOYMENTS)
    for bucket in trend["data"]:
        hour = _ts(bucket["period"])
        mine = [r for r in rows if r.deployment_id == bucket["deployment_id"]
                and hour <= r.created_at < hour + timedelta(hours=1)]
        latencies = sorted(float(r.latency_ms) for r in mine)
        assert bucket["request_count"] == len(mine) == 23
        assert bucket["latency_p50_ms"] == pytest.approx(percentile(latencies, 0.5), abs=0.051)
        assert bucket["latency_p95_ms"] == pytest.approx(percentile(latencies, 0.95), abs=0.051)
        assert bucket["error_rate"] == round(sum(r.status != "success" for r in mine) / len(mine), 4)


def test_deployment_summary_counts_every_deployment(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = _tenant(h, "fleet")
    now = utcnow()
    statuses = ("healthy", "degraded", "healthy", "down", "healthy")
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "llm-deployments", ingest.validate_batch("llm-deployments", [
            {"deployment_id": f"m{i}/b{i}", "model_id": f"m{i}", "backend_id": f"b{i}", "status": status,
             "updated_at": now} for i, status in enumerate(statuses)], now=now))
    whole = h.call(tenant, "get_deployment_status", {}).content
    assert whole["summary"] == {"total": 5, "healthy": 3, "degraded": 1, "down": 1}
    monkeypatch.setattr(get_deployment_status, "MAX_DEPLOYMENTS", 2)
    cut = h.call(tenant, "get_deployment_status", {})
    assert cut.truncated and [d["id"] for d in cut.content["deployments"]] == ["m0/b0", "m1/b1"]
    assert cut.content["summary"] == whole["summary"]
    assert "2 of 5" in cut.content["note"]
    down = h.call(tenant, "get_deployment_status", {"status": "healthy"}).content
    assert down["summary"] == {"total": 3, "healthy": 3, "degraded": 0, "down": 0}


def test_active_incident_count_is_every_open_one(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = _tenant(h, "incidents")
    now = utcnow()
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "incidents", ingest.validate_batch("incidents", [
            {"ref": f"INC-{i}", "title": f"trouble {i}", "opened_at": now - timedelta(minutes=60 - i),
             "closed_at": now - timedelta(minutes=1) if i == 3 else None, "target_type": "backend",
             "target_id": "aws" if i % 2 else "k8s"} for i in range(4)], now=now))
    whole = h.call(tenant, "get_active_incidents", {}).content
    assert whole["count"] == 3 and "truncated" not in whole
    monkeypatch.setattr(get_active_incidents, "MAX_INCIDENTS", 1)
    cut = h.call(tenant, "get_active_incidents", {})
    assert cut.truncated and [i["id"] for i in cut.content["incidents"]] == ["INC-2"]
    assert cut.content["count"] == 3 and "1 of 3" in cut.content["note"]
    k8s = h.call(tenant, "get_active_incidents", {"target_id": "k8s"}).content
    assert k8s["count"] == 2 and len(k8s["incidents"]) == 1


def test_trace_span_count_and_duration_cover_every_span(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = _tenant(h, "traces")
    # Whole seconds: get_traces reads times as float timestamps, exact for these.
    start = utcnow().replace(microsecond=0) - timedelta(minutes=10)
    spans = [{"trace_id": "longtrace1", "span_id": f"s{i:03d}", "parent_span_id": None if i == 0 else "s000",
              "service": "api", "operation": f"op {i}", "start": start + timedelta(milliseconds=10 * i),
              "duration_us": 2_000_000 if i == 0 else 1_000 + 7 * i} for i in range(30)]
    spans.append({**spans[-1], "span_id": "s999", "start": start + timedelta(seconds=1), "duration_us": 5_000_000})
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "spans", ingest.validate_batch("spans", spans, now=utcnow()))
    whole = h.call(tenant, "get_traces", {"request_id": "longtrace1"}).content
    assert whole["span_count"] == 31 and whole["duration_us"] == 6_000_000 and "trace_truncated" not in whole
    monkeypatch.setattr(embedded, "MAX_TRACE_SPANS", 10)
    cut = h.call(tenant, "get_traces", {"request_id": "longtrace1"}).content
    assert cut["trace_truncated"] is True
    assert cut["span_count"] == 31 and cut["duration_us"] == 6_000_000
    assert "10 of 31" in cut["note"]
    # The source's end is exact to the microsecond (SQLite keeps the fraction as text).
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "spans", ingest.validate_batch("spans", [
            {**spans[-1], "span_id": "s998", "start": start + timedelta(seconds=2, microseconds=654321)}],
            now=utcnow()))
    trace = h.k.sources.traces.get_trace(tenant, "longtrace1")
    assert trace is not None and trace.truncated and trace.span_total == 32
    assert trace.ends_at == start + timedelta(seconds=7, microseconds=654321)


def test_recent_requests_count_every_match_beside_the_page(h: Harness) -> None:
    tenant = _tenant(h, "requests")
    now = utcnow()
    seeded = _requests(h, tenant, now)
    args = {"since": "last 6h", "limit": 10}
    first = h.call(tenant, "get_recent_requests", args, now=now).content
    assert first["count"] == 10 and first["has_more"] and first["total_matches"] == seeded
    assert sum(first["by_status"].values()) == 10  # the tallies stay the page's
    aws = h.call(tenant, "get_recent_requests", {**args, "deployment_id": "gpt-4/aws", "status": "error"},
                 now=now).content
    t = llm_requests
    with h.k.db.connect() as conn:
        expected = conn.scalar(select(func.count()).select_from(t).where(
            t.c.tenant_id == tenant, t.c.deployment_id == "gpt-4/aws", t.c.status == "error"))
    assert aws["total_matches"] == expected > 0
    later = h.call(tenant, "get_recent_requests", {**args, "cursor": first["next_cursor"]}, now=now).content
    assert later["total_matches"] == seeded and later["requests"][0]["id"] != first["requests"][0]["id"]
