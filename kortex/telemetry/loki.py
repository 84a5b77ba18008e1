"""A log source over Loki's HTTP API (LogQL), behind the same interface as the embedded store.

The tenant travels as ``X-Scope-OrgID`` (Loki's own multi-tenancy; turning it off needs an
explicit ``single_tenant``); the product, level, host
and trace id are labels whose names are configurable. Pages come newest first with
``direction=backward``; Loki lines have no id, so a stable hash of the line stands in for one
and the keyset is (timestamp to the microsecond, hash), as in the embedded store. Answers are
read within the tool call's deadline and a byte cap (``kortex.telemetry.http``); what is quoted
of them (an error's text, log lines and their labels) goes without the bearer token, however it
was spelled.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from typing import Any

import httpx

from kortex.errors import ConfigError, UpstreamError
from kortex.telemetry.http import DATA_CAP, BoundedClient
from kortex.telemetry.logql import LogFilter, Matcher, to_logql
from kortex.telemetry.sources import LEVELS, MAX_LOG_PAGE, LogLine, LogPage, LogQuery

TIE_MARGIN = 20  # extra lines fetched so lines sharing the boundary timestamp are not lost


def line_id(ns: int, labels: dict[str, str], text: str) -> int:
    digest = hashlib.blake2b(f"{ns}|{sorted(labels.items())}|{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: fits a signed BIGINT and JSON


class LokiLogs:
    def __init__(self, url: str, *, product_label: str = "product", level_label: str = "level",
                 host_label: str = "host", trace_label: str = "trace_id", org_id_from_tenant: bool = True,
                 single_tenant: bool = False, timeout: float = 10.0, bearer_token: str | None = None,
                 transport: httpx.BaseTransport | None = None, max_bytes: int = DATA_CAP) -> None:
        if not (org_id_from_tenant or single_tenant):
            raise ConfigError("telemetry.loki: with org_id_from_tenant = false every tenant could read every other "
                              "tenant's logs; keep it true (X-Scope-OrgID: <tenant id>) or, if this Loki serves one "
                              "tenant only, set single_tenant = true")
        self.product_label = product_label
        self.labels = {"host": host_label, "level": level_label, "trace_id": trace_label}
        self.org_id_from_tenant = org_id_from_tenant
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._http = BoundedClient("loki", url.rstrip("/"), timeout=timeout, headers=headers, transport=transport,
                                   max_bytes=max_bytes)

    def close(self) -> None:
        self._http.close()

    def without_secrets(self, text: str) -> str:
        """``text`` without the credential this source sends, in any spelling (``BoundedClient``)."""
        return self._http.without_secrets(text)

    def logql(self, query: LogQuery) -> str:
        selector: dict[str, str] = {}
        if query.product is not None:
            selector[self.product_label] = query.product
        if query.trace_id is not None:
            selector[self.labels["trace_id"]] = query.trace_id
        flt = query.filter
        if flt is not None:  # our label names -> the deployment's
            flt = LogFilter(matchers=tuple(Matcher(self.labels[m.label], m.op, m.value) for m in flt.matchers),
                            lines=flt.lines, plain=flt.plain)
        extra: tuple[Matcher, ...] = ()
        if query.min_level:
            wanted = [name for name, sev in LEVELS.items() if sev >= LEVELS[query.min_level]]
            extra = (Matcher(self.labels["level"], "=~", "|".join(wanted)),)
        return to_logql(selector, flt, extra)

    def _get(self, tenant_id: str, path: str, params: dict[str, Any]) -> Any:
        headers = {"X-Scope-OrgID": tenant_id} if self.org_id_from_tenant else {}
        answer = self._http.get(path, params=params, headers=headers)
        clean = self._http.without_secrets
        if answer.status >= 400:  # quoted raw, escapes and all: cleaned whole, then cut
            raise UpstreamError(f"upstream: {answer.status} {clean(answer.text)[:200]}".strip() + answer.cut_note)
        try:
            body = answer.json()
        except ValueError as exc:
            raise UpstreamError("loki answered with something that is not JSON") from exc
        except RecursionError:  # json's decoder recurses: an answer nested a thousand deep is no answer either
            raise UpstreamError("loki answered with JSON nested too deeply to read") from None
        if not isinstance(body, dict):
            raise UpstreamError("loki answered with JSON that is not an object")
        if body.get("status") != "success":  # a 200 saying it failed: its words decoded, never cleaned as bytes
            raise UpstreamError(clean(f"loki: {body.get('error') or body.get('status')}"))
        return body.get("data") or {}

    def query_logs(self, tenant_id: str, query: LogQuery) -> LogPage:
        limit = max(1, min(query.limit, MAX_LOG_PAGE))
        logql = self.logql(query)
        start_ns = int(query.start.timestamp() * 1_000_000) * 1000
        end_us = int(query.end.timestamp() * 1_000_000)
        page_end_us = end_us
        if query.before is not None:
            page_end_us = min(end_us, int(query.before[0].timestamp() * 1_000_000) + 1)
        data = self._get(tenant_id, "/loki/api/v1/query_range", {
            "query": logql, "start": start_ns, "end": page_end_us * 1000, "limit": limit + 1 + TIE_MARGIN,
            "direction": "backward"})
        lines: list[tuple[tuple[int, int], LogLine]] = []
        clean = self._http.without_secrets
        for stream in data.get("result") or []:
            labels = {str(k): clean(str(v)) for k, v in (stream.get("stream") or {}).items()}
            for ns_text, text in stream.get("values") or []:
                ns = int(ns_text)
                us = ns // 1000
                if us >= end_us:
                    continue
                ident = line_id(ns, labels, text)
                ts = datetime.fromtimestamp(us // 1_000_000, tz=UTC).replace(microsecond=us % 1_000_000)
                key = (us, ident)
                if query.before is not None and (ts, ident) >= query.before:
                    continue
                lines.append((key, LogLine(
                    id=ident, ts=ts, level=labels.get(self.labels["level"], "info"),
                    host=labels.get(self.labels["host"], ""), message=clean(text) if isinstance(text, str) else text,
                    trace_id=labels.get(self.labels["trace_id"]), product=labels.get(self.product_label))))
        lines.sort(key=lambda item: item[0], reverse=True)
        page = [line for _, line in lines[:limit]]
        return LogPage(lines=page, total_matches=self._total(tenant_id, logql, query),
                       has_more=len(lines) > limit)

    def _total(self, tenant_id: str, logql: str, query: LogQuery) -> int:
        span = max(1, math.ceil((query.end - query.start).total_seconds()))
        data = self._get(tenant_id, "/loki/api/v1/query", {
            "query": f"sum(count_over_time({logql}[{span}s]))",
            "time": int(query.end.timestamp() * 1_000_000) * 1000 - 1})
        result = data.get("result") or []
        return int(float(result[0]["value"][1])) if result else 0
