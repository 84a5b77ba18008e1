"""Prompt-injected pseudo-tools (rfc-005 §4.3) for models without native tool calls.

The system prompt teaches the model to write ``<<TOOL name="get_logs" args='{...}'>>``; the
parser finds those markers in the streamed text (even split across chunks) and turns them
into tool calls. Results go back as user messages. Best effort: the adapter warns about it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from kortex.ids import new_call_id
from kortex.llm.base import ToolSchema
from kortex.llm.convert import from_user_turn, load_arguments, result_text
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

OPEN = "<<TOOL"
MAX_MARKER = 16 * 1024
_MARKER = re.compile(r"""<<TOOL\s+name\s*=\s*"([^"]{1,100})"\s*(?:args\s*=\s*(?:'(.*)'|(\{.*\})))?\s*/?>>\Z""",
                     re.DOTALL)
_NAME = re.compile(r"""<<TOOL\s+name\s*=\s*"([^"]{1,100})\"""")

PROMPT = """\

## Calling tools

You can call the tools below. To call one, write a line of exactly this form:
<<TOOL name="TOOL_NAME" args='{{"argument": "value"}}'>>
where args is a JSON object matching the tool's schema. Write every call you need, then stop: \
the results arrive in the next message as "Tool result". Never invent results.

{catalogue}"""


def system_prompt(system: str, tools: Sequence[ToolSchema]) -> str:
    catalogue = "\n".join(
        f"- {t.name}: {t.description}\n  args schema: {json.dumps(t.input_schema, separators=(',', ':'))}"
        for t in tools)
    return system + PROMPT.format(catalogue=catalogue)


def marker(call: ToolCall) -> str:
    return f"<<TOOL name=\"{call.name}\" args='{json.dumps(call.arguments, ensure_ascii=False)}'>>"


def to_plain_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation with calls written as markers and results as user messages."""
    out: list[dict[str, Any]] = []

    def add(role: str, text: str) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})

    for message in from_user_turn(messages):
        if isinstance(message, UserMessage):
            add("user", message.content)
        elif isinstance(message, AssistantMessage):
            text = "\n".join([message.content, *(marker(c) for c in message.tool_calls)]).strip()
            if text:
                add("assistant", text)
        elif isinstance(message, ToolMessage):
            result = message.result
            status = "error" if result.is_error else "ok"
            add("user", f"Tool result ({result.name}, {status}):\n{result_text(result)}")
    return out


class MarkerParser:
    """Feed streamed text; get back text pieces and tool calls in order."""

    def __init__(self) -> None:
        self._buf = ""
        self._in_marker = False

    def feed(self, text: str) -> list[str | ToolCall]:
        self._buf += text
        out: list[str | ToolCall] = []
        while self._buf:
            if not self._in_marker:
                start = self._buf.find(OPEN)
                if start < 0:
                    keep = _partial_open(self._buf)
                    if len(self._buf) > keep:
                        out.append(self._buf[:len(self._buf) - keep])
                        self._buf = self._buf[len(self._buf) - keep:]
                    break
                if start:
                    out.append(self._buf[:start])
                self._buf = self._buf[start:]
                self._in_marker = True
            call, end = self._match()
            if call is None:
                if len(self._buf) > MAX_MARKER:  # never closed: it was not a call after all
                    out.append(self._buf)
                    self._buf, self._in_marker = "", False
                break
            out.append(call)
            self._buf, self._in_marker = self._buf[end:], False
        return out

    def finish(self) -> list[str | ToolCall]:
        """The end of the stream: an unfinished marker naming a tool is a call with bad arguments."""
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        if self._in_marker:
            self._in_marker = False
            named = _NAME.match(rest)
            if named:
                return [ToolCall(id=new_call_id(), name=named.group(1), arguments={}, arguments_error="invalid_json")]
        return [rest]

    def _match(self) -> tuple[ToolCall | None, int]:
        end = self._buf.find(">>", len(OPEN))
        while end >= 0:
            found = _MARKER.match(self._buf[:end + 2])
            if found:
                name, quoted, bare = found.groups()
                return _call(name, quoted if quoted is not None else bare), end + 2
            end = self._buf.find(">>", end + 1)
        return None, 0


def _call(name: str, raw: str | None) -> ToolCall:
    if raw is None:
        return ToolCall(id=new_call_id(), name=name, arguments={})
    try:
        parsed = load_arguments(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return ToolCall(id=new_call_id(), name=name, arguments={}, arguments_error="invalid_json")
    return ToolCall(id=new_call_id(), name=name, arguments=parsed)


def _partial_open(text: str) -> int:
    """Length of the longest tail of ``text`` that could be the start of a marker."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
