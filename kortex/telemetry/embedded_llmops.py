"""The LLM-ops source over the embedded ``llm_*`` tables, tenant-scoped and bounded."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from sqlalchemy import case, func, or_, select, tuple_

from kortex.storage.db import Database
from kortex.storage.schema import llm_deployments, llm_requests, llm_users
from kortex.telemetry.llmops import (
    MAX_REQUEST_PAGE,
    DeploymentFilter,
    DeploymentStatus,
    Granularity,
    GroupBy,
    LatencyBucket,
    LatencyTrend,
    LLMRequest,
    QualityRow,
    RequestPage,
    RequestQuery,
    TrendFilter,
    Usage,
    UserInfo,
    Volume,
    VolumeRow,
)

#: (period, deployment) buckets a latency trend lists, newest periods first; its summary covers all
MAX_TREND_ROWS = 10_000
#: (period, group) rows a volume lists, newest periods first; its totals cover all
MAX_VOLUME_ROWS = 10_000
GROUP_COLUMNS = {"tier": "user_tier", "model": "model_id", "backend": "backend_id", "deployment": "deployment_id"}
PERCENTILES = (50, 95)


def _ranks(n: int, q: int) -> tuple[int, int]:
    """The 0-based ranks either side of percentile ``q`` of ``n`` values, in integers so the
    database picks the very rows Python would."""
    lo = (n - 1) * q // 100
    return lo, min(lo + 1, n - 1)


def _percentile(at: dict[int, int], n: int, q: int) -> float:
    """Linear interpolation between closest ranks (numpy's default) of the values ``at`` ranks."""
    lo, hi = _ranks(n, q)
    return at[lo] + (at[hi] - at[lo]) * ((n - 1) * q % 100) / 100


def _bucket_of(period: datetime, deployment: str, rows: list[Any]) -> LatencyBucket:
    """A bucket from its rows of ``_trend_rows``: n, errors, and the latencies at the ranks asked."""
    n, errors = int(rows[0].n), int(rows[0].errors)
    at = {int(r.pos): int(r.latency_ms) for r in rows}
    return LatencyBucket(period=period, deployment_id=deployment, request_count=n,
                         latency_p50_ms=round(_percentile(at, n, 50), 1),
                         latency_p95_ms=round(_percentile(at, n, 95), 1), error_rate=round(errors / n, 4))


def _keep_newest(buckets: Iterable[LatencyBucket]) -> LatencyTrend:
    """Every bucket (newest period first) counts in the summary; the first ``MAX_TREND_ROWS``
    are listed, less the oldest of their periods if it goes on past them (it would look quieter)."""
    kept: list[LatencyBucket] = []
    first_left: datetime | None = None  # the period of the first bucket left out
    total, p50_sum, p95_sum = 0, 0.0, 0.0
    for b in buckets:
        total += b.request_count
        p50_sum += b.latency_p50_ms * b.request_count
        p95_sum += b.latency_p95_ms * b.request_count
        if len(kept) < MAX_TREND_ROWS:
            kept.append(b)
        elif first_left is None:
            first_left = b.period
    if first_left is not None and kept and kept[-1].period == first_left != kept[0].period:
        kept = [b for b in kept if b.period != first_left]
    return LatencyTrend(buckets=sorted(kept, key=lambda b: (b.period, b.deployment_id)), cut=first_left is not None,
                        total_requests=total,
                        avg_latency_p50_ms=round(p50_sum / total, 1) if total else None,
                        avg_latency_p95_ms=round(p95_sum / total, 1) if total else None)


class EmbeddedLLMOps:
    def __init__(self, db: Database) -> None:
        self.db = db

    def _bucket(self, column: Any, granularity: Granularity) -> Any:
        if self.db.is_sqlite:  # stored as naive UTC text
            return func.strftime("%Y-%m-%d %H:00:00" if granularity == "hour" else "%Y-%m-%d 00:00:00", column)
        return func.date_trunc(granularity, func.timezone("UTC", column))

    @staticmethod
    def _period(value: Any) -> datetime:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else value
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)

    @staticmethod
    def _deployment_cond(tenant_id: str, where: DeploymentFilter) -> list[Any]:
        t = llm_deployments
        cond: list[Any] = [t.c.tenant_id == tenant_id]
        for name in ("model_id", "backend_id", "status"):
            value = getattr(where, name)
            if value is not None:
                cond.append(t.c[name] == value)
        return cond

    def deployments(self, tenant_id: str, where: DeploymentFilter, limit: int = 500) -> list[DeploymentStatus]:
        t = llm_deployments
        cond = self._deployment_cond(tenant_id, where)
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*cond).order_by(t.c.deployment_id).limit(max(1, min(limit, 1001)))).all()
        return [DeploymentStatus(
            deployment_id=r.deployment_id, model_id=r.model_id, backend_id=r.backend_id, status=r.status,
            latency_p50_ms=r.latency_p50_ms, latency_p95_ms=r.latency_p95_ms, error_rate=r.error_rate,
            queue_depth=r.queue_depth, cost_per_1k_tokens=r.cost_per_1k_tokens,
            rate_limit_remaining=r.rate_limit_remaining, sample_count=r.sample_count, updated_at=r.updated_at,
        ) for r in rows]

    def deployment_counts(self, tenant_id: str, where: DeploymentFilter) -> dict[str, int]:
        t = llm_deployments
        with self.db.connect() as conn:
            rows = conn.execute(select(t.c.status, func.count()).where(*self._deployment_cond(tenant_id, where))
                                .group_by(t.c.status)).all()
        return {r[0]: int(r[1]) for r in rows}

    @staticmethod
    def _request(r: Any) -> LLMRequest:
        return LLMRequest(
            row_id=int(r.id), request_id=r.request_id, user_id=r.user_id, user_tier=r.user_tier,
            deployment_id=r.deployment_id, model_id=r.model_id, backend_id=r.backend_id, task_type=r.task_type,
            input_tokens=r.input_tokens, output_tokens=r.output_tokens, cost_usd=r.cost_usd, latency_ms=r.latency_ms,
            status=r.status, quality_score=r.quality_score, router_version=r.router_version,
            experiment_id=r.experiment_id, routing=r.routing, created_at=r.created_at,
        )

    def requests(self, tenant_id: str, query: RequestQuery) -> RequestPage:
        t = llm_requests
        limit = max(1, min(query.limit, MAX_REQUEST_PAGE))
        cond: list[Any] = [t.c.tenant_id == tenant_id, t.c.created_at >= query.start, t.c.created_at < query.end]
        for name in ("user_id", "user_tier", "deployment_id", "model_id", "backend_id", "status"):
            value = getattr(query, name)
            if value is not None:
                cond.append(t.c[name] == value)
        total_cond = list(cond)  # the whole window, whichever page this is
        if query.before is not None:
            cond.append(tuple_(t.c.created_at, t.c.id) < tuple_(*query.before))
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*cond).order_by(t.c.created_at.desc(), t.c.id.desc())
                                .limit(limit + 1)).all()
            total = int(conn.scalar(select(func.count()).select_from(t).where(*total_cond)) or 0)
        return RequestPage(requests=[self._request(r) for r in rows[:limit]], has_more=len(rows) > limit,
                           total_matches=total)

    def request(self, tenant_id: str, request_id: str) -> LLMRequest | None:
        t = llm_requests
        with self.db.connect() as conn:
            row = conn.execute(select(t).where(t.c.tenant_id == tenant_id, t.c.request_id == request_id)).first()
        return self._request(row) if row else None

    def user(self, tenant_id: str, user_id: str) -> UserInfo | None:
        t = llm_users
        with self.db.connect() as conn:
            row = conn.execute(select(t).where(t.c.tenant_id == tenant_id, t.c.user_id == user_id)).first()
        if row is None:
            return None
        return UserInfo(user_id=row.user_id, tier=row.tier, latency_sla_ms=row.latency_sla_ms,
                        daily_budget_usd=row.daily_budget_usd)

    def user_usage(self, tenant_id: str, user_id: str, start: datetime, end: datetime) -> Usage:
        t = llm_requests
        with self.db.connect() as conn:
            row = conn.execute(
                select(func.count(), func.coalesce(func.sum(t.c.cost_usd), 0.0))
                .where(t.c.tenant_id == tenant_id, t.c.user_id == user_id, t.c.created_at >= start,
                       t.c.created_at < end)
            ).one()
        return Usage(requests=int(row[0]), cost_usd=float(row[1]))

    def latency_trends(self, tenant_id: str, where: TrendFilter, start: datetime, end: datetime,
                       granularity: Granularity) -> LatencyTrend:
        # Every bucket is computed, so the summary covers every request; only the listing is cut.
        # At most four rows a bucket come back (reads run in autocommit: PostgreSQL would not
        # stream them through a server-side cursor anyway).
        with self.db.connect() as conn:
            rows = conn.execute(self._trend_rows(tenant_id, where, start, end, granularity)).all()
        buckets = groupby(rows, key=lambda r: (r.period, r.deployment_id))
        return _keep_newest(_bucket_of(self._period(period), deployment, list(of_bucket))
                            for (period, deployment), of_bucket in buckets)

    def _trend_rows(self, tenant_id: str, where: TrendFilter, start: datetime, end: datetime,
                    granularity: Granularity) -> Any:
        """Per (period, deployment), newest period first: the bucket's request and error counts on
        the rows of the latencies either side of each percentile (at most four a bucket). The
        ranks come from a window function, which both SQLite and PostgreSQL have; reading every
        latency out of the database instead had to stop at a cap, and the summary with it."""
        t = llm_requests
        cond: list[Any] = [t.c.tenant_id == tenant_id, t.c.created_at >= start, t.c.created_at < end]
        for name in ("deployment_id", "model_id", "backend_id"):
            value = getattr(where, name)
            if value is not None:
                cond.append(t.c[name] == value)
        rows = select(self._bucket(t.c.created_at, granularity).label("period"), t.c.deployment_id,
                      t.c.latency_ms, t.c.status).where(*cond).subquery()
        bucket = (rows.c.period, rows.c.deployment_id)
        ranked = select(
            rows.c.period, rows.c.deployment_id, rows.c.latency_ms,
            (func.row_number().over(partition_by=bucket, order_by=rows.c.latency_ms) - 1).label("pos"),
            func.count().over(partition_by=bucket).label("n"),
            func.sum(case((rows.c.status != "success", 1), else_=0)).over(partition_by=bucket).label("errors"),
        ).subquery()
        wanted = []
        for q in PERCENTILES:
            lo = (ranked.c.n - 1) * q // 100  # as _ranks: integer division on both databases
            wanted += [ranked.c.pos == lo, ranked.c.pos == lo + 1]
        return (select(ranked.c.period, ranked.c.deployment_id, ranked.c.latency_ms, ranked.c.pos, ranked.c.n,
                       ranked.c.errors)
                .where(or_(*wanted)).order_by(ranked.c.period.desc(), ranked.c.deployment_id, ranked.c.pos))

    def quality_summary(self, tenant_id: str, model_id: str | None, task_type: str | None,
                        start: datetime, end: datetime, limit: int = 500) -> list[QualityRow]:
        t = llm_requests
        cond: list[Any] = [t.c.tenant_id == tenant_id, t.c.created_at >= start, t.c.created_at < end,
                           t.c.quality_score.is_not(None)]
        if model_id is not None:
            cond.append(t.c.model_id == model_id)
        if task_type is not None:
            cond.append(t.c.task_type == task_type)
        with self.db.connect() as conn:
            rows = conn.execute(
                select(t.c.model_id, t.c.task_type, func.avg(t.c.quality_score), func.min(t.c.quality_score),
                       func.max(t.c.quality_score), func.count())
                .where(*cond).group_by(t.c.model_id, t.c.task_type).order_by(t.c.model_id, t.c.task_type)
                .limit(max(1, min(limit, 1001)))
            ).all()
        return [QualityRow(model_id=r[0], task_type=r[1], avg_score=round(float(r[2]), 4),
                           min_score=round(float(r[3]), 4), max_score=round(float(r[4]), 4), sample_count=int(r[5]))
                for r in rows]

    def request_volume(self, tenant_id: str, group_by: GroupBy, start: datetime, end: datetime,
                       granularity: Granularity) -> Volume:
        t = llm_requests
        column = t.c[GROUP_COLUMNS[group_by]]
        bucket = self._bucket(t.c.created_at, granularity).label("period")
        window = (t.c.tenant_id == tenant_id, t.c.created_at >= start, t.c.created_at < end)
        with self.db.connect() as conn:
            rows = conn.execute(
                select(bucket, column, func.count(), func.coalesce(func.sum(t.c.cost_usd), 0.0))
                .where(*window)
                .group_by(bucket, column)
                .order_by(bucket.desc(), column)  # a cut drops the oldest periods, never the newest
                .limit(MAX_VOLUME_ROWS + 1)
            ).all()
            # Over the whole window, not the rows listed. Groups are catalog values (tiers,
            # models, backends, deployments): a handful to hundreds, so no limit is needed.
            totals = conn.execute(select(column, func.count(), func.coalesce(func.sum(t.c.cost_usd), 0.0))
                                  .where(*window).group_by(column).order_by(column)).all()
        cut = len(rows) > MAX_VOLUME_ROWS
        if cut:  # a period only partly inside the limit would understate its numbers: drop it whole
            oldest = rows[MAX_VOLUME_ROWS - 1][0]
            rows = [r for r in rows[:MAX_VOLUME_ROWS] if r[0] != oldest] or rows[:MAX_VOLUME_ROWS]
        out = [VolumeRow(period=self._period(r[0]), group=r[1], request_count=int(r[2]),
                         total_cost_usd=round(float(r[3]), 6)) for r in rows]
        return Volume(rows=sorted(out, key=lambda v: (v.period, v.group)), cut=cut,
                      totals={r[0]: Usage(requests=int(r[1]), cost_usd=round(float(r[2]), 6)) for r in totals})
