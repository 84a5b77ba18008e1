"""Helpers the vendor adapters share to put our conversation into a vendor's shape."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from kortex.messages import Message, ToolCall, ToolResult, UserMessage

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def from_user_turn(messages: Sequence[Message]) -> list[Message]:
    """History cut by ``max_history_messages`` may start mid-exchange (a tool result whose call
    was cut); vendors reject that, so start at the first user message."""
    for i, message in enumerate(messages):
        if isinstance(message, UserMessage):
            return list(messages[i:])
    return []


def result_text(result: ToolResult) -> str:
    """A tool result as the JSON text the model reads (our content is JSON already)."""
    if isinstance(result.content, str):
        return result.content
    return json.dumps(result.content, ensure_ascii=False, separators=(",", ":"), default=str)


def wire_id(call_id: str) -> str:
    """A call id every vendor accepts (Anthropic: ``[A-Za-z0-9_-]``; OpenAI: at most 40 chars).
    Deterministic, so a call and its result still match after a failover between vendors."""
    if _SAFE_ID.match(call_id):
        return call_id
    return "call_" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def parse_arguments(call_id: str, name: str, raw: str | dict[str, Any] | None) -> ToolCall:
    """Assembled argument text to a call; invalid JSON (or not an object) becomes a call the
    pipeline answers with an ``invalid_json`` error the model can correct (tool-use-spec §8)."""
    if isinstance(raw, dict):
        return ToolCall(id=call_id, name=name, arguments=raw)
    text = (raw or "").strip()
    if not text:
        return ToolCall(id=call_id, name=name, arguments={})
    try:
        parsed = json.loads(text)
    except ValueError:
        return ToolCall(id=call_id, name=name, arguments={}, arguments_error="invalid_json")
    if not isinstance(parsed, dict):
        return ToolCall(id=call_id, name=name, arguments={}, arguments_error="invalid_json")
    return ToolCall(id=call_id, name=name, arguments=parsed)
