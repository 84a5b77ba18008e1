"""The Prometheus metric source against a real Prometheus (the Debian package; .ci/run installs it).

The server runs on a free port with a temporary data directory holding blocks that promtool
backfilled from a generated OpenMetrics file, so every value is known in advance."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from kortex.errors import InvalidInput, UpstreamError
from kortex.telemetry.prometheus import PrometheusMetrics
from kortex.telemetry.sources import MetricQuery
from tests.conftest import Harness
from tests.integration import promproc

pytestmark = pytest.mark.integration

P99 = "http_request_duration_seconds_p99"
ONSET = timedelta(minutes=40)


def p99_value(i: int, bad: bool) -> float:
    """The p99 written for minute i: steady before the onset, ten times higher after."""
    return (2.0 if bad else 0.2) + 0.01 * (i % 5)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, datetime]]:
    promtool = promproc.binary("promtool")
    root = tmp_path_factory.mktemp("prometheus")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    lines = [f"# TYPE {P99} gauge"]
    for i in range(27 * 60, 0, -1):  # one sample a minute for 27 h: the last 3 h and their 24 h baseline
        ts = now - timedelta(minutes=i)
        lines.append(f'{P99}{{product="checkout",instance="a"}} {p99_value(i, ts >= now - ONSET)} {ts.timestamp():.0f}')
    lines.append("# TYPE queue_depth gauge")
    for instance, value in (("a", 10), ("b", 20)):
        for i in range(180, 0, -1):
            ts = now - timedelta(minutes=i)
            lines.append(f'queue_depth{{product="checkout",instance="{instance}"}} {value} {ts.timestamp():.0f}')
    lines.append("# TYPE tenant_requests gauge")
    for tenant, value in (("t-one", 1), ("t-two", 2)):
        for i in range(60, 0, -1):
            ts = now - timedelta(minutes=i)
            lines.append(f'tenant_requests{{product="api",tenant="{tenant}"}} {value} {ts.timestamp():.0f}')
    lines.append("# EOF")
    source = root / "data.om"
    source.write_text("\n".join(lines) + "\n")
    data = root / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)], check=True,
                   capture_output=True, timeout=120)
    with promproc.prometheus(root, "global:\n  scrape_interval: 1m\nscrape_configs: []\n",
                             f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=30d") as url:
        yield url, now


def test_raw_samples_come_back_exactly(prometheus: tuple[str, datetime]) -> None:
    url, now = prometheus
    source = PrometheusMetrics(url, single_tenant=True)
    try:
        series = source.query_metric("t", MetricQuery(product="checkout", metric=P99, start=now - timedelta(hours=3),
                                                      end=now))
        assert series.unit == "seconds" and series.series == 1 and len(series.samples) == 180
        for sample in series.samples:  # at the start of the bucket (at most 5.4 s wide) holding it
            i = int((now - sample.ts).total_seconds() // 60)
            assert sample.value == pytest.approx(p99_value(i, i <= ONSET.total_seconds() // 60))
        assert source.list_metrics("t", "checkout") == ["http_request_duration_seconds_p99", "queue_depth"]
        assert source.list_metrics("t", "nothing") == []
    finally:
        source.close()


def test_several_series_are_averaged_and_labels_filter(prometheus: tuple[str, datetime]) -> None:
    url, now = prometheus
    source = PrometheusMetrics(url, single_tenant=True)
    try:
        window = {"product": "checkout", "metric": "queue_depth", "start": now - timedelta(hours=1), "end": now}
        both = source.query_metric("t", MetricQuery(**window))
        assert both.series == 2 and {s.value for s in both.samples} == {15.0}
        only_b = source.query_metric("t", MetricQuery(**window, labels={"instance": "b"}))
        assert only_b.series == 1 and {s.value for s in only_b.samples} == {20.0}
        stepped = source.query_metric("t", MetricQuery(**window, step_s=600))
        assert 6 <= len(stepped.samples) <= 7 and {s.value for s in stepped.samples} == {15.0}
        with pytest.raises(InvalidInput):
            source.query_metric("t", MetricQuery(**window, labels={"bad-label": "x"}))
        sneaky = source.query_metric("t", MetricQuery(**{**window, "product": 'checkout"} or vector(1) or {x="'}))
        assert sneaky.samples == []  # the value stayed a value
    finally:
        source.close()


def test_the_tenant_label_scopes_every_query(prometheus: tuple[str, datetime]) -> None:
    url, now = prometheus
    source = PrometheusMetrics(url, tenant_label="tenant")
    try:
        query = MetricQuery(product="api", metric="tenant_requests", start=now - timedelta(hours=1), end=now)
        assert {s.value for s in source.query_metric("t-one", query).samples} == {1.0}
        assert {s.value for s in source.query_metric("t-two", query).samples} == {2.0}
        assert source.query_metric("t-three", query).samples == []
        assert source.list_metrics("t-three", "api") == [] and source.list_metrics("t-one", "api") == ["tenant_requests"]
    finally:
        source.close()


def test_the_tools_read_prometheus_when_configured(prometheus: tuple[str, datetime], harness_factory) -> None:
    url, now = prometheus
    h: Harness = harness_factory(telemetry={"metrics": "prometheus", "prometheus": {"url": url,
                                                                                   "single_tenant": True}})
    tenant = h.tenant("acme")
    metrics = h.call(tenant, "get_metrics", {"product": "checkout", "metric_name": P99, "time_range": "last 3h"},
                     now=now).content
    assert len(metrics["samples"]) == 180 and metrics["unit"] == "seconds"
    assert metrics["stats"]["min"] == pytest.approx(0.2) and metrics["stats"]["max"] == pytest.approx(2.04)
    baseline = h.call(tenant, "compare_to_baseline", {"product": "checkout", "metric_name": P99,
                                                      "time_range": "last 3h"}, now=now).content
    assert baseline["baseline_samples"] == 1440 and baseline["baseline_mean"] == pytest.approx(0.22)
    assert baseline["anomaly_count"] == 40 and baseline["max_z_score"] > 100
    missing = h.call(tenant, "get_metrics", {"product": "checkout", "metric_name": "nope", "time_range": "last 1h"},
                     now=now).content
    assert missing["samples"] == [] and "queue_depth" in missing["available_metrics"]


def test_an_unreachable_prometheus_is_an_upstream_error(harness_factory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    h: Harness = harness_factory(telemetry={"metrics": "prometheus",
                                            "prometheus": {"url": f"http://127.0.0.1:{port}", "timeout": 2,
                                                           "single_tenant": True}})
    result = h.call(h.tenant("acme"), "get_metrics", {"product": "checkout", "metric_name": P99,
                                                      "time_range": "last 1h"})
    assert result.is_error and result.error_code == "upstream" and "prometheus" in result.content["message"]
    with pytest.raises(UpstreamError):
        PrometheusMetrics(f"http://127.0.0.1:{port}", single_tenant=True).list_metrics("t", "p")


def test_embedded_store_and_prometheus_agree(prometheus: tuple[str, datetime], harness_factory) -> None:
    """The same samples in both sources give the same points: several series are averaged per
    step (not pooled), label filters select the same series, steps align to the window."""
    from kortex.telemetry import ingest

    url, now = prometheus
    prom: Harness = harness_factory(telemetry={"metrics": "prometheus", "prometheus": {"url": url,
                                                                                      "single_tenant": True}})
    emb: Harness = harness_factory()
    tenant = emb.tenant("acme")
    rows = [{"product": "checkout", "metric": P99, "ts": now - timedelta(minutes=i), "unit": None,
             "value": p99_value(i, i <= ONSET.total_seconds() // 60), "labels": {"instance": "a"}}
            for i in range(27 * 60, 0, -1)]
    rows += [{"product": "checkout", "metric": "queue_depth", "ts": now - timedelta(minutes=i), "unit": None,
              "value": float(value), "labels": {"instance": instance}}
             for instance, value in (("a", 10), ("b", 20)) for i in range(180, 0, -1)]
    with emb.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", rows)
    for args in ({"metric_name": P99, "time_range": "last 3h"}, {"metric_name": P99, "time_range": "last 3h", "step": "10m"},
                 {"metric_name": P99, "time_range": "last 26h"}, {"metric_name": "queue_depth", "time_range": "last 2h"},
                 {"metric_name": "queue_depth", "time_range": "last 2h", "labels": {"instance": "b"}}):
        call = {"product": "checkout", **args}
        a = prom.call(prom.tenant("acme"), "get_metrics", call, now=now).content
        b = emb.call(tenant, "get_metrics", call, now=now).content
        assert a["series"] == b["series"] and len(a["samples"]) == len(b["samples"]) > 0, args
        assert [s["value"] for s in a["samples"]] == pytest.approx([s["value"] for s in b["samples"]]), args
        assert a["stats"] == pytest.approx(b["stats"]), args
        if "step" in args:
            assert [s["ts"] for s in a["samples"]] == [s["ts"] for s in b["samples"]]
    baseline = {"product": "checkout", "metric_name": P99, "time_range": "last 3h"}
    a = prom.call(prom.tenant("acme"), "compare_to_baseline", baseline, now=now).content
    b = emb.call(tenant, "compare_to_baseline", baseline, now=now).content
    assert (a["anomaly_count"], a["baseline_samples"]) == (b["anomaly_count"], b["baseline_samples"]) == (40, 1440)
    assert a["baseline_mean"] == pytest.approx(b["baseline_mean"])
