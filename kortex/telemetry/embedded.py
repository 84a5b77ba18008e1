"""The embedded telemetry store: telemetry tables in Kortex's own database, tenant-scoped."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, tuple_

from kortex.storage.db import Database
from kortex.storage.schema import telemetry_deploys, telemetry_logs, telemetry_metrics
from kortex.telemetry.sources import (
    LEVELS,
    MAX_LOG_PAGE,
    Deploy,
    LogLine,
    LogPage,
    LogQuery,
    MetricQuery,
    MetricSeries,
    Sample,
    TelemetrySources,
    downsample,
)

MAX_SAMPLES = 2000


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class EmbeddedTelemetry:
    """Implements every source interface over the ``telemetry_*`` tables."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def query_logs(self, tenant_id: str, query: LogQuery) -> LogPage:
        t = telemetry_logs
        limit = max(1, min(query.limit, MAX_LOG_PAGE))
        where: list[Any] = [
            t.c.tenant_id == tenant_id, t.c.product == query.product, t.c.ts >= query.start, t.c.ts < query.end,
        ]
        if query.min_level:
            where.append(t.c.severity >= LEVELS[query.min_level])
        if query.text:
            where.append(t.c.message.ilike(f"%{_like_escape(query.text)}%", escape="\\"))
        with self.db.connect() as conn:
            total = int(conn.scalar(select(func.count()).select_from(t).where(*where)) or 0)
            page_where = list(where)
            if query.before is not None:
                page_where.append(tuple_(t.c.ts, t.c.id) < tuple_(*query.before))
            rows = (
                conn.execute(
                    select(t.c.id, t.c.ts, t.c.level, t.c.host, t.c.message, t.c.trace_id)
                    .where(*page_where)
                    .order_by(t.c.ts.desc(), t.c.id.desc())
                    .limit(limit + 1)
                )
            ).all()
        lines = [LogLine(id=r.id, ts=r.ts, level=r.level, host=r.host, message=r.message, trace_id=r.trace_id)
                 for r in rows[:limit]]
        return LogPage(lines=lines, total_matches=total, has_more=len(rows) > limit)

    def query_metric(self, tenant_id: str, query: MetricQuery) -> MetricSeries:
        t = telemetry_metrics
        with self.db.connect() as conn:
            rows = (
                conn.execute(
                    select(t.c.ts, t.c.value, t.c.unit, t.c.labels)
                    .where(t.c.tenant_id == tenant_id, t.c.product == query.product, t.c.metric == query.metric,
                           t.c.ts >= query.start, t.c.ts < query.end)
                    .order_by(t.c.ts)
                    .limit(MAX_SAMPLES * 20)
                )
            ).all()
        if query.labels:
            wanted = {k: str(v) for k, v in query.labels.items()}
            rows = [r for r in rows if all(str((r.labels or {}).get(k)) == v for k, v in wanted.items())]
        unit = next((r.unit for r in rows if r.unit), None)
        samples = [Sample(ts=r.ts, value=float(r.value)) for r in rows]
        if query.step_s:
            samples = downsample(samples, query.step_s)
        return MetricSeries(samples=samples, unit=unit)

    def list_metrics(self, tenant_id: str, product: str) -> list[str]:
        t = telemetry_metrics
        with self.db.connect() as conn:
            rows = (
                conn.execute(
                    select(t.c.metric).distinct().where(t.c.tenant_id == tenant_id, t.c.product == product)
                    .order_by(t.c.metric)
                )
            ).all()
        return [r[0] for r in rows]

    def list_deploys(self, tenant_id: str, product: str, start: datetime, end: datetime) -> list[Deploy]:
        t = telemetry_deploys
        with self.db.connect() as conn:
            rows = (
                conn.execute(
                    select(t)
                    .where(t.c.tenant_id == tenant_id, t.c.product == product, t.c.ts >= start, t.c.ts < end)
                    .order_by(t.c.ts.desc())
                    .limit(200)
                )
            ).all()
        return [
            Deploy(ts=r.ts, version=r.version, actor=r.actor, host=r.host, duration_s=r.duration_s,
                   status=r.status, commit=r.commit, rolled_back=r.rolled_back)
            for r in rows
        ]

    def sources(self) -> TelemetrySources:
        return TelemetrySources(logs=self, metrics=self, deploys=self)
