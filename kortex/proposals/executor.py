"""Where a confirmed proposal goes. The default executor records it and runs nothing; real
executors (a rules engine, a deploy tool) implement the same one method."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from kortex.proposals.store import ProposalRecord


class ExecutionOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["recorded", "done", "failed"]
    detail: dict[str, Any] = Field(default_factory=dict)


class ActionExecutor(Protocol):
    """Carries out a confirmed proposal, after the confirmation is committed; it must not raise
    for an action it cannot do (return ``failed`` instead). Called once per proposal, and once
    more (by the watchdog, after a grace period) only when the process died before the outcome
    was recorded: use the proposal id as an idempotency key. Each call is bounded by the
    service's ``execute_timeout``; an answer after it is ignored."""

    name: str

    def execute(self, proposal: ProposalRecord) -> ExecutionOutcome: ...


class RecordingExecutor:
    """The default: remember that the operator confirmed the action, run nothing."""

    name = "record-only"

    def execute(self, proposal: ProposalRecord) -> ExecutionOutcome:
        return ExecutionOutcome(status="recorded", detail={
            "executor": self.name,
            "note": "no action executor is configured: the confirmation is recorded and nothing was run",
        })
