"""What the output cap leaves must still describe itself: a page of requests counts the requests
it shows, and a metric series keeps its newest points (oldest-first lists keep their tail)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from kortex.telemetry import ingest
from kortex.timeparse import utcnow


def test_a_capped_page_of_requests_tallies_the_requests_it_shows(harness_factory: Any) -> None:
    h = harness_factory(tools={"result_cap_bytes": 4096})
    tenant = h.tenant("acme")
    h.seed(tenant, "noisy-neighbour")
    result = h.call(tenant, "get_recent_requests", {"limit": 100})
    assert not result.is_error and result.truncated
    page = result.content
    rows = page["requests"]
    assert 1 < len(rows) < 100 and page["count"] == len(rows) and page["has_more"]
    assert page["by_status"] == dict(sorted(Counter(r["status"] for r in rows).items()))
    failed = sum(1 for r in rows if r["status"] != "success")
    assert page["failed_pct"] == round(100 * failed / len(rows), 1)
    users = Counter(r["user_id"] for r in rows)
    assert {u["user_id"]: u["count"] for u in page["by_user"]} == dict(
        sorted(users.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
    assert all(u["share_pct"] == round(100 * u["count"] / len(rows), 1) for u in page["by_user"])


def test_capped_metric_series_keep_their_newest_points(harness_factory: Any) -> None:
    whole, capped = harness_factory(), harness_factory(tools={"result_cap_bytes": 2048})
    tenant = whole.tenant("acme")
    now = utcnow()
    with whole.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", [
            {"product": "api", "metric": "depth", "ts": now - timedelta(minutes=m), "value": float(m % 7),
             "unit": None, "labels": {}} for m in range(1, 25 * 60)])
    args = {"product": "api", "metric_name": "depth", "time_range": "last 3h"}
    for tool in ("get_metrics", "compare_to_baseline"):
        full = whole.call(tenant, tool, args, now=now)
        cut = capped.call(tenant, tool, args, now=now)
        assert not full.truncated and cut.truncated, tool
        kept = cut.content["samples"]
        assert 1 < len(kept) < len(full.content["samples"]), tool
        assert kept == full.content["samples"][-len(kept):], tool
