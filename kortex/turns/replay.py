"""Rebuild a finished turn's events from the database, for clients that arrive after its Redis
stream expired. Entry ids are ``0-<n>``: stream-id shaped, ordered, and below any real id."""

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
from kortex.storage.records import TurnRecord
from kortex.stream.entries import Entry


def replay_events(k: Kortex, turn: TurnRecord) -> list[Entry]:
    with k.db.connect() as conn:
        records = chats.list_messages(conn, turn.tenant_id, turn.session_id,
                                            after=(turn.turn_no, -1, 0), limit=10_000)
    records = [r for r in records if r.turn_id == turn.id]
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
    error = turn.error or {}
    if error:
        events.append(ErrorEvent(code=str(error.get("code", "error")), message=str(error.get("message", ""))))
    usage = Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)
    checked = next((r.grounding for r in reversed(records) if r.role == "assistant" and r.grounding), None)
    grounded: dict[str, Any] = {}
    if checked:  # the final answer's citations, as checked when the turn finished
        grounded = {"citations": [CitationOut(**c) for c in checked.get("citations", [])],
                    "grounding": GroundingOut(cited=checked.get("cited", 0), dangling=checked.get("dangling", []),
                                              uncited_numbers=checked.get("uncited_numbers", []))}
    events.append(DoneEvent(status=done_status(turn.status), usage=usage, error=error.get("code") if error else None,
                            **grounded))
    return [Entry(id=f"0-{i}", type=e.type, data=e.model_dump_json()) for i, e in enumerate(events, 1)]
