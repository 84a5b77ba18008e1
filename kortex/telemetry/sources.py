"""Source interfaces tools read telemetry through, and the types they return.

The embedded store implements all of them; other backends (Prometheus, Loki, ...) implement
one each and are chosen by configuration. Every method takes the tenant id first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

LEVELS: dict[str, int] = {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50}
MAX_LOG_PAGE = 100  # rfc-005 §6.1: enforced here, whatever the caller asks for


@dataclass(frozen=True, slots=True)
class LogQuery:
    product: str
    start: datetime
    end: datetime
    text: str | None = None
    min_level: str | None = None
    limit: int = MAX_LOG_PAGE
    before: tuple[datetime, int] | None = None  # keyset: (ts, id) of the last line already seen


@dataclass(frozen=True, slots=True)
class LogLine:
    id: int
    ts: datetime
    level: str
    host: str
    message: str
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class LogPage:
    lines: list[LogLine]
    total_matches: int
    has_more: bool


@dataclass(frozen=True, slots=True)
class MetricQuery:
    product: str
    metric: str
    start: datetime
    end: datetime
    labels: dict[str, str] = field(default_factory=dict)
    step_s: float | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    ts: datetime
    value: float


@dataclass(frozen=True, slots=True)
class MetricSeries:
    samples: list[Sample]
    unit: str | None


@dataclass(frozen=True, slots=True)
class Deploy:
    ts: datetime
    version: str
    actor: str
    host: str
    duration_s: float | None
    status: str
    commit: str | None
    rolled_back: bool


class LogSource(Protocol):
    def query_logs(self, tenant_id: str, query: LogQuery) -> LogPage: ...


class MetricSource(Protocol):
    def query_metric(self, tenant_id: str, query: MetricQuery) -> MetricSeries: ...

    def list_metrics(self, tenant_id: str, product: str) -> list[str]: ...


class DeploySource(Protocol):
    def list_deploys(self, tenant_id: str, product: str, start: datetime, end: datetime) -> list[Deploy]: ...


@dataclass(slots=True)
class TelemetrySources:
    """The sources a tool context carries, one per kind of telemetry."""

    logs: LogSource
    metrics: MetricSource
    deploys: DeploySource
    extra: dict[str, Any] = field(default_factory=dict)


def downsample(samples: list[Sample], step_s: float) -> list[Sample]:
    """Average samples into ``step_s`` buckets aligned to the epoch."""
    if not samples or step_s <= 0:
        return samples
    buckets: dict[int, list[float]] = {}
    anchor: dict[int, datetime] = {}
    for s in samples:
        bucket = int(s.ts.timestamp() // step_s)
        buckets.setdefault(bucket, []).append(s.value)
        anchor.setdefault(bucket, datetime.fromtimestamp(bucket * step_s, tz=s.ts.tzinfo))
    return [Sample(ts=anchor[b], value=sum(v) / len(v)) for b, v in sorted(buckets.items())]
