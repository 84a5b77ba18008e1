"""What a turn step, tool run or sweep asks its shell to enqueue next.

The domain decides; the Celery shell (or any other transport) carries it out after the
database transaction that justified it has committed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: a W3C trace context (``traceparent``, ``tracestate``) as header pairs: the span that caused
#: the work, so the work's spans join its trace (kortex/tracing.py); empty when tracing is off
Trace = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class StepDispatch:
    tenant_id: str
    turn_id: str
    step: int
    trace: Trace = ()


@dataclass(frozen=True, slots=True)
class ToolDispatch:
    tenant_id: str
    invocation_id: str
    tool: str
    soft_limit: float  # seconds: the worker interrupts the task
    hard_limit: float  # seconds: the worker process is killed
    trace: Trace = ()


@dataclass(frozen=True, slots=True)
class Handoff:
    steps: tuple[StepDispatch, ...] = ()
    tools: tuple[ToolDispatch, ...] = ()

    def __add__(self, other: Handoff) -> Handoff:
        return Handoff(self.steps + other.steps, self.tools + other.tools)

    def __bool__(self) -> bool:
        return bool(self.steps or self.tools)

    def traced(self, trace: Trace) -> Handoff:
        """The same work, caused by the span ``trace`` names (work already traced keeps its own)."""
        if not trace or not self:
            return self
        return Handoff(tuple(s if s.trace else replace(s, trace=trace) for s in self.steps),
                       tuple(t if t.trace else replace(t, trace=trace) for t in self.tools))


NOTHING = Handoff()
