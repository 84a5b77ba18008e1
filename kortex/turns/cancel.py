"""Cancel a turn a client no longer wants: whatever it is doing stops and its stream ends with
``done`` status ``cancelled``.

One compare-and-set ends the turn (kortex/storage/turns.py ``cancel_turn``), so a cancel racing
the turn's own end has one winner. Nothing has to reach the running work directly:
- a step still streaming finds its stream stopped at its next write (``EventStore.stop``,
  for the attempt that held it) and stops, billing and auditing its LLM call as cancelled;
- a queued step's claim, and a parked step's closing write, find the turn no longer active;
- a tool call still running is settled here as cancelled, so its result, when it comes, is
  ignored (the task still ends within its own time limit).
Cancelling twice is the same as once.

``done`` says what the turn cost, the call it cut short included: that call is billed by its
step as it stops, so a cancel that cut one waits for that bill, at most ``BILL_WAIT``, before
it sends ``done`` (sent at once, ``done`` said what was billed before the cut: a step mid-answer
had billed nothing yet). The stop is announced to every step engine (``EventStore.stops``), so
the step ends at once even when it writes nothing (a model silent before its first token, or
streaming a tool call's arguments). Where the announcement is lost (a Redis blip) such a step
learns of the cancel only at its next write or lease renewal: its ``done`` is preceded by a
``usage_pending`` notice, and the turn's row (GET /v1/turns/{id}) counts the call once billed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

from kortex.container import Kortex
from kortex.errors import Conflict, KortexError
from kortex.events import DoneEvent, ErrorEvent
from kortex.storage import audit, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.turns.billing import billed
from kortex.turns.closing import Ending, announce, end_turn, settled_calls
from kortex.turns.handoff import Handoff

log = logging.getLogger(__name__)
# How long a cancel waits for the step it cut short to bill its call: the stop's announcement
# reaches the step's process at once (its next write would refuse it anyway), and it bills in one
# transaction; 0.1-0.3 s in practice. The client's stream ends by then either way.
BILL_WAIT = 0.8
BILL_POLL = 0.05


@dataclass(frozen=True, slots=True)
class _Cut:
    """A step the cancel cut short: its attempt, and the turn's LLM call rows before the cut."""

    attempt: int
    calls: int


def cancel(k: Kortex, tenant_id: str, turn_id: str, *, by: str) -> TurnRecord:
    """``cancel_turn`` for a caller with nothing to enqueue after it: a chat turn, whose profile
    has no end hook."""
    return cancel_turn(k, tenant_id, turn_id, by=by)[0]


def cancel_turn(k: Kortex, tenant_id: str, turn_id: str, *, by: str) -> tuple[TurnRecord, Handoff]:
    """The turn, cancelled (now or before), and the work its profile's end hook hands on. ``by``
    names who asked, for the audit row (a key id, never a secret). A turn that already
    finished otherwise is a Conflict."""
    ending: Ending | None = None
    cut: _Cut | None = None
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
            if was.status == "running" or turn.attempt != was.attempt:  # a step may be mid-call
                cut = _Cut(turn.attempt, audit.count_for_turn(conn, tenant_id, turn_id, "llm_call"))
            # Unfenced (attempt 0): the stream closes for the attempt that holds it, whichever it is.
            ending = end_turn(k, conn, was, [*settled_calls(ended), _done(was)], attempt=0)
    if ending is not None and cut is not None:
        ending, turn = _after_the_cut(k, ending, turn, cut)
    handoff = Handoff() if ending is None else announce(k, ending)
    if turn.status != "cancelled":
        raise Conflict(f"the turn already ended ({turn.status}); only a queued or running turn can be cancelled",
                       code="turn_finished", details={"status": turn.status})
    return turn, handoff


def _done(turn: TurnRecord) -> DoneEvent:
    return DoneEvent(status="cancelled", usage=billed(turn), error="cancelled")


def _after_the_cut(k: Kortex, ending: Ending, turn: TurnRecord, cut: _Cut) -> tuple[Ending, TurnRecord]:
    """Stop the step the cancel cut short and wait for it to bill its call: the ending, its
    ``done`` made from the turn's row as it is then, and that row."""
    try:
        k.events.stop(turn.id, cut.attempt)
        paid = _billed_within(k, turn, cut.calls, BILL_WAIT)
        with k.db.connect() as conn:
            turn = turns.get_turn(conn, turn.tenant_id, turn.id)
    except KortexError:  # the step stops at done (or its lease) all the same; done says what is known
        log.warning("could not wait for the step of turn %s to bill its call", turn.id, exc_info=True)
        paid = False
    pending = [] if paid else [ErrorEvent(code="usage_pending", fatal=False, message=(
        "the model call this cancel cut short had not stopped yet: the usage in done may leave it "
        "out; GET /v1/turns/{id} counts it once it is billed"))]
    return dataclasses.replace(ending, events=[*ending.events[:-1], *pending, _done(turn)]), turn


def _billed_within(k: Kortex, turn: TurnRecord, calls: int, wait: float) -> bool:
    """Whether the stopped step billed its call within ``wait`` seconds: its audit rows and the
    turn's usage are written in one transaction (kortex/turns/step.py ``_audit_alone``)."""
    deadline = time.monotonic() + wait
    while True:
        with k.db.connect() as conn:
            if audit.count_for_turn(conn, turn.tenant_id, turn.id, "llm_call") > calls:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(BILL_POLL)


__all__ = ["BILL_WAIT", "cancel", "cancel_turn"]
