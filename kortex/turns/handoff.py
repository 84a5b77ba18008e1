"""What a turn step, tool run or sweep asks its shell to enqueue next.

The domain decides; the Celery shell (or any other transport) carries it out after the
database transaction that justified it has committed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepDispatch:
    tenant_id: str
    turn_id: str
    step: int


@dataclass(frozen=True, slots=True)
class ToolDispatch:
    tenant_id: str
    invocation_id: str
    tool: str
    soft_limit: float  # seconds: the worker interrupts the task
    hard_limit: float  # seconds: the worker process is killed


@dataclass(frozen=True, slots=True)
class Handoff:
    steps: tuple[StepDispatch, ...] = ()
    tools: tuple[ToolDispatch, ...] = ()

    def __add__(self, other: Handoff) -> Handoff:
        return Handoff(self.steps + other.steps, self.tools + other.tools)

    def __bool__(self) -> bool:
        return bool(self.steps or self.tools)


NOTHING = Handoff()
