"""The LLM-ops source over the embedded ``llm_*`` tables, tenant-scoped and bounded."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, tuple_

from kortex.storage.db import Database
from kortex.storage.schema import llm_deployments, llm_requests, llm_users
from kortex.telemetry.llmops import (
    MAX_REQUEST_PAGE,
    DeploymentFilter,
    DeploymentStatus,
    Granularity,
    GroupBy,
    LatencyBucket,
    LLMRequest,
    QualityRow,
    RequestPage,
    RequestQuery,
    TrendFilter,
    Usage,
    UserInfo,
    VolumeRow,
)

MAX_TREND_ROWS = 200_000
MAX_VOLUME_ROWS = 10_000
GROUP_COLUMNS = {"tier": "user_tier", "model": "model_id", "backend": "backend_id", "deployment": "deployment_id"}


def _percentile(ordered: list[int], q: float) -> float:
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def truncate(moment: datetime, granularity: Granularity) -> datetime:
    moment = moment.astimezone(UTC)
    if granularity == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(minute=0, second=0, microsecond=0)


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

    def deployments(self, tenant_id: str, where: DeploymentFilter, limit: int = 500) -> list[DeploymentStatus]:
        t = llm_deployments
        cond: list[Any] = [t.c.tenant_id == tenant_id]
        for name in ("model_id", "backend_id", "status"):
            value = getattr(where, name)
            if value is not None:
                cond.append(t.c[name] == value)
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*cond).order_by(t.c.deployment_id).limit(max(1, min(limit, 1001)))).all()
        return [DeploymentStatus(
            deployment_id=r.deployment_id, model_id=r.model_id, backend_id=r.backend_id, status=r.status,
            latency_p50_ms=r.latency_p50_ms, latency_p95_ms=r.latency_p95_ms, error_rate=r.error_rate,
            queue_depth=r.queue_depth, cost_per_1k_tokens=r.cost_per_1k_tokens,
            rate_limit_remaining=r.rate_limit_remaining, sample_count=r.sample_count, updated_at=r.updated_at,
        ) for r in rows]

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
        if query.before is not None:
            cond.append(tuple_(t.c.created_at, t.c.id) < tuple_(*query.before))
        with self.db.connect() as conn:
            rows = conn.execute(select(t).where(*cond).order_by(t.c.created_at.desc(), t.c.id.desc())
                                .limit(limit + 1)).all()
        return RequestPage(requests=[self._request(r) for r in rows[:limit]], has_more=len(rows) > limit)

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
                       granularity: Granularity) -> tuple[list[LatencyBucket], bool]:
        t = llm_requests
        cond: list[Any] = [t.c.tenant_id == tenant_id, t.c.created_at >= start, t.c.created_at < end]
        for name in ("deployment_id", "model_id", "backend_id"):
            value = getattr(where, name)
            if value is not None:
                cond.append(t.c[name] == value)
        # Percentiles are not portable SQL; the rows are bounded and bucketed here.
        with self.db.connect() as conn:
            rows = conn.execute(select(t.c.created_at, t.c.deployment_id, t.c.latency_ms, t.c.status)
                                .where(*cond).order_by(t.c.created_at.desc()).limit(MAX_TREND_ROWS + 1)).all()
        cut = len(rows) > MAX_TREND_ROWS
        groups: dict[tuple[datetime, str], list[tuple[int, str]]] = defaultdict(list)
        for r in rows[:MAX_TREND_ROWS]:
            groups[(truncate(r.created_at, granularity), r.deployment_id)].append((r.latency_ms, r.status))
        out = []
        for (period, deployment), items in sorted(groups.items()):
            latencies = sorted(lat for lat, _ in items)
            errors = sum(1 for _, status in items if status != "success")
            out.append(LatencyBucket(period=period, deployment_id=deployment, request_count=len(items),
                                     latency_p50_ms=round(_percentile(latencies, 0.5), 1),
                                     latency_p95_ms=round(_percentile(latencies, 0.95), 1),
                                     error_rate=round(errors / len(items), 4)))
        return out, cut

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
                       granularity: Granularity) -> tuple[list[VolumeRow], bool]:
        t = llm_requests
        column = t.c[GROUP_COLUMNS[group_by]]
        bucket = self._bucket(t.c.created_at, granularity).label("period")
        with self.db.connect() as conn:
            rows = conn.execute(
                select(bucket, column, func.count(), func.coalesce(func.sum(t.c.cost_usd), 0.0))
                .where(t.c.tenant_id == tenant_id, t.c.created_at >= start, t.c.created_at < end)
                .group_by(bucket, column)
                .order_by(bucket.desc(), column)  # a cut drops the oldest periods, never the newest
                .limit(MAX_VOLUME_ROWS + 1)
            ).all()
        cut = len(rows) > MAX_VOLUME_ROWS
        if cut:  # a period only partly inside the limit would understate its numbers: drop it whole
            oldest = rows[MAX_VOLUME_ROWS - 1][0]
            rows = [r for r in rows[:MAX_VOLUME_ROWS] if r[0] != oldest] or rows[:MAX_VOLUME_ROWS]
        out = [VolumeRow(period=self._period(r[0]), group=r[1], request_count=int(r[2]),
                         total_cost_usd=round(float(r[3]), 6)) for r in rows]
        return sorted(out, key=lambda v: (v.period, v.group)), cut
