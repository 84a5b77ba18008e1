"""Proposals a model made with propose_action: list them, read one, confirm or reject it.

Only an operator of the proposal's tenant can decide: a key whose role allows ``decide``
(``operator`` or ``admin``; kortex/access.py); another tenant's proposal is a 404.
Confirming twice is idempotent (200, ``Idempotent-Replayed: true``); the opposite decision
after one was made is 409; any decision after the proposal expired is 410."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.deps import CallerDep, KortexDep, TenantDep, allowed, object_id
from api.errors import error_response
from api.openapi import ERRORS
from kortex.access import Permission
from kortex.errors import Conflict
from kortex.keys import Caller
from kortex.proposals import DecisionOutcome, ProposalRecord
from kortex.text import Storable

router = APIRouter(prefix="/v1/proposals", tags=["proposals"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)


class ProposalOut(BaseModel):
    id: str
    session_id: str | None
    turn_id: str | None
    call_id: str | None
    action: str
    product: str
    params: dict[str, Any]
    rationale: str
    blast_radius: str | None
    reversible: bool | None
    status: str
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    execution_status: str | None
    execution: dict[str, Any] | None

    @classmethod
    def of(cls, p: ProposalRecord) -> ProposalOut:
        return cls(**{name: getattr(p, name) for name in cls.model_fields})


class ProposalList(BaseModel):
    proposals: list[ProposalOut]


class DecisionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: Storable | None = Field(None, max_length=1000, description="Why, for the audit trail")


def operator(caller: Caller) -> str:
    """Who decided: the public id of the API key the request authenticated with (never its secret)."""
    return f"api_key:{caller.key_id}"


@router.get("", response_model=ProposalList)
def list_proposals(
    k: KortexDep,
    tenant: TenantDep,
    status: Annotated[Literal["pending", "confirmed", "rejected", "expired"] | None, Query()] = None,
    session_id: Annotated[str | None, Query(max_length=36)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ProposalList:
    """Remediations the model proposed, newest first, filtered by status or session."""
    sid = object_id(session_id, "session") if session_id else None
    found = k.proposals.list(tenant.id, status=status, session_id=sid, limit=limit)
    return ProposalList(proposals=[ProposalOut.of(p) for p in found])


@router.get("/{proposal_id}", response_model=ProposalOut)
def get_proposal(proposal_id: str, k: KortexDep, tenant: TenantDep) -> ProposalOut:
    """One proposal with its decision and execution, if any."""
    return ProposalOut.of(k.proposals.get(tenant.id, object_id(proposal_id, "proposal")))


def _answer(decide: Callable[[], DecisionOutcome], response: Response) -> ProposalOut | JSONResponse:
    try:
        outcome: DecisionOutcome = decide()
    except Conflict as exc:
        if exc.code == "proposal_expired":
            return error_response(410, exc.code, exc.message)
        raise
    if not outcome.changed:
        response.headers["Idempotent-Replayed"] = "true"
    return ProposalOut.of(outcome.proposal)


@router.post("/{proposal_id}/confirm", response_model=ProposalOut, dependencies=[Depends(allowed(Permission.DECIDE))],
             responses={403: {"description": "the key's role may not decide"}, 404: {},
                        409: {"description": "already rejected"}, 410: {"description": "expired"}})
def confirm(proposal_id: str, k: KortexDep, tenant: TenantDep, response: Response,
            caller: CallerDep, body: DecisionIn | None = None) -> ProposalOut | JSONResponse:
    """An operator confirms a pending proposal (its action is then executed or recorded). Repeating it
    answers 200 again; the other decision is 409; an expired proposal is 410."""
    pid = object_id(proposal_id, "proposal")
    return _answer(lambda: k.proposals.confirm(tenant.id, pid, by=operator(caller),
                                               note=body.note if body else None), response)


@router.post("/{proposal_id}/reject", response_model=ProposalOut, dependencies=[Depends(allowed(Permission.DECIDE))],
             responses={403: {"description": "the key's role may not decide"}, 404: {},
                        409: {"description": "already confirmed"}, 410: {"description": "expired"}})
def reject(proposal_id: str, k: KortexDep, tenant: TenantDep, response: Response,
           caller: CallerDep, body: DecisionIn | None = None) -> ProposalOut | JSONResponse:
    """An operator rejects a pending proposal. Repeating it answers 200 again; the other decision is
    409; an expired proposal is 410."""
    pid = object_id(proposal_id, "proposal")
    return _answer(lambda: k.proposals.reject(tenant.id, pid, by=operator(caller),
                                              note=body.note if body else None), response)
