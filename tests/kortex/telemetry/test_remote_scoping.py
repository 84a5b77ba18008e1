"""Remote metric and log sources: tenant scoping is required, and Prometheus queries are
bounded (series counted first, then query_range with at most 2000 steps; no raw matrix)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from kortex.errors import ConfigError
from kortex.storage.db import Database
from kortex.telemetry.factory import build_sources
from kortex.telemetry.loki import LokiLogs
from kortex.telemetry.prometheus import PrometheusMetrics
from kortex.telemetry.sources import MAX_BUCKETS, MetricQuery
from tests.conftest import make_settings

END = datetime(2026, 4, 7, 15, 0, tzinfo=UTC)


class FakePrometheus:
    """Answers count and query_range with fixed data; remembers every request."""

    def __init__(self, series: int = 3) -> None:
        self.series = series
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        params = dict(request.url.params)
        if request.url.path == "/api/v1/query":
            assert params["query"].startswith("count(count_over_time("), params["query"]
            result = [{"metric": {}, "value": [float(params["time"]), str(self.series)]}] if self.series else []
        elif request.url.path.startswith("/api/v1/label/"):
            return httpx.Response(200, json={"status": "success", "data": ["up"]})
        else:
            assert request.url.path == "/api/v1/query_range", request.url.path
            start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
            points = int(round((end - start) / step)) + 1
            result = [{"metric": {}, "values": [[start + i * step, "1.5"] for i in range(points)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})


def _source(fake: FakePrometheus, **kwargs: object) -> PrometheusMetrics:
    return PrometheusMetrics("http://prom:9090", transport=httpx.MockTransport(fake), **kwargs)  # type: ignore[arg-type]


def test_prometheus_counts_series_first_then_asks_for_bounded_buckets() -> None:
    fake = FakePrometheus()
    source = _source(fake, single_tenant=True)
    year = MetricQuery(product="api", metric="up", start=END - timedelta(days=366), end=END)
    series = source.query_metric("t", year)
    count, ranged = fake.requests
    assert count.url.path == "/api/v1/query" and ranged.url.path == "/api/v1/query_range"
    params = dict(ranged.url.params)
    step = float(params["step"])
    assert step >= 366 * 86400 / MAX_BUCKETS  # never the raw samples of a year
    assert re.fullmatch(r'avg\(avg_over_time\(up\{product="api"\}\[\d+ms\]\)\)', params["query"])
    assert series.series == 3 and 0 < len(series.samples) <= MAX_BUCKETS
    assert all(year.start <= s.ts < year.end for s in series.samples)
    assert series.samples[0].ts == year.start  # points sit at the start of their bucket
    hour = source.query_metric("t", MetricQuery(product="api", metric="up", start=END - timedelta(hours=1), end=END,
                                                step_s=60))
    assert len(hour.samples) == 60 and float(dict(fake.requests[-1].url.params)["step"]) == 60


def test_prometheus_with_no_matching_series_sends_no_range_query() -> None:
    fake = FakePrometheus(series=0)
    series = _source(fake, single_tenant=True).query_metric(
        "t", MetricQuery(product="api", metric="up", start=END - timedelta(hours=1), end=END))
    assert series.samples == [] and series.series == 0
    assert [r.url.path for r in fake.requests] == ["/api/v1/query"]


def test_prometheus_must_be_tenant_scoped_or_declared_single_tenant() -> None:
    with pytest.raises(ConfigError, match="single_tenant"):
        _source(FakePrometheus())
    fake = FakePrometheus()
    _source(fake, org_id_from_tenant=True).query_metric(
        "tenant-a", MetricQuery(product="api", metric="up", start=END - timedelta(hours=1), end=END))
    assert {r.headers.get("X-Scope-OrgID") for r in fake.requests} == {"tenant-a"}
    fake = FakePrometheus()
    _source(fake, tenant_label="tenant").list_metrics("tenant-b", "api")
    assert 'tenant="tenant-b"' in dict(fake.requests[0].url.params)["match[]"]
    assert "X-Scope-OrgID" not in fake.requests[0].headers


def test_loki_without_org_ids_needs_single_tenant() -> None:
    with pytest.raises(ConfigError, match="single_tenant"):
        LokiLogs("http://loki:3100", org_id_from_tenant=False)
    LokiLogs("http://loki:3100", org_id_from_tenant=False, single_tenant=True).close()


@pytest.mark.parametrize(("telemetry", "ok"), [
    ({"metrics": "prometheus", "prometheus": {"url": "http://prom:9090"}}, False),
    ({"metrics": "prometheus", "prometheus": {"url": "http://prom:9090", "tenant_label": "tenant"}}, True),
    ({"metrics": "prometheus", "prometheus": {"url": "http://prom:9090", "org_id_from_tenant": True}}, True),
    ({"metrics": "prometheus", "prometheus": {"url": "http://prom:9090", "single_tenant": True}}, True),
    ({"logs": "loki", "loki": {"url": "http://loki:3100", "org_id_from_tenant": False}}, False),
    ({"logs": "loki", "loki": {"url": "http://loki:3100"}}, True),
])
def test_sources_refuse_to_start_unscoped(tmp_path: Path, sqlite_url: str, telemetry: dict, ok: bool) -> None:
    settings = make_settings(tmp_path, sqlite_url, telemetry=telemetry)
    db = Database(sqlite_url)
    try:
        if ok:
            build_sources(settings, db).close()
        else:
            with pytest.raises(ConfigError):
                build_sources(settings, db)
    finally:
        db.dispose()
