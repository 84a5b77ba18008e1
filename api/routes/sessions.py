"""Sessions and their messages; posting a message starts a turn."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from api.deps import KortexDep, TenantDep, allowed, object_id
from api.schemas import CreateSession, MessageOut, MessagePage, PostMessage, SessionOut, TurnAccepted
from kortex.access import Permission
from kortex.errors import InvalidInput
from kortex.storage import chats, turns
from kortex.turns import chat

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], dependencies=[Depends(allowed(Permission.CHAT))])
log = logging.getLogger(__name__)
_INT32 = 2**31


@router.post("", status_code=201, response_model=SessionOut)
def create_session(k: KortexDep, tenant: TenantDep, response: Response, body: CreateSession | None = None) -> SessionOut:
    body = body or CreateSession()  # every field has a default, so no body at all is fine too
    session = chat.create_session(k, tenant.id, body.name, body.model)
    response.headers["Location"] = f"/v1/sessions/{session.id}"
    return SessionOut.of(session)


@router.get("/{session_id}", response_model=SessionOut)
def get_session(session_id: str, k: KortexDep, tenant: TenantDep) -> SessionOut:
    with k.db.connect() as conn:
        session = chats.get_session(conn, tenant.id, object_id(session_id, "session"))
        return SessionOut.of(session, turns.session_usage(conn, tenant.id, session.id))


def _position(after: str | None) -> tuple[int, int, int] | None:
    if after is None:
        return None
    try:
        turn_no, step, ord_ = (int(p) for p in after.split("."))
    except ValueError:
        raise InvalidInput("after must be a message position such as '3.1.0'", code="validation",
                           details=[{"field": "after", "message": "not a message position"}]) from None
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
    sid = object_id(session_id, "session")
    with k.db.connect() as conn:
        chats.get_session(conn, tenant.id, sid)
        rows = chats.list_messages(conn, tenant.id, sid, after=_position(after), limit=limit)
    messages = [MessageOut.of(m) for m in rows]
    return MessagePage(messages=messages, next_after=messages[-1].position if len(messages) == limit else None)


@router.post("/{session_id}/messages", status_code=202, response_model=TurnAccepted)
def post_message(
    session_id: str,
    body: PostMessage,
    request: Request,
    response: Response,
    k: KortexDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> TurnAccepted:
    posted = chat.post_message(k, tenant.id, object_id(session_id, "session"), body.content,
                                     model=body.model, idempotency_key=idempotency_key)
    if posted.handoff:
        try:
            request.app.state.dispatch(posted.handoff)  # a sync route: this runs on the thread pool
        except Exception:  # the broker is down; the turn is stored, so the watchdog enqueues it later
            log.warning("could not enqueue turn %s now; the watchdog will", posted.turn.id, exc_info=True)
            response.headers["Kortex-Enqueue"] = "deferred"
    turn = posted.turn
    events_url = f"/v1/turns/{turn.id}/events"
    response.headers["Location"] = f"/v1/turns/{turn.id}"
    if not posted.created:
        response.headers["Idempotent-Replayed"] = "true"
    return TurnAccepted(turn_id=turn.id, session_id=turn.session_id, status=turn.status, events_url=events_url)
