"""A Prometheus answer nested past what json's decoder can recurse through is an UpstreamError
naming the source (the tool call's ``upstream`` error), not a RecursionError out of the source."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from kortex.errors import UpstreamError
from kortex.telemetry.prometheus import PrometheusMetrics
from kortex.telemetry.sources import MetricQuery
from kortex.timeparse import utcnow

# Under the 64 KiB an error answer is read up to, and far past json's recursion.
DEEP = b'{"status":"success","data":' + b"[" * 30_000 + b"]" * 30_000 + b"}"


@pytest.mark.parametrize("status", [200, 500])
def test_an_answer_nested_too_deeply_is_an_upstream_error(status: int) -> None:
    source = PrometheusMetrics("http://prom:9090", single_tenant=True,
                               transport=httpx.MockTransport(lambda _: httpx.Response(status, content=DEEP)))
    now = utcnow()
    with pytest.raises(UpstreamError, match=f"upstream: {status}: prometheus answered with JSON nested too deeply"):
        source.query_metric("t1", MetricQuery(product="checkout", metric="latency_ms",
                                              start=now - timedelta(hours=1), end=now))
