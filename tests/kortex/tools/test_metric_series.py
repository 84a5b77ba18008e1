"""Metric series on the embedded store: many series, label filters in SQL, and the newest data
always kept (40 series of a day's minutes is 57 600 rows, past any row limit)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kortex.telemetry import embedded_metrics, ingest
from kortex.telemetry.embedded_metrics import labels_key
from kortex.telemetry.sources import MAX_BUCKETS, MetricQuery
from kortex.timeparse import utcnow
from tests.conftest import Harness, make_settings

SERIES = 40
MINUTES = 1440
SPIKE = 140  # the last 140 minutes run ten times higher


def _value(i: int, minute_ago: int) -> float:
    return (10.0 if minute_ago <= SPIKE else 1.0) + i * 0.01


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[tuple[Harness, str, object]]:
    """One harness for the module: writing the fleet is the slow part."""
    home = tmp_path_factory.mktemp("fleet")
    shutil.copy(sqlite_template, home / "kortex.db")
    harness = Harness(make_settings(home, f"sqlite:///{home / 'kortex.db'}"))
    tenant = harness.tenant("acme")
    now = utcnow().replace(second=0, microsecond=0)
    rows = [{"product": "api", "metric": "latency_seconds", "ts": now - timedelta(minutes=m), "value": _value(i, m),
             "unit": "seconds", "labels": {"instance": f"i{i:02d}", "route": "/pay" if i % 2 else "/cart"}}
            for i in range(SERIES) for m in range(1, MINUTES + 1)]
    with harness.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", rows)
    yield harness, tenant, now
    harness.close()


def _avg(ids: range | list[int], minute_ago: int) -> float:
    values = [_value(i, minute_ago) for i in ids]
    return sum(values) / len(values)


def test_get_metrics_keeps_the_newest_minutes_and_averages_the_series(fleet) -> None:
    h, tenant, now = fleet
    day = h.call(tenant, "get_metrics", {"product": "api", "metric_name": "latency_seconds", "time_range": "last 24h"},
                 now=now).content
    samples = day["samples"]
    assert day["series"] == SERIES and "average" in day["note"] and day["truncated"] is False
    assert len(samples) <= 500 and len({s["ts"] for s in samples}) == len(samples)  # one point per time
    newest = samples[-1]
    assert newest["ts"] >= (now - timedelta(minutes=5)).isoformat()[:16]  # the spike is in the answer
    assert newest["value"] == pytest.approx(_avg(range(SERIES), 1))
    stats = day["stats"]
    assert stats["max"] == pytest.approx(_avg(range(SERIES), 1)) and stats["min"] == pytest.approx(_avg(range(SERIES), 500))
    expected_mean = (SPIKE * _avg(range(SERIES), 1) + (MINUTES - SPIKE) * _avg(range(SERIES), 500)) / MINUTES
    assert stats["mean"] == pytest.approx(expected_mean)


def test_label_filters_select_series_in_sql(fleet) -> None:
    h, tenant, now = fleet
    base = {"product": "api", "metric_name": "latency_seconds", "time_range": "last 3h"}
    one = h.call(tenant, "get_metrics", {**base, "labels": {"instance": "i03"}}, now=now).content
    assert one["series"] == 1 and "note" not in one and len(one["samples"]) == 180
    assert [s["value"] for s in one["samples"][-2:]] == [pytest.approx(_value(3, 1))] * 2
    pay = h.call(tenant, "get_metrics", {**base, "labels": {"route": "/pay"}}, now=now).content
    assert pay["series"] == SERIES // 2 and pay["samples"][-1]["value"] == pytest.approx(_avg(range(1, SERIES, 2), 1))
    both = h.call(tenant, "get_metrics", {**base, "labels": {"route": "/pay", "instance": "i03"}}, now=now).content
    assert both["series"] == 1
    none = h.call(tenant, "get_metrics", {**base, "labels": {"route": "/pay", "instance": "i04"}}, now=now).content
    assert none["samples"] == [] and none["available_metrics"] == ["latency_seconds"]
    tricky = h.call(tenant, "get_metrics", {**base, "labels": {"route": "/pay,instance=i03"}}, now=now).content
    assert tricky["samples"] == []  # a value cannot smuggle a second matcher
    bad = h.call(tenant, "get_metrics", {**base, "labels": {"bad-name": "x"}}, now=now)
    assert bad.error_code == "validation"


def test_compare_to_baseline_sees_the_spike_once_per_minute(fleet) -> None:
    h, tenant, now = fleet
    result = h.call(tenant, "compare_to_baseline", {"product": "api", "metric_name": "latency_seconds",
                                                    "time_range": f"last {SPIKE}m"}, now=now).content
    assert result["sample_count"] == SPIKE and result["anomaly_count"] == SPIKE
    assert result["baseline_samples"] == MINUTES - SPIKE
    assert result["baseline_mean"] == pytest.approx(_avg(range(SERIES), 500))
    onset = now - timedelta(minutes=SPIKE)
    first = datetime.fromisoformat(result["first_anomaly_at"].replace("Z", "+00:00"))
    assert onset - timedelta(seconds=SPIKE * 60 / MAX_BUCKETS) < first <= onset
    assert len({s["ts"] for s in result["samples"]}) == len(result["samples"]) == SPIKE


def test_a_capped_series_keeps_the_newest_buckets_and_says_so(fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    h, tenant, now = fleet
    monkeypatch.setattr(embedded_metrics, "_MAX_ROWS", 100)
    series = h.k.sources.metrics.query_metric(tenant, MetricQuery(product="api", metric="latency_seconds",
                                                                  start=now - timedelta(hours=3), end=now))
    assert series.truncated and len(series.samples) == 100
    newest = now - timedelta(minutes=1)  # the cut falls on the oldest; points sit at their bucket's start
    assert newest - timedelta(seconds=3 * 3600 / MAX_BUCKETS) < series.samples[-1].ts <= newest


def test_labels_key_is_canonical_and_separator_safe() -> None:
    assert labels_key({}) == "," and labels_key(None) == ","
    assert labels_key({"b": "2", "a": "x,y=z"}) == ",a=x%2Cy%3Dz,b=2,"


def check_buckets_start_at_the_window_start_to_the_microsecond(h: Harness) -> list[float]:
    """Samples 30 µs past each minute of a window that starts at .123456: every fifth one is
    30 µs into a 5-minute bucket (read to the millisecond, .123486 is .123: the bucket before)."""
    tenant = h.tenant("buckets")
    now = datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=UTC)
    start = now - timedelta(hours=1)
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", [
            {"product": "api", "metric": "depth", "ts": start + timedelta(minutes=k, microseconds=30),
             "value": float(k), "unit": None, "labels": {}} for k in range(60)])
    result = h.call(tenant, "get_metrics", {"product": "api", "metric_name": "depth", "time_range": "last 1h",
                                            "step": "5m"}, now=now)
    assert not result.is_error, result.content
    values = [s["value"] for s in result.content["samples"]]
    assert values == [5 * b + 2.0 for b in range(12)]  # minutes 5b..5b+4, averaged
    return values


def test_buckets_start_at_the_window_start_to_the_microsecond(harness: Harness) -> None:
    check_buckets_start_at_the_window_start_to_the_microsecond(harness)
