"""Sessions and their messages; posting a message starts a turn."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from api.deps import CallerDep, KortexDep, TenantDep, allowed, object_id, remember
from api.openapi import ERRORS
from api.schemas import (
    CreateSession,
    ForkSession,
    MessageOut,
    MessagePage,
    PostMessage,
    SessionOut,
    SessionPageOut,
    TurnAccepted,
)
from kortex.access import Permission
from kortex.container import Kortex
from kortex.errors import InvalidInput
from kortex.turns import chat, checkpoints
from kortex.turns.handoff import Handoff

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)
log = logging.getLogger(__name__)
_INT32 = 2**31
_POSITION = re.compile(r"-?[0-9]+\.-?[0-9]+\.-?[0-9]+")


#: the header that makes a retried POST answer what the first one made (its length checked
#: again in the domain, chat.check_idempotency_key, with the NUL and the empty key)
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=chat.MAX_IDEMPOTENCY_KEY)]


@router.post("", status_code=201, response_model=SessionOut,
             responses={409: {"description": "the Idempotency-Key was used for another request "
                                             "(idempotency_mismatch)"}})
def create_session(k: KortexDep, tenant: TenantDep, response: Response, body: CreateSession | None = None,
                   idempotency_key: IdempotencyKey = None) -> SessionOut:
    """Start a session: a conversation whose turns share history. `model` (provider:model) is its
    default for every turn; omitted, the configured default. An `Idempotency-Key` header makes a
    retry with the same body return the same session (201, `Idempotent-Replayed: true`), so a
    client whose answer was lost learns which session it made; the key with another body is 409
    `idempotency_mismatch`. Keys are the tenant's; a deleted session's key makes a new one."""
    body = body or CreateSession(name=None, model=None)  # every field has a default, so no body at all is fine too
    made = chat.new_session(k, tenant.id, body.name, body.model, idempotency_key=idempotency_key)
    response.headers["Location"] = f"/v1/sessions/{made.session.id}"
    if not made.created:
        response.headers["Idempotent-Replayed"] = "true"
    return SessionOut.of(made.session)


@router.get("", response_model=SessionPageOut)
def list_sessions(
    k: KortexDep,
    tenant: TenantDep,
    before: Annotated[str | None, Query(max_length=200, description="next_before of the page read last")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> SessionPageOut:
    """The tenant's sessions, newest first."""
    page = chat.list_sessions(k, tenant.id, before=before, limit=limit)
    return SessionPageOut(sessions=[SessionOut.of(s) for s in page.sessions], next_before=page.next_before)


@router.get("/{session_id}", response_model=SessionOut)
def get_session(session_id: str, k: KortexDep, tenant: TenantDep) -> SessionOut:
    """A session and the tokens and cost its turns have used."""
    session, usage = chat.get_session(k, tenant.id, object_id(session_id, "session"))
    return SessionOut.of(session, usage)


@router.delete("/{session_id}", status_code=204, response_class=Response,
               responses={409: {"description": "a turn is still running in the session: cancel it first"}})
def delete_session(session_id: str, k: KortexDep, caller: CallerDep) -> Response:
    """Delete the session with its turns, messages and events. Audit rows stay."""
    chat.delete_session(k, caller.tenant.id, object_id(session_id, "session"), by=f"key:{caller.key_id}")
    return Response(status_code=204)


def _position(after: str | None) -> tuple[int, int, int] | None:
    if after is None:
        return None
    # int() alone reads "1_0" as ten, and Unicode digits, signs and spaces as numbers: a
    # position a message never had, paged from in silence. Only what ``position`` writes is one.
    if not _POSITION.fullmatch(after):
        raise InvalidInput("after must be a message position such as '3.1.0'", code="validation",
                           details=[{"field": "after", "message": "not a message position"}])
    turn_no, step, ord_ = (int(p) for p in after.split("."))
    if not all(-_INT32 <= n < _INT32 for n in (turn_no, step, ord_)):
        # The columns are 32-bit: a larger number cannot name a message, and the database would
        # refuse it as an error that looks like an outage.
        raise InvalidInput("after is out of range: no message has such a position", code="validation",
                           details=[{"field": "after", "message": "out of range"}])
    return turn_no, step, ord_


@router.get("/{session_id}/messages", response_model=MessagePage)
def list_messages(
    session_id: str,
    k: KortexDep,
    tenant: TenantDep,
    after: Annotated[str | None, Query(max_length=40, description="position of the last message seen")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> MessagePage:
    """The conversation in order: user messages, the model's answers and tool calls, and each tool
    result. Page with `after` (a message's `position`)."""
    rows = chat.list_messages(k, tenant.id, object_id(session_id, "session"), after=_position(after), limit=limit)
    messages = [MessageOut.of(m) for m in rows]
    return MessagePage(messages=messages, next_after=messages[-1].position if len(messages) == limit else None)


def _post(k: Kortex, tenant_id: str, session_id: str, body: PostMessage, idempotency_key: str | None,
          dispatch: Callable[[Handoff], None]) -> tuple[chat.PostedTurn, bool]:
    """Store the turn, then enqueue it: one trip to the thread pool for the whole request.
    True when the enqueue was deferred to the watchdog."""
    posted = chat.post_message(k, tenant_id, session_id, body.content, model=body.model,
                               idempotency_key=idempotency_key)
    if posted.handoff:
        try:
            dispatch(posted.handoff)
        except Exception:  # the broker is down; the turn is stored, so the watchdog enqueues it later
            log.warning("could not enqueue turn %s now; the watchdog will", posted.turn.id, exc_info=True)
            return posted, True
    return posted, False


@router.post("/{session_id}/fork", status_code=201, response_model=SessionOut,
             responses={404: {"description": "no such session, or no such checkpoint in it"}})
def fork_session(session_id: str, body: ForkSession, k: KortexDep, tenant: TenantDep, response: Response) -> SessionOut:
    """A new session whose history ends at a checkpoint of this one (GET /v1/turns/{id}/checkpoints);
    this session is untouched."""
    forked = checkpoints.fork(k, tenant.id, object_id(session_id, "session"), body.checkpoint_id, body.name)
    response.headers["Location"] = f"/v1/sessions/{forked.id}"
    return SessionOut.of(forked)


@router.post("/{session_id}/messages", status_code=202, response_model=TurnAccepted,
             responses={409: {"description": "a turn is running in the session (turn_in_progress), or the "
                                             "Idempotency-Key was used for another request (idempotency_mismatch)"}})
async def post_message(
    session_id: str,
    body: PostMessage,
    request: Request,
    k: KortexDep,
    tenant: TenantDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Ask: stores the message and a queued turn and answers 202 with the turn's `events_url` to
    follow. One turn at a time per session (409 while one runs). An `Idempotency-Key` header makes a
    retry return the same turn (`Idempotent-Replayed: true`)."""
    # An async route that answers with its own Response: a plain def would cost FastAPI two
    # thread-pool trips (the route, then validating the returned model against
    # ``response_model``), and the body below is TurnAccepted's JSON as pydantic would write it.
    posted, deferred = await request.app.state.lanes.write.run(tenant.id, _post, k, tenant.id,
                                                               object_id(session_id, "session"), body,
                                                               idempotency_key, request.app.state.dispatch)
    turn = posted.turn
    if posted.created:
        remember(request, tenant.id, turn)
    headers = {"Location": f"/v1/turns/{turn.id}"}
    if deferred:
        headers["Kortex-Enqueue"] = "deferred"
    if not posted.created:
        headers["Idempotent-Replayed"] = "true"
    accepted = {"turn_id": turn.id, "session_id": turn.session_id, "status": turn.status,
                "events_url": f"/v1/turns/{turn.id}/events"}
    return Response(json.dumps(accepted, separators=(",", ":")), status_code=202, headers=headers,
                    media_type="application/json")
