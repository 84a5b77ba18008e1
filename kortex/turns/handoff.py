"""What a turn step, tool run or sweep asks its shell to enqueue next.

The domain decides; the Celery shell (or any other transport) carries it out after the
database transaction that justified it has committed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

#: a W3C trace context (``traceparent``, ``tracestate``) as header pairs: the span that caused
#: the work, so the work's spans join its trace (kortex/tracing.py); empty when tracing is off
Trace = tuple[tuple[str, str], ...]

#: which queues a turn's work goes to: ``chat`` (the turns and tools queues) or ``batch`` (one
#: queue of its own, so a thousand post-mortems never wait in front of a chat turn)
Lane = Literal["chat", "batch"]


def stored_trace(traceparent: str | None) -> Trace:
    """The trace context a turn or tool call row kept (``tracing.traceparent``), as a hand-off's."""
    return (("traceparent", traceparent),) if traceparent else ()


@dataclass(frozen=True, slots=True)
class StepDispatch:
    tenant_id: str
    turn_id: str
    step: int
    trace: Trace = ()
    lane: Lane = "chat"
    #: the tenant had more live turns than ``turn.busy_tenant_turns`` when the step was handed
    #: on: its message waits behind other tenants' in the queue
    busy: bool = False


@dataclass(frozen=True, slots=True)
class ToolDispatch:
    tenant_id: str
    invocation_id: str
    tool: str
    soft_limit: float  # seconds: the worker interrupts the task
    hard_limit: float  # seconds: the worker process is killed
    trace: Trace = ()
    lane: Lane = "chat"


@dataclass(frozen=True, slots=True)
class ItemDispatch:
    """A batch job's item to start (kortex/postmortems/jobs.py): its task creates the item's
    turn, whose steps then go on the batch lane."""

    tenant_id: str
    item_id: str


@dataclass(frozen=True, slots=True)
class Handoff:
    steps: tuple[StepDispatch, ...] = ()
    tools: tuple[ToolDispatch, ...] = ()
    items: tuple[ItemDispatch, ...] = ()

    def __add__(self, other: Handoff) -> Handoff:
        return Handoff(self.steps + other.steps, self.tools + other.tools, self.items + other.items)

    def __bool__(self) -> bool:
        return bool(self.steps or self.tools or self.items)

    def traced(self, trace: Trace) -> Handoff:
        """The same work, caused by the span ``trace`` names (work already traced keeps its own)."""
        if not trace or not self:
            return self
        return Handoff(tuple(s if s.trace else replace(s, trace=trace) for s in self.steps),
                       tuple(t if t.trace else replace(t, trace=trace) for t in self.tools), self.items)


NOTHING = Handoff()
