"""Metric series from the embedded store, aggregated in SQL the way Prometheus answers
``avg(avg_over_time(metric{...}[step]))``: label filters and time buckets are applied by the
database, every series is averaged within a bucket and the series are averaged with each
other, so the result is one series whatever the labels, and the newest data is never the part
a limit cuts off.

A series is identified by ``labels_key``: its labels as ``,k=v,k=v,`` (sorted by name, values
percent-encoded so they hold no ``,`` or ``=``). A filter ``{k: v}`` is then the substring
``,k=v,``, which both SQLite and PostgreSQL test the same way.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import Float, Integer, cast, func, literal, select
from sqlalchemy.sql.elements import ColumnElement

from kortex.errors import InvalidInput
from kortex.storage.db import Database
from kortex.storage.schema import telemetry_metrics
from kortex.telemetry.sources import MAX_BUCKETS, MetricQuery, MetricSeries, Sample

_MAX_ROWS = MAX_BUCKETS + 1  # ceil(span / step), plus one for rounding at the edge
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")


def labels_key(labels: dict[str, Any] | None) -> str:
    """The canonical text of a label set (what ingest stores in ``labels_key``)."""
    items = sorted((str(k), str(v)) for k, v in (labels or {}).items())
    return "," + "".join(f"{k}={quote(v, safe='')}," for k, v in items)


def label_term(name: str, value: str) -> str:
    if not _LABEL.match(name):
        raise InvalidInput(f"label {name!r} cannot be used as a filter; label names are letters, digits and _")
    return f",{name}={quote(str(value), safe='')},"


class EmbeddedMetrics:
    """The metric source over ``telemetry_metrics``, tenant-scoped and bounded."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def _contains(self, column: Any, text: str) -> ColumnElement[bool]:
        if self.db.is_sqlite:
            return func.instr(column, text) > 0
        return func.strpos(column, text) > 0

    def _epoch(self, column: Any) -> Any:
        """Seconds since the epoch, exact to the microsecond as on PostgreSQL. SQLite stores the
        time as text, 'YYYY-MM-DD HH:MM:SS.ffffff': its strftime('%f') keeps milliseconds only,
        which put a sample just past a bucket's start (the window's start keeps its
        microseconds) into the bucket before; the fraction is read from the text instead."""
        if self.db.is_sqlite:
            whole = cast(func.strftime("%s", column), Integer)
            fraction = cast(func.substr(column, 20, 7), Float)  # '.ffffff', or '' (0.0) when whole
            return whole + fraction
        return cast(func.extract("epoch", column), Float)

    def _bucket(self, column: Any, origin: datetime, step: float) -> Any:
        """Buckets aligned to the window's start (as Prometheus' query_range steps are)."""
        ratio = (self._epoch(column) - literal(origin.timestamp(), Float)) / literal(step, Float)
        # Rows are at or after the origin, so truncation is floor.
        return cast(ratio, Integer) if self.db.is_sqlite else func.floor(ratio)

    def query_metric(self, tenant_id: str, query: MetricQuery) -> MetricSeries:
        t = telemetry_metrics
        where: list[Any] = [t.c.tenant_id == tenant_id, t.c.product == query.product, t.c.metric == query.metric,
                            t.c.ts >= query.start, t.c.ts < query.end]
        for name, value in sorted(query.labels.items()):
            where.append(self._contains(t.c.labels_key, label_term(name, value)))
        span = max(1e-3, (query.end - query.start).total_seconds())
        step = max(query.step_s or 0.0, span / MAX_BUCKETS, 1e-3)
        bucket = self._bucket(t.c.ts, query.start, step).label("b")
        per_series = (
            select(bucket, func.avg(t.c.value).label("v"))
            .where(*where).group_by(bucket, t.c.labels_key).subquery()
        )
        per_bucket = (
            select(per_series.c.b, func.avg(per_series.c.v).label("v"))
            .group_by(per_series.c.b)
            .order_by(per_series.c.b.desc())  # the newest buckets are the ones a cut keeps
            .limit(_MAX_ROWS + 1)
        )
        with self.db.connect() as conn:
            rows = conn.execute(per_bucket).all()
            facts = conn.execute(select(func.count(func.distinct(t.c.labels_key)), func.max(t.c.unit))
                                 .where(*where)).one() if rows else (0, None)
        cut = len(rows) > _MAX_ROWS
        rows = list(reversed(rows[:_MAX_ROWS]))
        # Every point sits at the start of its bucket, as Prometheus' do (see prometheus.py).
        samples = [Sample(ts=query.start + timedelta(seconds=float(r.b) * step), value=float(r.v)) for r in rows]
        return MetricSeries(samples=samples, unit=facts[1], series=int(facts[0] or 0), truncated=cut)

    def list_metrics(self, tenant_id: str, product: str) -> list[str]:
        t = telemetry_metrics
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.c.metric).distinct().where(t.c.tenant_id == tenant_id, t.c.product == product)
                .order_by(t.c.metric).limit(500)
            ).all()
        return [r[0] for r in rows]
