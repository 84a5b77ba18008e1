"""propose_action: record a remediation for an operator to confirm or reject (rfc-005 §6.2.8).

It never acts. The proposal is stored (idempotently per tool call), a ``proposal`` event is
published with the result, and it expires after 10 minutes unless an operator of the tenant
decides on it through ``POST /v1/proposals/{id}/confirm`` or ``/reject``.

Exactly one card per proposal: only the call that created the row announces it; the same call
id run again (a model reusing an id, a retried task) gets the stored proposal back, silently.
The write waits for locks at most half the time the call has left, so a busy database fails
the call rather than storing a proposal after the model was told it timed out."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import Field, field_validator

from kortex.events import ProposalEvent
from kortex.proposals import NewProposal, ProposalRecord, ProposalService
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Product
from kortex.tools.spec import Effect, ToolContext, ToolInput, ToolSpec

MAX_PARAMS_BYTES = 4096
DEFAULT_WRITE_BUDGET = 2.0  # seconds, when the call runs outside the pipeline (no deadline)


class ProposeActionInput(ToolInput):
    action: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9-]*$",
                        description="Short verb form, e.g. 'restart', 'reload-tls', 'rollback-deploy'")
    product: Product
    params: dict[str, Any] = Field(default_factory=dict, description="Action-specific parameters")
    rationale: str = Field(min_length=1, max_length=2000,
                           description="Why this action is appropriate, citing the evidence")
    blast_radius: str | None = Field(None, max_length=200,
                                     description="Estimated scope, e.g. 'one host', 'one service', 'whole cluster'")
    reversible: bool | None = Field(None, description="Can the action be undone?")

    @field_validator("params")
    @classmethod
    def _small(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value, default=str)) > MAX_PARAMS_BYTES:
            raise ValueError(f"params are larger than {MAX_PARAMS_BYTES} bytes as JSON")
        return value


def run(args: ProposeActionInput, ctx: ToolContext) -> dict[str, Any]:
    service: ProposalService | None = ctx.services.get("proposals")
    if service is None:
        raise RuntimeError("no proposal service in the tool context")
    left = ctx.deadline - time.monotonic() if ctx.deadline is not None else DEFAULT_WRITE_BUDGET * 2
    proposal, created = service.propose_once(
        ctx.tenant_id,
        NewProposal(action=args.action, product=args.product, params=args.params, rationale=args.rationale,
                    blast_radius=args.blast_radius, reversible=args.reversible),
        session_id=ctx.session_id, turn_id=ctx.turn_id, call_id=ctx.call_id, now=ctx.now,
        write_timeout=max(0.05, left / 2),
    )
    if created:
        ctx.events.append(card(proposal, ctx.call_id))
    return _result(proposal)


def card(proposal: ProposalRecord, call_id: str) -> ProposalEvent:
    """The ``proposal`` event of a stored proposal; a replay from the database
    (kortex/turns/replay.py) rebuilds it with this too, so both say the same."""
    return ProposalEvent(
        proposal_id=proposal.id, call_id=call_id, action=proposal.action, product=proposal.product,
        params=proposal.params, rationale=proposal.rationale, blast_radius=proposal.blast_radius,
        reversible=proposal.reversible, expires_at=isoformat(proposal.expires_at),
    )


def _result(proposal: ProposalRecord) -> dict[str, Any]:
    return {
        "proposal_id": proposal.id,
        "status": proposal.status,
        "posted_to_chat": True,
        "awaits_confirmation": proposal.status == "pending",
        "expires_at": isoformat(proposal.expires_at),
    }


def recover(ctx: ToolContext) -> dict[str, Any] | None:
    """A proposal stored by a call whose result was lost is that call's result, and its card
    goes out again (clients key cards by proposal id, so a repeat is harmless)."""
    service: ProposalService | None = ctx.services.get("proposals")
    if service is None or ctx.turn_id is None:
        return None
    proposal = service.for_call(ctx.tenant_id, ctx.turn_id, ctx.call_id)
    if proposal is None:
        return None
    ctx.events.append(card(proposal, ctx.call_id))
    return _result(proposal)


SPEC = ToolSpec(
    name="propose_action",
    description=(
        "Propose a remediation for the operator to review. An operator must confirm it before anything is "
        "executed, and it expires after 10 minutes. This tool NEVER takes action by itself."
    ),
    input_model=ProposeActionInput,
    run=run,
    effect=Effect.STATE_CHANGE,
    category="action",
    redact=("proposal_id", "status", "posted_to_chat", "awaits_confirmation", "expires_at", "truncated"),
    recover=recover,
)
