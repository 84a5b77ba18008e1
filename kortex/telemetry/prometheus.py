"""A metric source over Prometheus' HTTP API (PromQL).

The product is a label (``product_label``, default ``product``). Every query is scoped to the
tenant (see ``kortex.telemetry.factory``): by a label (``tenant_label``: its value is the Kortex
tenant id), by ``X-Scope-OrgID: <tenant id>`` (``org_id_from_tenant``, for Mimir, Cortex and
Thanos' receive/query frontends), or the deployment says it is ``single_tenant``. Queries are
always ``query_range`` with a bounded number of steps, after counting the matching series;
several series are averaged by Prometheus into the one series tools expect. Label values are
escaped and label names checked, so no argument can change the query's shape. Answers are read
within the tool call's deadline and a byte cap (``kortex.telemetry.http``); what is quoted of
them (an error's text, metric names) goes without the bearer token, however it was spelled.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from kortex.errors import ConfigError, InvalidInput, UpstreamError
from kortex.telemetry.http import DATA_CAP, BoundedClient
from kortex.telemetry.sources import MAX_BUCKETS, MetricQuery, MetricSeries, Sample

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
UNSCOPED = ("telemetry.prometheus: every tenant could read every other tenant's metrics; set tenant_label "
            "(a label whose value is the tenant id), org_id_from_tenant = true (Mimir, Cortex, Thanos: "
            "X-Scope-OrgID) or, if this Prometheus serves one tenant only, single_tenant = true")
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
                 org_id_from_tenant: bool = False, single_tenant: bool = False, timeout: float = 10.0,
                 bearer_token: str | None = None, transport: httpx.BaseTransport | None = None,
                 max_bytes: int = DATA_CAP) -> None:
        for name in (product_label, tenant_label):
            if name is not None and not _LABEL.match(name):
                raise ValueError(f"invalid Prometheus label name {name!r}")
        if not (tenant_label or org_id_from_tenant or single_tenant):
            raise ConfigError(UNSCOPED)
        self.url = url.rstrip("/")
        self.product_label = product_label
        self.tenant_label = tenant_label
        self.org_id_from_tenant = org_id_from_tenant
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._http = BoundedClient("prometheus", self.url, timeout=timeout, headers=headers, transport=transport,
                                   max_bytes=max_bytes)

    def close(self) -> None:
        self._http.close()

    def without_secrets(self, text: str) -> str:
        """``text`` without the credential this source sends, in any spelling (``BoundedClient``)."""
        return self._http.without_secrets(text)

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

    def _get(self, tenant_id: str, path: str, params: dict[str, Any] | list[tuple[str, Any]]) -> Any:
        headers = {"X-Scope-OrgID": tenant_id} if self.org_id_from_tenant else {}
        answer = self._http.get(path, params=params, headers=headers)
        try:
            body = answer.json()
        except RecursionError:  # json's decoder recurses: an answer nested a thousand deep is no answer either
            raise UpstreamError(f"upstream: {answer.status}: prometheus answered with JSON nested too deeply "
                                "to read") from None
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if answer.status >= 400 or body.get("status") != "success":
            # The error is the upstream's own words, decoded: a 200 with "status": "error" (never
            # cleaned as an error body) or a 4xx spelling the token some way the bytes were not.
            detail = body.get("error") or answer.reason
            message = f"upstream: {answer.status} {body.get('errorType', '')} {detail}".strip()
            raise UpstreamError(self._http.without_secrets(message) + answer.cut_note)
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
        """One series, bucketed: ``avg(avg_over_time(sel[step]))`` over buckets that tile
        ``[start, end)``. The number of buckets is bounded (at most ``MAX_BUCKETS``, never finer
        than a second), so no window fetches a raw matrix; every series is averaged within a
        bucket, then the series with each other (what the embedded store does in SQL)."""
        sel = self.selector(tenant_id, query.product, query.metric, query.labels)
        span = (query.end - query.start).total_seconds()
        unit = unit_of(query.metric)
        count = self._count(tenant_id, sel, query.end, span)
        if count == 0:
            return MetricSeries(samples=[], unit=unit, series=0)
        wanted = max(query.step_s or 0.0, span / MAX_BUCKETS, 1.0)
        buckets = max(1, math.ceil(span / wanted - 1e-9))
        # Buckets of whole milliseconds that tile the window (the last may end up to a few
        # milliseconds past it): none is partial, none is left out.
        step_ms = math.ceil(span * 1000 / buckets)
        step = step_ms / 1000
        # Each bucket [b, b + step) is evaluated at its last millisecond: the range selector then
        # covers it exactly on Prometheus 3 ((t - range, t]); on 2.x ([t - range, t]) a sample one
        # millisecond before a boundary would count twice, which beats losing one.
        first_eval = query.start.timestamp() + step - 0.001
        last_eval = query.start.timestamp() + buckets * step - 0.001
        data = self._get(tenant_id, "/api/v1/query_range", {
            "query": f"avg(avg_over_time({sel}[{step_ms}ms]))", "start": f"{first_eval:.3f}",
            "end": f"{last_eval:.3f}", "step": f"{step:.3f}"})
        result = data.get("result") or []
        samples = self._samples(result[0]["values"]) if result else []
        # Report each point at the start of its bucket, as the embedded store does.
        shifted = [Sample(ts=s.ts - timedelta(seconds=step - 0.001), value=s.value) for s in samples]
        return MetricSeries(samples=[s for s in shifted if query.start <= s.ts < query.end], unit=unit, series=count)

    def _count(self, tenant_id: str, sel: str, at: datetime, span: float) -> int:
        """How many series have samples anywhere in the window (asked before any data)."""
        query = f"count(count_over_time({sel}[{max(1, math.ceil(span))}s]))"
        data = self._get(tenant_id, "/api/v1/query", {"query": query, "time": f"{at.timestamp() - 0.001:.3f}"})
        result = data.get("result") or []
        return int(float(result[0]["value"][1])) if result else 0

    def list_metrics(self, tenant_id: str, product: str) -> list[str]:
        match = "{" + f'{self.product_label}="{escape(product)}"'
        if self.tenant_label:
            match += f',{self.tenant_label}="{escape(tenant_id)}"'
        match += "}"
        data = self._get(tenant_id, "/api/v1/label/__name__/values", [("match[]", match)])
        return sorted(self._http.without_secrets(str(n)) for n in (data or []))[:500]
