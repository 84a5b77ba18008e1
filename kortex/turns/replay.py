"""Rebuild a finished turn's events from the database, for clients that arrive after its Redis
stream expired. Entry ids are ``0-<n>``: stream-id shaped, ordered, and below any real id.

The rebuilt stream says what the live one said, as far as the database knows it: each step's
text whole, every call and stored result, each proposal's card after its result, the ending as
the path that ended the turn published it (the calls it settled, then a fatal error unless it
was a cancel, then ``done``), and every event stamped with an ``attempt`` and a
``seq`` (1, 2, 3 ..., equal to the id's second part) as the stream store stamps them. What was
never stored is not in it: the text a step streamed before a cancel or a deadline cut it off,
notices that did not end the turn (``max_tokens``, ``route``, ``anomaly``, ...), progress."""

from __future__ import annotations

from typing import Any

from kortex.container import Kortex
from kortex.events import (
    CitationOut,
    DoneEvent,
    ErrorEvent,
    GroundingOut,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
    _Event,
    done_status,
)
from kortex.messages import Usage
from kortex.redaction import scrub
from kortex.storage import chats
from kortex.storage.records import MessageRecord, TurnRecord
from kortex.stream.entries import Entry
from kortex.tools.builtin.propose_action import card

_STAMPS = {"attempt", "seq"}  # what the stream store stamps on each event as it appends it


def _settled_by_ending(rec: MessageRecord) -> bool:
    """A result the turn's ending wrote for a call still open (kortex/storage/turns.py
    ``_end_turn``; nothing else writes ``cancelled``). Live, the ending publishes it just
    before its own events (kortex/turns/closing.py ``settled_calls``), after the results that
    had come in, whatever the calls' order."""
    return rec.role == "tool" and rec.is_error and rec.error_code == "cancelled"


def _stamped(event: _Event, attempt: int, seq: int) -> str:
    # As the stream store's script does (kortex/stream/store.py): the stamps spliced in last,
    # so a replayed body reads like the live one.
    return f'{event.model_dump_json(exclude=_STAMPS)[:-1]},"attempt":{attempt},"seq":{seq}}}'


def replay_events(k: Kortex, turn: TurnRecord) -> list[Entry]:
    with k.db.connect() as conn:
        records = chats.list_messages(conn, turn.tenant_id, turn.session_id,
                                            after=(turn.turn_no, -1, 0), limit=10_000)
    records = [r for r in records if r.turn_id == turn.id]
    settled = [r for r in records if _settled_by_ending(r)]
    records = [r for r in records if not _settled_by_ending(r)] + settled
    events: list[_Event] = []
    current_step = None
    for rec in records:
        if rec.step != current_step:
            current_step = rec.step
            events.append(TurnEvent(turn_id=turn.id, status="running", step=rec.step, model=turn.model_used))
        if rec.role == "assistant":
            if rec.content:
                events.append(TextEvent(step=rec.step, delta=rec.content))
            for call in rec.tool_calls or []:
                events.append(ToolCallEvent(step=rec.step, call_id=call["id"], name=call["name"],
                                            arguments=scrub(call.get("arguments") or {})))
        elif rec.role == "tool":
            events.append(ToolResultEvent(step=rec.step, call_id=rec.tool_call_id or "", name=rec.tool_name or "",
                                          is_error=rec.is_error, error_code=rec.error_code,
                                          truncated=rec.truncated, content=rec.result))
            if rec.tool_name == "propose_action" and not rec.is_error and rec.tool_call_id:
                # Live, the card follows its call's successful result (kortex/turns/toolrun.py).
                proposal = k.proposals.for_call(turn.tenant_id, turn.id, rec.tool_call_id)
                if proposal is not None:
                    events.append(card(proposal, rec.tool_call_id))
    error = turn.error or {}
    # A cancel publishes only its done (kortex/turns/cancel.py); every other ending with an
    # error (a failed step, the deadline, the tool depth) publishes a fatal error before it.
    if error and turn.status != "cancelled":
        events.append(ErrorEvent(code=str(error.get("code", "error")), message=str(error.get("message", "")),
                                 retryable=error.get("retryable") is True))
    usage = Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)
    checked = next((r.grounding for r in reversed(records) if r.role == "assistant" and r.grounding), None)
    grounded: dict[str, Any] = {}
    if checked:  # the final answer's citations, as checked when the turn finished
        grounded = {"citations": [CitationOut(**c) for c in checked.get("citations", [])],
                    "grounding": GroundingOut(cited=checked.get("cited", 0), dangling=checked.get("dangling", []),
                                              uncited_numbers=checked.get("uncited_numbers", []))}
    events.append(DoneEvent(status=done_status(turn.status), usage=usage, error=error.get("code") if error else None,
                            **grounded))
    # One attempt for the whole replay, the turn's last (a turn cancelled before any step ran has
    # none yet: 1), so a client that drops events of an attempt below one it saw drops none.
    attempt = max(turn.attempt, 1)
    return [Entry(id=f"0-{seq}", type=e.type, data=_stamped(e, attempt, seq)) for seq, e in enumerate(events, 1)]
