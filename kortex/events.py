"""Stream events published for a turn; the ``type`` field is the SSE ``event:`` name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kortex.messages import Usage


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the SSE event name; each event narrows it to its own literal
    type: str

    # Stamped by the stream store as it appends (see kortex/stream/store.py), never by the
    # publisher: ``attempt`` is the step attempt that wrote the event (the turn's fence at that
    # moment) and ``seq`` counts the turn's events from 1. A client drops events whose attempt
    # is below one it has already seen; gaps in ``seq`` tell it something is missing.
    attempt: int = 0
    seq: int = 0


class TurnEvent(_Event):
    """A step started running (``status`` is ``running``): once per step attempt. That the turn
    waits for tools is told by its ``tool_call`` events; GET /v1/turns/{id} has its status."""

    type: Literal["turn"] = "turn"
    turn_id: str
    status: str
    step: int
    # A step re-run after its worker died streams again under a higher ``attempt``: clients
    # drop the earlier attempt's text of that step when this event arrives.
    model: str | None = None


class TextEvent(_Event):
    type: Literal["text"] = "text"
    step: int
    delta: str


class ToolCallEvent(_Event):
    type: Literal["tool_call"] = "tool_call"
    step: int
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolProgressEvent(_Event):
    """A tool is still running past the interim threshold (rfc-005 §6.1)."""

    type: Literal["tool_progress"] = "tool_progress"
    step: int
    call_id: str
    name: str
    elapsed_ms: int
    message: str


class ToolResultEvent(_Event):
    type: Literal["tool_result"] = "tool_result"
    step: int
    call_id: str
    name: str
    is_error: bool = False
    error_code: str | None = None
    truncated: bool = False
    elapsed_ms: int = 0
    content: Any = None


class ProposalEvent(_Event):
    type: Literal["proposal"] = "proposal"
    proposal_id: str
    call_id: str
    action: str
    product: str
    params: dict[str, Any] = Field(default_factory=dict)
    rationale: str = ""
    blast_radius: str | None = None
    reversible: bool | None = None
    expires_at: str


class ErrorEvent(_Event):
    """A failure that ends the turn (``fatal``, followed by a failed ``done``), or a notice the
    client should show while the turn goes on: failover, escalation, a cut-off answer."""

    type: Literal["error"] = "error"
    code: str
    message: str
    retryable: bool = False
    fatal: bool = True


class RouteEvent(_Event):
    """The router chose this step's model (``model: "auto"``, kortex/llm/routing.py)."""

    type: Literal["route"] = "route"
    step: int
    model: str = Field(description="provider:model that answers the step")
    tier: str
    reason: str
    estimated_cost_usd: float
    fallback: str | None = Field(None, description="provider:model used if the first fails or is too slow")
    complexity: str
    position: str = Field(description="plan (first step), digest (tool results to read) or answer (last step)")


class AnomalyEvent(_Event):
    """A check of the step found something off (kortex/turns/anomalies.py)."""

    type: Literal["anomaly"] = "anomaly"
    step: int
    kind: str = Field(description="cost_overrun, latency_spike, empty_answer, short_answer, uncited_answer, "
                                  "repeated_tool_call, context_degradation, chain_depth")
    severity: Literal["low", "medium", "high", "critical"]
    message: str
    recommended: Literal["continue", "retry", "fallback", "rollback", "escalate"]


class RecoveryEvent(_Event):
    """What the recovery policy did about an anomaly. ``retry`` and ``fallback`` run the model
    again as a new visible attempt: text after this event replaces nothing already shown."""

    type: Literal["recovery"] = "recovery"
    step: int
    action: Literal["continue", "retry", "fallback", "rollback", "escalate"]
    anomaly: str
    message: str
    model: str | None = None


DoneStatus = Literal["done", "failed", "cancelled"]


def done_status(turn_status: str) -> DoneStatus:
    """The ``done`` event's status for a finished turn's status."""
    if turn_status == "failed":
        return "failed"
    if turn_status == "cancelled":
        return "cancelled"
    return "done"


class CitationOut(BaseModel):
    id: str
    tool: str | None = Field(None, description="the cited call's tool; null: no call of this turn has this id")
    ok: bool = Field(description="the id names a call of this turn whose result was not an error")


class GroundingOut(BaseModel):
    cited: int = Field(description="citations that name a successful call of this turn")
    dangling: list[str] = Field(default_factory=list, description="cited ids of no call of the turn, or of failed ones")
    uncited_numbers: list[str] = Field(default_factory=list,
                                       description="numbers the answer quotes that no tool result holds")


#: the event types a step writes before its model's first output: the SSE hub reads a stream
#: unpaced until something else arrives (kortex/stream/hub.py), so the first answer is not
#: held by a busy process's paced reads
PREAMBLE: frozenset[str] = frozenset({"turn", "route", "anomaly"})


class DoneEvent(_Event):
    type: Literal["done"] = "done"
    status: DoneStatus
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None
    # A finished answer's citations as the server checked them (kortex/turns/grounding.py).
    citations: list[CitationOut] | None = None
    grounding: GroundingOut | None = None


Event = Annotated[
    TurnEvent | TextEvent | ToolCallEvent | ToolProgressEvent | ToolResultEvent | ProposalEvent
    | ErrorEvent | RouteEvent | AnomalyEvent | RecoveryEvent | DoneEvent,
    Field(discriminator="type"),
]
EventAdapter: TypeAdapter[Event] = TypeAdapter(Event)

EVENT_TYPES = ("turn", "text", "tool_call", "tool_progress", "tool_result", "proposal", "error", "done")


def event_to_json(event: _Event) -> str:
    return event.model_dump_json()


def event_from_json(data: str | bytes) -> Event:
    return EventAdapter.validate_json(data)
