"""The tools' SQL on real PostgreSQL: LogQL filters, ranking and keyset paging, time buckets,
upserts. (The unit tests run the same tools on SQLite.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest

from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from tests.conftest import Harness, make_settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A container on the test database with the default tool policy (every tool)."""
    h = Harness(make_settings(tmp_path_factory.mktemp("pg-tools"), pg_url))
    yield h
    h.close()


@pytest.fixture(scope="module")
def service(pg: Harness) -> str:
    tenant = pg.tenant(f"pg-service-{uuid.uuid4().hex[:6]}")
    pg.seed(tenant, "checkout-deploy-regression")
    return tenant


@pytest.fixture(scope="module")
def platform(pg: Harness) -> str:
    tenant = pg.tenant(f"pg-platform-{uuid.uuid4().hex[:6]}")
    pg.seed(tenant, "noisy-neighbour")
    return tenant


def test_logql_and_traces(pg: Harness, service: str) -> None:
    # One fixed window for every call: with "last 3h" a line could leave it between two calls.
    now = utcnow()
    base = {"product": "checkout", "time_range": f"{(now - timedelta(hours=3)).isoformat()}/{now.isoformat()}"}
    exact = pg.call(service, "get_logs", {**base, "query": '|= "POOL"'}).content
    pool = pg.call(service, "get_logs", {**base, "query": '|= "pool" != "waiting"'}).content
    assert exact["total_matches"] == 0 and pool["total_matches"] == 3
    regex = pg.call(service, "get_logs", {**base, "query": '{host=~"checkout-7d9f-[12]"} |~ "took [0-9]{4}ms"'})
    assert regex.content["total_matches"] > 0
    assert {line["host"] for line in regex.content["lines"]} <= {"checkout-7d9f-1", "checkout-7d9f-2"}
    lines, _ = pg.page_through(service, "get_logs", {**base, "level": "error", "limit": 50}, "lines")
    assert len(lines) == len({(line["ts"], line["message"]) for line in lines}) > 100
    grouped = pg.call(service, "get_logs", {**base, "level": "error", "group": True}).content
    assert grouped["grouped_all"] and grouped["grouped_lines"] == len(lines)  # paged by keyset, none twice
    assert sum(t["count"] for t in grouped["templates"]) == len(lines)
    trace = pg.call(service, "get_traces", {"request_id": lines[0]["trace_id"], "include_logs": True}).content
    assert trace["span_count"] == 3 and len(trace["logs"]) == 1
    history, pages = pg.page_through(service, "get_incident_history", {"query": "pool exhausted", "limit": 1},
                                     "incidents")
    assert history[0]["id"] == "INC-0981" and pages == len(history)
    baseline = pg.call(service, "compare_to_baseline", {"product": "checkout", "time_range": "last 3h",
                                                        "metric_name": "http_request_duration_seconds_p99"})
    assert baseline.content["anomaly_count"] > 30
    step = baseline.content["change_point"]
    assert step["direction"] == "up" and step["before_samples"] > step["after_samples"] > 3


def test_llm_ops_aggregates(pg: Harness, platform: str) -> None:
    volume = pg.call(platform, "get_request_volume", {"group_by": "tier", "since": "last 3h",
                                                      "granularity": "hour"}).content
    assert volume["data"] and all(r["period"].endswith(":00:00.000Z") for r in volume["data"])
    daily = pg.call(platform, "get_request_volume", {"group_by": "deployment", "since": "2 days ago"}).content
    assert all(len(r["period"]) == 10 for r in daily["data"])
    assert sum(t["requests"] for t in daily["totals"].values()) == sum(r["request_count"] for r in daily["data"])
    trends = pg.call(platform, "get_latency_trends", {"deployment_id": "llama-70b/k8s", "since": "last 6h"})
    recent = trends.content["data"][-2:]  # the onset, 50 minutes ago, is in one of the last two hours
    assert max(r["latency_p95_ms"] for r in recent) > 3 * trends.content["data"][1]["latency_p95_ms"]
    quality = pg.call(platform, "get_quality_summary", {"model_id": "llama-70b"}).content["data"]
    assert {r["task_type"] for r in quality} >= {"summarization", "chat"}
    requests, pages = pg.page_through(platform, "get_recent_requests", {"deployment_id": "llama-70b/k8s",
                                                                        "since": "30 minutes ago", "limit": 100},
                                      "requests")
    assert len(requests) == len({r["id"] for r in requests}) > 500 and pages > 5
    page = pg.call(platform, "get_recent_requests", {"deployment_id": "llama-70b/k8s", "since": "1 hour ago",
                                                     "limit": 100}).content
    assert page["by_user"][0]["user_id"] == "globex-batch" and sum(page["by_status"].values()) == page["count"]
    user = pg.call(platform, "get_user_context", {"user_id": "globex-batch"}).content["user"]
    assert user["requests_today"] > 0 and user["tier"] == "budget"


def test_ingest_upserts_and_deduplicates_on_postgres(pg: Harness) -> None:
    tenant = pg.tenant(f"pg-ingest-{uuid.uuid4().hex[:6]}")
    now = utcnow()
    incident = {"ref": "INC-1", "product": None, "title": "first title", "severity": "warn", "opened_at": now,
                "closed_at": None, "findings": "", "resolution": "", "target_type": "backend", "target_id": "aws"}
    span = {"trace_id": "t", "span_id": "s", "parent_span_id": None, "request_id": None, "service": "api",
            "operation": "GET /", "start_ts": now - timedelta(seconds=5), "duration_us": 10, "status": "ok",
            "error_message": None, "tags": {}}
    with pg.k.db.begin() as conn:
        ingest.write(conn, tenant, "incidents", [incident])
        ingest.write(conn, tenant, "incidents", [{**incident, "title": "second title", "closed_at": now}])
        ingest.write(conn, tenant, "spans", [span, span])
    found = pg.call(tenant, "get_incident_history", {"query": "title"}).content["incidents"]
    assert [(i["id"], i["title"], i["status"]) for i in found] == [("INC-1", "second title", "closed")]
    assert pg.call(tenant, "get_active_incidents", {}).content["count"] == 0
    assert pg.call(tenant, "get_traces", {"request_id": "t"}).content["span_count"] == 1


@pytest.mark.timeout(90)
def test_regexes_on_postgres_backtracking_and_patterns_it_rejects(pg: Harness) -> None:
    from tests.kortex.tools.test_service_tools import BACKTRACKERS, write_backtrack_bait

    tenant = pg.tenant(f"pg-regex-{uuid.uuid4().hex[:6]}")
    write_backtrack_bait(pg, tenant)
    base = {"product": "p", "time_range": "last 1h"}
    for pattern, expected in BACKTRACKERS.items():
        result = pg.call(tenant, "get_logs", {**base, "query": f"|~ `{pattern}`"})
        assert not result.is_error and result.content["total_matches"] == expected, (pattern, result.content)
    hosts = pg.call(tenant, "get_logs", {**base, "query": '{host=~`(?i)XYLO.*`}'}).content
    assert [line["host"] for line in hosts["lines"]] == ["xylophone"]
    # \b is a word boundary in RE2 (and on SQLite, Loki), a backspace to PostgreSQL unless translated
    bounded = pg.call(tenant, "get_logs", {**base, "query": "|~ `\\bxylo`"}).content
    sqlite_like = pg.call(tenant, "get_logs", {**base, "query": "|= `xylo`"}).content
    assert bounded["total_matches"] == sqlite_like["total_matches"] > 0
    for query in ('|~ "(?P<n>x)"', '{host=~"(?P<h>x)"}'):  # valid RE2, refused by PostgreSQL's engine
        refused = pg.call(tenant, "get_logs", {**base, "query": query})
        assert refused.is_error and refused.error_code == "validation", refused.content
        assert refused.content["code"] == "INVALID_PARAMETER" and "regex" in refused.content["message"]


def test_metric_series_bucket_average_and_filter_in_postgres(pg: Harness) -> None:
    tenant = pg.tenant(f"pg-metrics-{uuid.uuid4().hex[:6]}")
    now = utcnow().replace(second=0, microsecond=0)
    rows = [{"product": "api", "metric": "queue_depth", "ts": now - timedelta(minutes=m), "unit": None,
             "value": float(10 * (i + 1) + (100 if m <= 10 else 0)),
             "labels": {"instance": f"i{i}", "zone": "a,b" if i == 2 else "c"}}
            for i in range(3) for m in range(1, 181)]
    with pg.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", rows)
    base = {"product": "api", "metric_name": "queue_depth", "time_range": "last 3h"}
    every = pg.call(tenant, "get_metrics", base, now=now).content
    assert every["series"] == 3 and len(every["samples"]) == 180
    assert every["samples"][0]["value"] == 20.0 and every["samples"][-1]["value"] == 120.0  # averaged, newest kept
    comma = pg.call(tenant, "get_metrics", {**base, "labels": {"zone": "a,b"}}, now=now).content
    assert comma["series"] == 1 and {s["value"] for s in comma["samples"]} == {30.0, 130.0}
    stepped = pg.call(tenant, "get_metrics", {**base, "step": "1h"}, now=now).content
    assert [s["ts"] for s in stepped["samples"]] == [
        (now - timedelta(hours=h)).isoformat(timespec="milliseconds").replace("+00:00", "Z") for h in (3, 2, 1)]


def test_list_products_on_postgresql(pg: Harness, service: str, platform: str) -> None:
    names = {p["product"] for p in pg.call(service, "list_products", {}).content["products"]}
    assert "checkout" in names
    one = pg.call(service, "list_products", {"product": "checkout"}).content
    assert [p["product"] for p in one["products"]] == ["checkout"] and "http_request_duration_seconds_p99" in one["metrics"]
    empty = pg.tenant(f"pg-empty-{uuid.uuid4().hex[:6]}")
    assert pg.call(empty, "list_products", {}).content["products"] == []  # another tenant's products are not its
