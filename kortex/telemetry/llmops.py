"""The LLM-ops source interface (llm-ops-agent-tools.md): deployments of an LLM platform, the
requests they served, its users, and aggregates over them. Every method takes the tenant first.

Aggregates are part of the interface (not computed by the tools) so a backend with its own
analytics can answer them natively."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

Granularity = Literal["hour", "day"]
GroupBy = Literal["tier", "model", "backend", "deployment"]
MAX_REQUEST_PAGE = 100


@dataclass(frozen=True, slots=True)
class DeploymentFilter:
    model_id: str | None = None
    backend_id: str | None = None
    status: str | None = None


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    deployment_id: str
    model_id: str
    backend_id: str
    status: str
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    error_rate: float | None
    queue_depth: int | None
    cost_per_1k_tokens: float | None
    rate_limit_remaining: int | None
    sample_count: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class RequestQuery:
    start: datetime
    end: datetime
    user_id: str | None = None
    user_tier: str | None = None
    deployment_id: str | None = None
    model_id: str | None = None
    backend_id: str | None = None
    status: str | None = None
    limit: int = 50
    before: tuple[datetime, int] | None = None  # keyset: (created_at, row id) of the last one seen


@dataclass(frozen=True, slots=True)
class LLMRequest:
    row_id: int
    request_id: str
    user_id: str
    user_tier: str
    deployment_id: str
    model_id: str
    backend_id: str
    task_type: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    latency_ms: int
    status: str
    quality_score: float | None
    router_version: str | None
    experiment_id: str | None
    routing: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RequestPage:
    requests: list[LLMRequest]
    has_more: bool
    total_matches: int = 0  # every request the query matches, on every page


@dataclass(frozen=True, slots=True)
class UserInfo:
    user_id: str
    tier: str
    latency_sla_ms: int | None
    daily_budget_usd: float | None


@dataclass(frozen=True, slots=True)
class Usage:
    requests: int
    cost_usd: float


@dataclass(frozen=True, slots=True)
class TrendFilter:
    deployment_id: str | None = None
    model_id: str | None = None
    backend_id: str | None = None


@dataclass(frozen=True, slots=True)
class LatencyBucket:
    period: datetime
    deployment_id: str
    request_count: int
    latency_p50_ms: float
    latency_p95_ms: float
    error_rate: float


@dataclass(frozen=True, slots=True)
class LatencyTrend:
    """Buckets per (period, deployment), oldest first, and figures over every matching request:
    a cut leaves the oldest periods out of ``buckets``, never out of the figures."""

    buckets: list[LatencyBucket]
    cut: bool
    total_requests: int
    avg_latency_p50_ms: float | None  # the buckets' p50, weighted by their request counts
    avg_latency_p95_ms: float | None


@dataclass(frozen=True, slots=True)
class QualityRow:
    model_id: str
    task_type: str
    avg_score: float
    min_score: float
    max_score: float
    sample_count: int


@dataclass(frozen=True, slots=True)
class VolumeRow:
    period: datetime
    group: str
    request_count: int
    total_cost_usd: float


@dataclass(frozen=True, slots=True)
class Volume:
    """Rows per (period, group), oldest first, and each group's totals over the whole window: a
    cut leaves the oldest periods out of ``rows`` (a cut always keeps the newest), never out of
    ``totals``."""

    rows: list[VolumeRow]
    cut: bool
    totals: dict[str, Usage]


class LLMOpsSource(Protocol):
    def deployments(self, tenant_id: str, where: DeploymentFilter, limit: int = 500) -> list[DeploymentStatus]:
        """Ordered by deployment id, at most ``limit``."""
        ...

    def deployment_counts(self, tenant_id: str, where: DeploymentFilter) -> dict[str, int]:
        """How many deployments match, by status (every one, not a page of them)."""
        ...

    def requests(self, tenant_id: str, query: RequestQuery) -> RequestPage:
        """A page, newest first, with how many requests match in all."""
        ...

    def request(self, tenant_id: str, request_id: str) -> LLMRequest | None: ...

    def user(self, tenant_id: str, user_id: str) -> UserInfo | None: ...

    def user_usage(self, tenant_id: str, user_id: str, start: datetime, end: datetime) -> Usage: ...

    def latency_trends(self, tenant_id: str, where: TrendFilter, start: datetime, end: datetime,
                       granularity: Granularity) -> LatencyTrend: ...

    def quality_summary(self, tenant_id: str, model_id: str | None, task_type: str | None,
                        start: datetime, end: datetime, limit: int = 500) -> list[QualityRow]: ...

    def request_volume(self, tenant_id: str, group_by: GroupBy, start: datetime, end: datetime,
                       granularity: Granularity) -> Volume: ...
