"""Typed rows handed out by the repositories."""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, Self

from sqlalchemy.engine import Row


@dataclass(frozen=True, slots=True)
class Spent:
    """What the tenant has spent on LLM calls today and the session in tokens, with the tenant's
    own settings (its narrower limits): what the budget checks before a turn is admitted and
    before every LLM call (kortex/budget.py), read with the statement that admits or claims."""

    usd_today: float
    session_tokens: int
    tenant_settings: dict[str, Any] | None


class _Record:
    # Every record is a dataclass; this tells the type checker so (dataclasses.fields takes it).
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def from_row(cls, row: Row[Any]) -> Self:
        mapping = row._mapping
        return cls(**{f.name: mapping[f.name] for f in fields(cls) if f.name in mapping})


@dataclass(frozen=True, slots=True)
class TenantRecord(_Record):
    id: str
    name: str
    disabled: bool
    settings: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SessionRecord(_Record):
    id: str
    tenant_id: str
    name: str
    model: str | None
    turn_count: int
    created_at: datetime
    updated_at: datetime


ACTIVE = ("queued", "running", "waiting_tools")
TERMINAL = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class TurnRecord(_Record):
    id: str
    tenant_id: str
    session_id: str
    turn_no: int
    status: str
    step: int
    attempt: int
    lease_until: datetime | None
    pending_tools: int
    model: str | None
    model_used: str | None
    error: dict[str, Any] | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    deadline_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    done_event_id: str | None = None
    #: the outbox holds events of this turn that Redis refused (known when a step is claimed)
    kept_events: bool = False
    profile: str = "chat"  # kortex/turns/profiles.py
    traceparent: str | None = None  # the span that posted it (kortex/tracing.py)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True, slots=True)
class MessageRecord(_Record):
    id: str
    session_id: str
    turn_id: str
    turn_no: int
    step: int
    ord: int
    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    tool_name: str | None
    result: Any
    is_error: bool
    error_code: str | None
    truncated: bool
    created_at: datetime
    grounding: dict[str, Any] | None = None  # a final answer's checked citations


@dataclass(frozen=True, slots=True)
class InvocationRecord(_Record):
    id: str
    tenant_id: str
    session_id: str
    turn_id: str
    turn_no: int
    step: int
    idx: int
    call_id: str
    name: str
    arguments: dict[str, Any]
    arguments_error: str | None
    status: str
    attempts: int
    deadline_at: datetime | None
    profile: str = "chat"  # its turn's (kortex/turns/profiles.py)
    traceparent: str | None = None  # the step span that made the call (kortex/tracing.py)


@dataclass(frozen=True, slots=True)
class JobRecord(_Record):
    id: str
    tenant_id: str
    status: str
    selection: dict[str, Any]
    model: str | None
    max_usd: float | None
    concurrency: int
    template: str | None
    force: bool
    created_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class ItemRecord(_Record):
    id: str
    tenant_id: str
    job_id: str
    position: int
    incident_ref: str
    incident: dict[str, Any]
    status: str
    turn_id: str | None
    error: dict[str, Any] | None
    cost_usd: float
    dispatched_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class PostmortemRecord(_Record):
    id: str
    tenant_id: str
    item_id: str | None
    job_id: str | None
    turn_id: str | None
    incident_ref: str
    document: dict[str, Any]
    grounding: dict[str, Any] | None
    created_at: datetime
