"""Ingest into the embedded store: validate a batch of one kind, then write it in chunks.

A batch is all-or-nothing: any invalid item rejects the whole batch with the index, field
and reason of each bad item (the first 50), so a client can fix and resend it. Append-only
kinds (logs, metrics, deploys) are inserted; kinds with a natural key (spans, incidents,
products, LLM-ops rows) are upserted or deduplicated on it, so a resent batch is harmless.
"""

from __future__ import annotations

import json
import math
from abc import abstractmethod
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from kortex.errors import InvalidInput
from kortex.nesting import MAX_DEPTH, deeper_than
from kortex.storage.schema import (
    llm_deployments,
    llm_requests,
    llm_users,
    telemetry_deploys,
    telemetry_incidents,
    telemetry_logs,
    telemetry_metrics,
    telemetry_products,
    telemetry_spans,
)
from kortex.telemetry.embedded_metrics import labels_key
from kortex.telemetry.sources import (
    DEPLOYMENT_PATTERN,
    ID_MAX,
    ID_PATTERN,
    LEVELS,
    METRIC_PATTERN,
    PRODUCT_PATTERN,
)
from kortex.timeparse import ensure_utc

MAX_ITEMS = 5000
CHUNK = 1000
MAX_ERRORS = 50
FUTURE_SKEW = timedelta(minutes=5)
MAX_AGE = timedelta(days=400)
MAX_JSON_BYTES = 8 * 1024
#: The largest value of an INTEGER column (32-bit on PostgreSQL; SQLite would take more, so
#: without this bound a batch that passes in tests fails on the real database).
INT32_MAX = 2**31 - 1
#: Bounds on floats: far beyond any real figure, far below where the tools' sums and averages
#: overflow to infinity (which JSON cannot carry).
MAX_MS = 86_400_000.0  # a day, as the span duration's bound
MAX_USD = 1e9
MAX_METRIC = 1e18  # room for large byte counters

# The tools' argument types use the same patterns (sources.py): what is stored can be asked about.
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=PRODUCT_PATTERN)]
Id = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN)]
LongId = Annotated[str, Field(min_length=1, max_length=100, pattern=ID_PATTERN)]
UserId = Annotated[str, Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
DeploymentId = Annotated[str, Field(min_length=3, max_length=200, pattern=DEPLOYMENT_PATTERN)]


class _FieldError(Exception):
    """An item's error that pydantic cannot place (it spans fields, or is found after validation)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("timestamp needs a time zone, e.g. 2026-04-07T14:31:02Z")
    try:
        return ensure_utc(value)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is in year 0 in UTC; pydantic turns only ValueError into
        # a validation error naming the field, anything else into a 500
        raise ValueError("timestamp is out of range") from None


def _small_json(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    # Before the size: 8 KiB nests a thousand levels deep, which json.dumps cannot even measure,
    # and which the tools could store but never return (kortex/nesting.py).
    if deeper_than(value):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        # PostgreSQL's jsonb refuses the NaN and Infinity that Python's json writes by default.
        size = len(json.dumps(value, default=str, allow_nan=False))
    except ValueError:
        raise ValueError("contains a non-finite number (NaN or Infinity)") from None
    if size > MAX_JSON_BYTES:
        raise ValueError(f"larger than {MAX_JSON_BYTES} bytes as JSON")
    return value


Timestamp = Annotated[datetime, AfterValidator(_aware)]
SmallJSON = Annotated[dict[str, Any] | None, AfterValidator(_small_json)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Millis = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]
USD = Annotated[float, Field(ge=0, le=MAX_USD, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    @abstractmethod
    def row(self) -> dict[str, Any]:
        """The item as its table's row."""


class LogItem(_Item):
    product: Name
    ts: Timestamp
    level: Literal["debug", "info", "warn", "error", "fatal"]
    message: str = Field(min_length=1, max_length=16_384)
    host: str = Field("", max_length=200)
    trace_id: Id | None = None
    attrs: SmallJSON = None

    def row(self) -> dict[str, Any]:
        return {**self.model_dump(), "severity": LEVELS[self.level]}


class MetricItem(_Item):
    product: Name
    metric: str = Field(min_length=1, max_length=200, pattern=METRIC_PATTERN)
    ts: Timestamp
    value: float
    unit: str | None = Field(None, max_length=32)
    labels: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")],
                 Annotated[str, Field(max_length=200)]] = Field(default_factory=dict, max_length=20)

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("value must be a finite number")
        if abs(value) > MAX_METRIC:
            raise ValueError(f"value must be between -{MAX_METRIC:g} and {MAX_METRIC:g}")
        return value

    def row(self) -> dict[str, Any]:
        return self.model_dump()


class SpanItem(_Item):
    trace_id: Id
    span_id: Id
    parent_span_id: Id | None = None
    request_id: LongId | None = None
    service: Name
    operation: str = Field(min_length=1, max_length=200)
    start: Timestamp
    duration_us: int = Field(ge=0, le=86_400_000_000)
    status: Literal["ok", "error"] = "ok"
    error_message: str | None = Field(None, max_length=4096)
    tags: SmallJSON = None

    def row(self) -> dict[str, Any]:
        data = self.model_dump()
        data["start_ts"] = data.pop("start")
        return data


class DeployItem(_Item):
    product: Name
    ts: Timestamp
    version: str = Field(min_length=1, max_length=100)
    actor: str = Field("", max_length=200)
    host: str = Field("", max_length=200)
    duration_s: float | None = Field(None, ge=0, le=86_400, allow_inf_nan=False)
    status: Literal["ok", "failed", "in_progress"] = "ok"
    commit: str | None = Field(None, max_length=64)
    rolled_back: bool = False

    def row(self) -> dict[str, Any]:
        return self.model_dump()


class IncidentItem(_Item):
    ref: Id = Field(description="The incident's own id, e.g. INC-1042; resending it updates the incident")
    product: Name | None = None
    title: str = Field(min_length=1, max_length=500)
    severity: Literal["info", "warn", "error", "critical"] = "warn"
    opened_at: Timestamp
    closed_at: Timestamp | None = None
    findings: str = Field("", max_length=16_384)
    resolution: str = Field("", max_length=16_384)
    target_type: Literal["product", "deployment", "model", "backend"] | None = None
    target_id: UserId | None = None

    def row(self) -> dict[str, Any]:
        if self.closed_at is not None and self.closed_at < self.opened_at:
            raise _FieldError("closed_at", "closed_at is before opened_at")
        return self.model_dump()


class ProductInfoItem(_Item):
    product: Name
    info: dict[str, Any] = Field(description="The product's /admin/info envelope")
    updated_at: Timestamp

    @field_validator("info")
    @classmethod
    def _size(cls, value: dict[str, Any]) -> dict[str, Any]:
        _small_json(value)
        return value

    def row(self) -> dict[str, Any]:
        return self.model_dump()


class LLMDeploymentItem(_Item):
    deployment_id: DeploymentId
    model_id: LongId
    backend_id: LongId
    status: Literal["healthy", "degraded", "down"]
    latency_p50_ms: Millis | None = None
    latency_p95_ms: Millis | None = None
    error_rate: Fraction | None = None
    queue_depth: Count | None = None
    cost_per_1k_tokens: USD | None = None
    rate_limit_remaining: Count | None = None
    sample_count: Count = 0
    updated_at: Timestamp

    def row(self) -> dict[str, Any]:
        return self.model_dump()


class LLMUserItem(_Item):
    user_id: UserId
    tier: Literal["premium", "standard", "budget"]
    latency_sla_ms: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    daily_budget_usd: USD | None = None

    def row(self) -> dict[str, Any]:
        return self.model_dump()


class LLMRequestItem(_Item):
    request_id: LongId
    user_id: UserId
    user_tier: Literal["premium", "standard", "budget"]
    deployment_id: DeploymentId
    model_id: LongId
    backend_id: LongId
    task_type: str = Field("", max_length=50, pattern=f"^$|{ID_PATTERN}")
    input_tokens: Count = 0
    output_tokens: Count = 0
    cost_usd: USD = 0.0
    latency_ms: Count
    status: Literal["success", "error", "timeout"]
    quality_score: Fraction | None = None
    router_version: str | None = Field(None, max_length=50)
    experiment_id: str | None = Field(None, max_length=100)
    routing: SmallJSON = None
    created_at: Timestamp

    def row(self) -> dict[str, Any]:
        return self.model_dump()


# kind -> (item model, table, natural key or None, on a key clash: "update" | "ignore", timestamp fields)
KINDS: dict[str, tuple[type[_Item], Table, tuple[str, ...] | None, str, tuple[str, ...]]] = {
    "logs": (LogItem, telemetry_logs, None, "", ("ts",)),
    "metrics": (MetricItem, telemetry_metrics, None, "", ("ts",)),
    "spans": (SpanItem, telemetry_spans, ("tenant_id", "trace_id", "span_id"), "ignore", ("start",)),
    "deploys": (DeployItem, telemetry_deploys, None, "", ("ts",)),
    "incidents": (IncidentItem, telemetry_incidents, ("tenant_id", "ref"), "update", ("opened_at", "closed_at")),
    "products": (ProductInfoItem, telemetry_products, ("tenant_id", "product"), "update", ("updated_at",)),
    "llm-deployments": (LLMDeploymentItem, llm_deployments, ("tenant_id", "deployment_id"), "update",
                        ("updated_at",)),
    "llm-users": (LLMUserItem, llm_users, ("tenant_id", "user_id"), "update", ()),
    "llm-requests": (LLMRequestItem, llm_requests, ("tenant_id", "request_id"), "ignore", ("created_at",)),
}
_ADAPTERS = {kind: TypeAdapter(spec[0]) for kind, spec in KINDS.items()}


def kind_spec(kind: str) -> tuple[type[_Item], Table, tuple[str, ...] | None, str, tuple[str, ...]]:
    try:
        return KINDS[kind]
    except KeyError:
        raise InvalidInput(f"unknown ingest kind {kind!r}; use one of {', '.join(KINDS)}") from None


def _nul_at(value: Any, path: str = "", depth: int = 0) -> str | None:
    """Where in an item a NUL character hides (PostgreSQL text and jsonb cannot store it), if
    anywhere. Not below ``MAX_DEPTH`` (the item is one level more): no field takes data that
    deep, and its validation says so, where looking on would recurse without bound."""
    if isinstance(value, str):
        return path or "item" if "\x00" in value else None
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, dict):
        for key, inner in value.items():
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return where
            found = _nul_at(inner, where, depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for n, inner in enumerate(value):
            found = _nul_at(inner, f"{path}.{n}" if path else str(n), depth + 1)
            if found:
                return found
    return None


def validate_batch(kind: str, items: Sequence[Any], *, now: datetime) -> list[dict[str, Any]]:
    """Rows ready to insert, or ``InvalidInput`` whose details name every bad item."""
    _model, _table, _key, _clash, times = kind_spec(kind)
    if not items:
        raise InvalidInput("items is empty; send 1 to 5000 items")
    if len(items) > MAX_ITEMS:
        raise InvalidInput(f"{len(items)} items in one batch; send at most {MAX_ITEMS}")
    adapter = _ADAPTERS[kind]
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for index, raw in enumerate(items):
        try:
            nul = _nul_at(raw)
            if nul is not None:
                raise _FieldError(nul, "contains a NUL character")
            item = adapter.validate_python(raw)
            for name in times:
                value = getattr(item, name)
                if value is not None and value > now + FUTURE_SKEW:
                    raise _FieldError(name, f"{name} is in the future ({value.isoformat()})")
                if value is not None and value < now - MAX_AGE:
                    raise _FieldError(name, f"{name} is older than {MAX_AGE.days} days")
            rows.append(item.row())
        except ValidationError as exc:
            for err in exc.errors()[:5]:
                errors.append({"index": index, "field": ".".join(str(p) for p in err.get("loc", ())) or None,
                               "message": err.get("msg", "invalid")})
        except _FieldError as exc:
            errors.append({"index": index, "field": exc.field, "message": exc.message})
        except ValueError as exc:
            errors.append({"index": index, "field": None, "message": str(exc)})
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        bad = sorted({e["index"] for e in errors})
        raise InvalidInput(f"{len(bad)}{'+' if len(errors) >= MAX_ERRORS else ''} of {len(items)} {kind} items are "
                           f"invalid (first: item {bad[0]}); nothing was stored", code="invalid_items",
                           details=errors)
    return rows


def write(conn: Connection, tenant_id: str, kind: str, rows: Sequence[dict[str, Any]]) -> int:
    """Insert ``rows`` for ``tenant_id`` in chunks, in the caller's transaction."""
    _model, table, key, clash, _times = kind_spec(kind)
    for start in range(0, len(rows), CHUNK):
        chunk = [{**r, "tenant_id": tenant_id} for r in rows[start:start + CHUNK]]
        if table is telemetry_metrics:  # a series' identity, and what label filters search
            chunk = [{**r, "labels_key": labels_key(r.get("labels"))} for r in chunk]
        if key is None:
            conn.execute(table.insert(), chunk)
            continue
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(table)
        if clash == "ignore":
            stmt = stmt.on_conflict_do_nothing(index_elements=list(key))
        else:
            columns = [c for c in chunk[0] if c not in key]
            stmt = stmt.on_conflict_do_update(index_elements=list(key),
                                              set_={c: stmt.excluded[c] for c in columns})
        conn.execute(stmt, chunk)
    return len(rows)
