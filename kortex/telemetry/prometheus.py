"""A metric source over Prometheus' HTTP API (PromQL).

The product is a label (``product_label``, default ``product``); so, optionally, is the tenant
(``tenant_label``: its value is the Kortex tenant id). Without a step the raw samples of the
window come from a range selector (``metric{...}[3h]``); with one, ``query_range``. Several
matching series are averaged by Prometheus (``avg(...)``) into the one series tools expect.
Label values are escaped and label names checked, so no argument can change the query's shape.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

import httpx

from kortex.errors import InvalidInput, UpstreamError
from kortex.telemetry.sources import MetricQuery, MetricSeries, Sample

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MAX_POINTS = 11_000  # Prometheus refuses longer query_range results
UNITS = (("_seconds", "seconds"), ("_ratio", "ratio"), ("_bytes", "bytes"), ("_percent", "percent"),
         ("_total", "count"))


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def unit_of(metric: str) -> str | None:
    """Prometheus naming convention: the unit is the metric's suffix."""
    for suffix, unit in UNITS:
        if metric.endswith(suffix) or f"{suffix}_" in metric:
            return unit
    return None


class PrometheusMetrics:
    def __init__(self, url: str, *, product_label: str = "product", tenant_label: str | None = None,
                 timeout: float = 10.0, bearer_token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        for name in (product_label, tenant_label):
            if name is not None and not _LABEL.match(name):
                raise ValueError(f"invalid Prometheus label name {name!r}")
        self.url = url.rstrip("/")
        self.product_label = product_label
        self.tenant_label = tenant_label
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout, headers=headers, transport=transport)

    def close(self) -> None:
        self._client.close()

    def selector(self, tenant_id: str, product: str, metric: str | None, labels: dict[str, str]) -> str:
        matchers: list[str] = []
        if metric is not None and not _METRIC.match(metric):
            matchers.append(f'__name__="{escape(metric)}"')  # dotted names are legal only this way
        matchers.append(f'{self.product_label}="{escape(product)}"')
        if self.tenant_label:
            matchers.append(f'{self.tenant_label}="{escape(tenant_id)}"')
        for key, value in sorted(labels.items()):
            if not _LABEL.match(key) or key in (self.product_label, self.tenant_label, "__name__"):
                raise InvalidInput(f"label {key!r} cannot be used as a filter")
            matchers.append(f'{key}="{escape(str(value))}"')
        name = metric if metric is not None and _METRIC.match(metric) else ""
        return name + "{" + ",".join(matchers) + "}"

    def _get(self, path: str, params: dict[str, Any] | list[tuple[str, Any]]) -> Any:
        try:
            response = self._client.get(path, params=params)
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"prometheus did not answer within {self.timeout:.0f}s") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"prometheus is unreachable: {exc.__class__.__name__}") from exc
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code >= 400 or body.get("status") != "success":
            detail = body.get("error") or response.reason_phrase
            raise UpstreamError(f"upstream: {response.status_code} {body.get('errorType', '')} {detail}".strip())
        return body.get("data")

    @staticmethod
    def _samples(values: list[list[Any]]) -> list[Sample]:
        out = []
        for ts, raw in values:
            value = float(raw)
            if math.isfinite(value):  # NaN marks a stale series in Prometheus
                out.append(Sample(ts=datetime.fromtimestamp(float(ts), tz=UTC), value=value))
        return out

    def query_metric(self, tenant_id: str, query: MetricQuery) -> MetricSeries:
        sel = self.selector(tenant_id, query.product, query.metric, query.labels)
        span = (query.end - query.start).total_seconds()
        unit = unit_of(query.metric)
        if not query.step_s:
            data = self._get("/api/v1/query", {"query": f"{sel}[{max(1, math.ceil(span))}s]",
                                               "time": query.end.timestamp()})
            result = data.get("result") or []
            if len(result) <= 1:
                samples = self._samples(result[0]["values"]) if result else []
                # A range selector is (end - span, end]; tools work on [start, end).
                samples = [s for s in samples if query.start <= s.ts < query.end]
                return MetricSeries(samples=samples, unit=unit, series=len(result))
        # Several series without a step: sample their average at most 500 times (what tools show),
        # never finer than 15 s (the usual scrape interval).
        step = max(1.0, query.step_s or max(15.0, span / 500), span / MAX_POINTS)
        data = self._get("/api/v1/query_range", {"query": f"avg({sel})", "start": query.start.timestamp(),
                                                  "end": query.end.timestamp(), "step": f"{step:g}"})
        result = data.get("result") or []
        count = self._count(sel, query.end, span) if result else 0
        samples = self._samples(result[0]["values"]) if result else []
        return MetricSeries(samples=[s for s in samples if s.ts < query.end], unit=unit, series=count)

    def _count(self, sel: str, at: datetime, span: float) -> int:
        """How many series matched anywhere in the window (not only at its end)."""
        query = f"count(count_over_time({sel}[{max(1, math.ceil(span))}s]))"
        data = self._get("/api/v1/query", {"query": query, "time": at.timestamp()})
        result = data.get("result") or []
        return int(float(result[0]["value"][1])) if result else 1

    def list_metrics(self, tenant_id: str, product: str) -> list[str]:
        match = "{" + f'{self.product_label}="{escape(product)}"'
        if self.tenant_label:
            match += f',{self.tenant_label}="{escape(tenant_id)}"'
        match += "}"
        data = self._get("/api/v1/label/__name__/values", [("match[]", match)])
        return sorted(str(n) for n in (data or []))[:500]
