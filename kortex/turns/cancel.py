"""Cancel a turn a client no longer wants: whatever it is doing stops and its stream ends with
``done`` status ``cancelled``.

One compare-and-set ends the turn (kortex/storage/turns.py ``cancel_turn``), so a cancel racing
the turn's own end has one winner. Nothing has to reach the running work directly:
- a step still streaming finds its stream closed at its next write (the ``done`` published
  here closes it for the attempt that held it) and stops, auditing its LLM call as cancelled;
- a queued step's claim, and a parked step's closing write, find the turn no longer active;
- a tool call still running is settled here as cancelled, so its result, when it comes, is
  ignored (the task still ends within its own time limit).
Cancelling twice is the same as once.
"""

from __future__ import annotations

from kortex.container import Kortex
from kortex.errors import Conflict
from kortex.events import DoneEvent
from kortex.messages import Usage
from kortex.storage import audit, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.turns.closing import Ending, announce, end_turn, settled_calls
from kortex.turns.handoff import Handoff


def cancel(k: Kortex, tenant_id: str, turn_id: str, *, by: str) -> TurnRecord:
    """``cancel_turn`` for a caller with nothing to enqueue after it: a chat turn, whose profile
    has no end hook."""
    return cancel_turn(k, tenant_id, turn_id, by=by)[0]


def cancel_turn(k: Kortex, tenant_id: str, turn_id: str, *, by: str) -> tuple[TurnRecord, Handoff]:
    """The turn, cancelled (now or before), and the work its profile's end hook hands on. ``by``
    names who asked, for the audit row (a key id, never a secret). A turn that already
    finished otherwise is a Conflict."""
    ending: Ending | None = None
    with k.db.begin() as conn:
        turn = turns.get_turn(conn, tenant_id, turn_id)
        ended = None if turn.finished else turns.cancel_turn(conn, turn, {"code": "cancelled",
                                                                          "message": "the turn was cancelled"})
        if ended is not None:
            audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="turn_cancelled", subject="turn",
                                                  ok=True, payload={"by": by, "status_was": turn.status,
                                                                    "step": turn.step},
                                                  session_id=turn.session_id, turn_id=turn.id)])
            usage = Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)
            # Unfenced (attempt 0): the stream closes for the attempt that holds it, whichever it is.
            ending = end_turn(k, conn, turn, [*settled_calls(ended),
                                              DoneEvent(status="cancelled", usage=usage, error="cancelled")],
                              attempt=0)
        turn = turns.get_turn(conn, tenant_id, turn_id)
    handoff = Handoff() if ending is None else announce(k, ending)
    if turn.status != "cancelled":
        raise Conflict(f"the turn already ended ({turn.status}); only a queued or running turn can be cancelled",
                       code="turn_finished", details={"status": turn.status})
    return turn, handoff


__all__ = ["cancel", "cancel_turn"]
