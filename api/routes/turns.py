"""A turn's state and its event stream."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import Response, StreamingResponse

from api.deps import AcceptedTurns, CallerDep, HubDep, KortexDep, TenantDep, allowed, object_id, remember
from api.openapi import ERRORS
from api.revocation import open_stream
from api.schemas import CheckpointOut, RetryTurn, TurnAccepted, TurnOut
from api.sse import HeldStream, resume_point, turn_events
from kortex.access import Permission
from kortex.stream.entries import START
from kortex.turns import checkpoints
from kortex.turns.cancel import cancel_turn as cancel
from kortex.turns.chat import get_turn, turn_with_models
from kortex.turns.follow import nothing_left

router = APIRouter(prefix="/v1/turns", tags=["turns"], dependencies=[Depends(allowed(Permission.CHAT))], responses=ERRORS)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}


@router.get("/{turn_id}", response_model=TurnOut)
def read_turn(turn_id: str, k: KortexDep, tenant: TenantDep) -> TurnOut:
    """A turn's status, step, usage and error, and the model that answered each step."""
    turn, steps = turn_with_models(k, tenant.id, object_id(turn_id, "turn"))
    return TurnOut.of(turn, steps)


@router.post("/{turn_id}/cancel", response_model=TurnOut,
             responses={409: {"description": "the turn already ended otherwise (done or failed)"}})
def cancel_turn(turn_id: str, request: Request, k: KortexDep, caller: CallerDep) -> TurnOut:
    """Stop a queued or running turn: a streaming step stops at its next chunk, running tool
    calls' results are ignored, and the stream ends with ``done`` status ``cancelled``.
    Cancelling a cancelled turn answers the same again."""
    turn, handoff = cancel(k, caller.tenant.id, object_id(turn_id, "turn"), by=f"key:{caller.key_id}")
    if handoff:  # a batch item's turn: its job starts the next item (the watchdog would, later)
        request.app.state.dispatch(handoff)
    return TurnOut.of(turn)


@router.get("/{turn_id}/checkpoints", response_model=list[CheckpointOut])
def list_checkpoints(turn_id: str, k: KortexDep, tenant: TenantDep) -> list[CheckpointOut]:
    """Every step boundary up to this turn's last one, root first (the session's earlier turns
    first): fork a session from one, or run this turn again from one."""
    return [CheckpointOut(id=c.id, parent_id=c.parent_id, turn_id=c.turn_id, step=c.step, position=list(c.position),
                          tokens=c.tokens, created_at=c.created_at)
            for c in checkpoints.of_turn(k, tenant.id, object_id(turn_id, "turn"))]


@router.post("/{turn_id}/retry", status_code=202, response_model=TurnAccepted,
             responses={409: {"description": "the turn is still running"}})
def retry_turn(turn_id: str, body: RetryTurn, request: Request, k: KortexDep, tenant: TenantDep) -> TurnAccepted:
    """Run the turn again from a checkpoint (default: its start) as a new turn of a new session
    forked there, with another model if named. Follow it at `events_url`."""
    retried = checkpoints.retry(k, tenant.id, object_id(turn_id, "turn"), checkpoint=body.checkpoint_id,
                                model=body.model)
    if retried.posted.handoff:
        request.app.state.dispatch(retried.posted.handoff)
    turn = retried.posted.turn
    remember(request, tenant.id, turn)
    return TurnAccepted(turn_id=turn.id, session_id=turn.session_id, status=turn.status,
                        events_url=f"/v1/turns/{turn.id}/events")


@router.get("/{turn_id}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}},
                       204: {"description": "the turn is finished and Last-Event-ID was its last event"}})
async def stream_events(
    turn_id: str,
    request: Request,
    k: KortexDep,
    hub: HubDep,
    tenant: TenantDep,
    # No max_length: a value too long to be an id is "not an id" like any other noise, and
    # starts over; only an id-shaped value of at most 20 digits a part ever reaches Redis
    # (kortex/stream/entries.py, resume_id).
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """Follow a turn as Server-Sent Events: everything so far, then live until `done`; every event
    carries its `attempt` and the turn's `seq` (1, 2, 3 ...).

    Reconnect with `Last-Event-ID` to get the rest. While the turn's stream is kept in Redis
    (`turn.stream_ttl` after `done`), that is exactly the events after that id. Once it has
    expired, a finished turn is rebuilt from the database under ids `0-1`, `0-2`, ... (`seq`
    from 1 again, each step's text in one event): a client resuming from a `0-n` id gets the
    rest of that rebuild, one resuming from an id of the live stream gets the whole turn again,
    to show in place of what it had. A `Last-Event-ID` that is not an id starts over; an
    id past Redis's range is a 422. 204 when a finished turn has nothing left."""
    lane = request.app.state.lanes.stream  # not behind a burst of posts (api/deps.py, Lanes)
    turn_id = object_id(turn_id, "turn")
    # The first connection to a turn this process has just accepted starts from what the POST
    # stored; any other (a reconnection with Last-Event-ID, a second reader) needs the turn's
    # state now: has it finished, is its stream still there?
    accepted: AcceptedTurns = request.app.state.accepted_turns
    turn = accepted.pop((tenant.id, turn_id)) if last_event_id is None else None
    if turn is None:
        turn = await lane.run(tenant.id, get_turn, k, tenant.id, turn_id)
    after = resume_point(last_event_id)
    # A turn still running, or a first connection, has something left to send: only a finished
    # turn resumed part-way needs the lookups of nothing_left (and its trip to the pool).
    if turn.finished and after != START and await lane.run(tenant.id, nothing_left, k, turn, after):
        return Response(status_code=204)  # the client has every event: EventSource stops here
    heartbeat = request.app.state.heartbeat
    gate = open_stream(request)  # closed by HeldStream however the response ends
    try:
        return HeldStream(turn_events(k, hub, turn, last_event_id, heartbeat, gate),
                          slots=request.app.state.stream_slots, tenant_id=tenant.id, gate=gate, headers=SSE_HEADERS)
    except BaseException:  # refused (429): no stream to end
        gate.close()
        raise
