"""A Loki answer nested past what json's decoder can recurse through is an UpstreamError naming
the source (the tool call's ``upstream`` error), not a RecursionError out of the source."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest

from kortex.errors import UpstreamError
from kortex.telemetry.loki import LokiLogs
from kortex.telemetry.sources import LogQuery
from kortex.timeparse import utcnow

DEEP = b'{"status":"success","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def test_an_answer_nested_too_deeply_is_an_upstream_error() -> None:
    source = LokiLogs("http://loki:3100", transport=httpx.MockTransport(lambda _: httpx.Response(200, content=DEEP)))
    now = utcnow()
    with pytest.raises(UpstreamError, match="loki answered with JSON nested too deeply"):
        source.query_logs("t1", LogQuery(product="checkout", start=now - timedelta(hours=1), end=now))
