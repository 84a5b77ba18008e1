"""Cancel a turn a client no longer wants: whatever it is doing stops and its stream ends with
``done`` status ``cancelled``.

One compare-and-set ends the turn (kortex/storage/turns.py ``cancel_turn``), so a cancel racing
the turn's own end has one winner. Nothing has to reach the running work directly:
- a step still streaming is stopped (``EventStore.stop``, for the attempt that held it: its
  appends are refused, and every step engine is told, so it ends at once even when its model is
  silent), billing and auditing its LLM call as cancelled;
- a queued step's claim, and a parked step's closing write, find the turn no longer active;
- a tool call still running is settled here as cancelled, so its result, when it comes, is
  ignored (the task still ends within its own time limit).
Cancelling twice is the same as once.

``done`` says what the turn cost, the call it cut short included: that call is billed by its
step as it stops, so a cancel that cut one waits for that bill, at most ``BILL_WAIT``, before
it sends ``done`` (kortex/turns/closing.py ``bill_cuts``, which the watchdog's deadline uses
too; sent at once, ``done`` said what was billed before the cut: a step mid-answer had billed
nothing yet). Where the stop's announcement is lost (a Redis blip) the step learns of the
cancel only at its next write or lease renewal: its ``done`` is preceded by a ``usage_pending``
notice, and the turn's row (GET /v1/turns/{id}) counts the call once billed.
"""

from __future__ import annotations

from kortex.container import Kortex
from kortex.errors import Conflict
from kortex.events import DoneEvent
from kortex.storage import audit, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.turns.billing import billed
from kortex.turns.closing import Cut, Ending, announce, bill_cuts, cut_short, end_turn, settled_calls
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
    cut: Cut | None = None
    with k.db.begin() as conn:
        was = turns.get_turn(conn, tenant_id, turn_id)
        ended = None if was.finished else turns.cancel_turn(conn, was, {"code": "cancelled",
                                                                        "message": "the turn was cancelled"})
        turn = turns.get_turn(conn, tenant_id, turn_id)  # locked by a cancel that won: its attempt is the last
        if ended is not None:
            audit.write_entries(conn, [AuditEntry(tenant_id=tenant_id, kind="turn_cancelled", subject="turn",
                                                  ok=True, payload={"by": by, "status_was": was.status,
                                                                    "step": was.step},
                                                  session_id=was.session_id, turn_id=was.id)])
            cut = cut_short(conn, was, turn, by="cancel")  # a step may be mid-call
            # Unfenced (attempt 0): the stream closes for the attempt that holds it, whichever it is.
            ending = end_turn(k, conn, was, [*settled_calls(ended), _done(was)], attempt=0)
    if ending is not None and cut is not None:
        [(ending, read)] = bill_cuts(k, [(ending, cut)])
        turn = read or turn
    handoff = Handoff() if ending is None else announce(k, ending)
    if turn.status != "cancelled":
        raise Conflict(f"the turn already ended ({turn.status}); only a queued or running turn can be cancelled",
                       code="turn_finished", details={"status": turn.status})
    return turn, handoff


def _done(turn: TurnRecord) -> DoneEvent:
    return DoneEvent(status="cancelled", usage=billed(turn), error="cancelled")


__all__ = ["cancel", "cancel_turn"]
