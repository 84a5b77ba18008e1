"""The Prometheus metric source against a real Prometheus (the Debian package; .ci/run installs it).

The server runs on a free port with a temporary data directory holding blocks that promtool
backfilled from a generated OpenMetrics file, so every value is known in advance."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from kortex.errors import InvalidInput, UpstreamError
from kortex.telemetry.prometheus import PrometheusMetrics
from kortex.telemetry.sources import MetricQuery
from tests.conftest import Harness

pytestmark = pytest.mark.integration

P99 = "http_request_duration_seconds_p99"
ONSET = timedelta(minutes=40)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: install the Debian package 'prometheus' "
                    "(apt-get install -y prometheus; .ci/run does it)")
    return path


def p99_value(i: int, bad: bool) -> float:
    """The p99 written for minute i: steady before the onset, ten times higher after."""
    return (2.0 if bad else 0.2) + 0.01 * (i % 5)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, datetime]]:
    prom, promtool = _binary("prometheus"), _binary("promtool")
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
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (root / "prometheus.log").open("wb")
    proc = subprocess.Popen([prom, f"--config.file={config}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited:\n{(root / 'prometheus.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus did not become ready:\n{(root / 'prometheus.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield url, now
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


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
