"""Source interfaces tools read telemetry through, and the types they return.

The embedded store implements all of them; other backends (Prometheus, Loki, ...) implement
one each and are chosen by configuration. Every method takes the tenant id first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kortex.telemetry.llmops import LLMOpsSource
    from kortex.telemetry.logql import LogFilter

# What names and identifiers may look like, shared by ingest and the tools' arguments so that
# every id the store accepts can be asked about. Values only ever travel as bound SQL
# parameters or escaped PromQL/LogQL strings; the patterns keep out whitespace, quotes,
# backslashes and braces anyway. Ids cover real ones: "meta-llama/Llama-3-70b", "a+b@x.com",
# "claude-3-5-sonnet@20240620", "arn:aws:bedrock:...:model/x:1", base64 with "=".
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+/=~-]*$"
#: a deployment is "<model>/<backend>"; the model may hold "/", the backend may not
DEPLOYMENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+/=~-]*/[A-Za-z0-9][A-Za-z0-9._:@+=~-]*$"
PRODUCT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$"
METRIC_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:.]*$"
ID_MAX = 200

LEVELS: dict[str, int] = {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50}
MAX_LOG_PAGE = 100  # rfc-005 §6.1: enforced here, whatever the caller asks for
MAX_TRACE_SPANS = 2000  # a trace larger than this is cut (and says so)
#: points a metric query returns at most, whatever the source: without a step, a bucket is
#: span / MAX_BUCKETS wide, so minute samples keep their own point for windows up to ~33 h
MAX_BUCKETS = 2000


@dataclass(frozen=True, slots=True)
class LogQuery:
    """``product`` or ``trace_id`` (or both) narrow the lines; ``filter`` is a parsed LogQL query."""

    product: str | None
    start: datetime
    end: datetime
    filter: LogFilter | None = None
    min_level: str | None = None
    limit: int = MAX_LOG_PAGE
    before: tuple[datetime, int] | None = None  # keyset: (ts, id) of the last line already seen
    trace_id: str | None = None


@dataclass(frozen=True, slots=True)
class LogLine:
    id: int
    ts: datetime
    level: str
    host: str
    message: str
    trace_id: str | None = None
    product: str | None = None


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
    series: int = 1  # how many series matched; several are averaged into one
    truncated: bool = False  # a cap cut the oldest part of the window


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


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    service: str
    operation: str
    start: datetime
    duration_us: int
    status: str
    error_message: str | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class Trace:
    trace_id: str
    spans: list[Span]  # ordered by start time, then span id
    truncated: bool = False
    #: when ``truncated``: how many spans the trace has and when its last one ends (the spans
    #: listed are only the first ones; None: the spans listed are all of them)
    span_total: int | None = None
    ends_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Incident:
    ref: str
    product: str | None
    title: str
    severity: str
    opened_at: datetime
    closed_at: datetime | None
    findings: str
    resolution: str
    target_type: str | None = None
    target_id: str | None = None


@dataclass(frozen=True, slots=True)
class IncidentQuery:
    text: str
    product: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    limit: int = 10
    after: tuple[Any, ...] | None = None  # keyset position of the last hit already seen


@dataclass(frozen=True, slots=True)
class IncidentHit:
    incident: Incident
    score: float
    position: tuple[Any, ...]  # JSON-safe keyset position, for the next page


@dataclass(frozen=True, slots=True)
class IncidentPage:
    hits: list[IncidentHit]
    has_more: bool


class LogSource(Protocol):
    def query_logs(self, tenant_id: str, query: LogQuery) -> LogPage: ...


class MetricSource(Protocol):
    def query_metric(self, tenant_id: str, query: MetricQuery) -> MetricSeries: ...

    def list_metrics(self, tenant_id: str, product: str) -> list[str]: ...


class DeploySource(Protocol):
    def list_deploys(self, tenant_id: str, product: str, start: datetime, end: datetime,
                     limit: int = 200) -> list[Deploy]:
        """Newest first, at most ``limit``."""


class TraceSource(Protocol):
    def get_trace(self, tenant_id: str, request_id: str) -> Trace | None:
        """The trace with this trace id, or whose root carries this correlation id."""
        ...


class IncidentSource(Protocol):
    def search_incidents(self, tenant_id: str, query: IncidentQuery) -> IncidentPage: ...

    def incidents_at(self, tenant_id: str, at: datetime | None, *, target_type: str | None = None,
                     target_ids: tuple[str, ...] = (), limit: int = 100) -> list[Incident]:
        """Incidents open at ``at`` (None: open now), optionally only those about some targets."""
        ...

    def count_incidents_at(self, tenant_id: str, at: datetime | None, *, target_type: str | None = None,
                           target_ids: tuple[str, ...] = ()) -> int:
        """How many incidents ``incidents_at`` matches in all, past any limit."""
        ...

    def select_incidents(self, tenant_id: str, *, refs: tuple[str, ...] = (), product: str | None = None,
                         severity: str | None = None, start: datetime | None = None, end: datetime | None = None,
                         limit: int = 1000) -> list[Incident]:
        """Incidents by their refs, or those that opened in [start, end) matching the filters,
        oldest first (a batch of post-mortems, kortex/postmortems/jobs.py)."""
        ...


class AdminInfoSource(Protocol):
    def get_admin_info(self, tenant_id: str, product: str) -> dict[str, Any] | None:
        """The product's last reported /admin/info envelope, or None for an unknown product."""
        ...


@dataclass(frozen=True, slots=True)
class ProductSeen:
    product: str
    seen_in: tuple[str, ...]  # which kinds of telemetry name it: metrics, logs, deploys, admin, incidents
    last_seen: datetime


class ProductSource(Protocol):
    def list_products(self, tenant_id: str, start: datetime, end: datetime, *, limit: int) -> list[ProductSeen]:
        """Products the tenant's telemetry names in the window, most recently seen first."""
        ...


@dataclass(slots=True)
class TelemetrySources:
    """The sources a tool context carries, one per kind of telemetry."""

    logs: LogSource
    metrics: MetricSource
    deploys: DeploySource
    traces: TraceSource
    incidents: IncidentSource
    admin: AdminInfoSource
    llmops: LLMOpsSource
    products: ProductSource | None = None  # None: nothing can list what exists
    extra: dict[str, Any] = field(default_factory=dict)

    def _each(self) -> list[Any]:
        """Every source once (one object may serve several kinds), ``extra`` ones included."""
        every = (self.logs, self.metrics, self.deploys, self.traces, self.incidents, self.admin, self.llmops,
                 self.products, *self.extra.values())
        return list({id(s): s for s in every if s is not None}.values())

    def close(self) -> None:
        """Release what remote sources hold (HTTP connection pools)."""
        seen: set[int] = set()
        for source in (self.logs, self.metrics, self.deploys, self.traces, self.incidents, self.admin, self.llmops):
            close = getattr(source, "close", None)
            if close is not None and id(source) not in seen:
                seen.add(id(source))
                close()

    def without_secrets(self, text: str) -> str:
        """``text`` without the credentials the sources send (a Prometheus or Loki bearer token),
        word for word in every spelling: the net under what each source cleans of what it quotes."""
        for source in self._each():
            forget = getattr(source, "without_secrets", None)
            if callable(forget):
                text = forget(text)
        return text


def downsample(samples: list[Sample], step_s: float, origin: datetime | None = None) -> list[Sample]:
    """Average samples into ``step_s`` buckets aligned to ``origin`` (the window's start, as
    the sources align theirs), or to the epoch."""
    if not samples or step_s <= 0:
        return samples
    zero = origin.timestamp() if origin is not None else 0.0
    buckets: dict[int, list[float]] = {}
    for s in samples:
        buckets.setdefault(int((s.ts.timestamp() - zero) // step_s), []).append(s.value)
    tz = samples[0].ts.tzinfo
    return [Sample(ts=datetime.fromtimestamp(zero + b * step_s, tz=tz), value=sum(v) / len(v))
            for b, v in sorted(buckets.items())]
