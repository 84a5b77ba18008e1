"""Helpers the vendor adapters share: our conversation into a vendor's shape, and streamed
tool-call fragments back into whole, bounded calls."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kortex.llm.failures import failure
from kortex.llm.wire import dumps, dumps_text
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.nesting import deeper_than
from kortex.redaction import scrub, scrub_text

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}\Z")
#: argument bytes of one call: streamed fragments are cut here as they come (``CallAssembler``);
#: every call, whichever adapter built it, is held to it as stored (kortex/turns/consume.py)
MAX_ARGUMENT_BYTES = 256 * 1024
MAX_CALLS = 64  # tool calls in one answer (the step runs at most llm.max_tool_calls_per_step of them)


def from_user_turn(messages: Sequence[Message]) -> list[Message]:
    """History cut by ``max_history_messages`` may start mid-exchange (a tool result whose call
    was cut); vendors reject that, so start at the first user message."""
    for i, message in enumerate(messages):
        if isinstance(message, UserMessage):
            return list(messages[i:])
    return []


def scrubbed(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The conversation with credential-shaped text replaced (``llm.privacy.redact_secrets``):
    what a user pasted or a tool read must not reach a cloud vendor's logs."""
    out: list[Message] = []
    for message in messages:
        if isinstance(message, UserMessage):
            message = message.model_copy(update={"content": scrub_text(message.content)})
        elif isinstance(message, AssistantMessage):
            message = message.model_copy(update={"content": scrub_text(message.content), "tool_calls": tuple(
                c.model_copy(update={"arguments": scrub(c.arguments)}) for c in message.tool_calls)})
        elif isinstance(message, ToolMessage):
            result = message.result.model_copy(update={"content": scrub(message.result.content)})
            message = message.model_copy(update={"result": result})
        out.append(message)
    return tuple(out)


def paired(messages: Sequence[Message]) -> list[Message]:
    """Every call answered right after its assistant message, and only calls answered: vendors
    reject a call without a result (a turn that failed while its tools ran leaves one) and a
    result without its call. A missing result becomes an error result the model can read."""
    out: list[Message] = []
    open_calls: dict[str, ToolCall] = {}

    def close() -> None:
        for call in open_calls.values():
            out.append(ToolMessage(result=ToolResult(
                call_id=call.id, name=call.name, is_error=True, error_code="no_result",
                content={"error": "no_result", "message": "this call produced no result (its turn ended first)"})))
        open_calls.clear()

    for message in messages:
        if isinstance(message, ToolMessage):
            if open_calls.pop(message.result.call_id, None) is not None:
                out.append(message)
            continue  # a result of no open call (a repeat, or its call was cut from the history)
        close()
        out.append(message)
        if isinstance(message, AssistantMessage):
            open_calls.update((c.id, c) for c in message.tool_calls)
    close()
    return out


def result_text(result: ToolResult) -> str:
    """A tool result as the JSON text the model reads (our content is JSON already)."""
    if isinstance(result.content, str):
        return result.content
    return dumps_text(result.content)


def wire_id(call_id: str) -> str:
    """A call id every vendor accepts (Anthropic: ``[A-Za-z0-9_-]``; OpenAI: at most 40 chars).
    Deterministic, so a call and its result still match after a failover between vendors."""
    if _SAFE_ID.match(call_id):
        return call_id
    return "call_" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: past a double, PostgreSQL's jsonb refuses it
        raise ValueError(f"{text} is out of range")
    return value


def load_arguments(text: str) -> Any:
    """Tool-call argument text as JSON, strictly: ``NaN``, ``Infinity`` and numbers beyond a
    double are refused (ValueError) like any invalid JSON. json.loads takes them, and then no
    PostgreSQL jsonb column would store the call: the whole step would fail instead of the one
    call the model can correct."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:  # nested past the interpreter's limit: not arguments either
        raise ValueError("nested too deeply") from exc


def _too_large(size: int) -> None:
    if size > MAX_ARGUMENT_BYTES:
        raise failure("stream_invalid", detail=f"tool call arguments longer than {MAX_ARGUMENT_BYTES} bytes")


def _encoded_size(arguments: dict[str, Any]) -> int:
    try:
        return len(dumps(arguments))
    except UnicodeEncodeError:  # a lone surrogate, which the step replaces (consume.storable): measured so
        text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        return len(text.encode("utf-8", "replace"))


def parse_arguments(call_id: str, name: str, raw: str | dict[str, Any] | None) -> ToolCall:
    """Assembled argument text, or a vendor's parsed object (Anthropic's ``tool_use`` input,
    Ollama's arguments), to a call; invalid JSON, not an object, or nested past ``MAX_DEPTH``
    becomes a call the pipeline answers with an ``invalid_json`` error the model can correct
    (tool-use-spec §8). More than ``MAX_ARGUMENT_BYTES`` fails the stream, however the arguments
    came, as streamed fragments do (``CallAssembler``): one bound for every adapter. The step
    checks every provider's calls again as it reads them (kortex/turns/consume.py)."""
    if isinstance(raw, dict):
        if deeper_than(raw):  # before measuring: json.dumps recurses
            return ToolCall(id=call_id, name=name, arguments={}, arguments_error="invalid_json")
        _too_large(_encoded_size(raw))
        return ToolCall(id=call_id, name=name, arguments=raw)
    text = (raw or "").strip()
    if not text:
        return ToolCall(id=call_id, name=name, arguments={})
    _too_large(len(text.encode("utf-8", "replace")))
    try:
        parsed = load_arguments(text)
    except ValueError:
        return ToolCall(id=call_id, name=name, arguments={}, arguments_error="invalid_json")
    if not isinstance(parsed, dict) or deeper_than(parsed):
        return ToolCall(id=call_id, name=name, arguments={}, arguments_error="invalid_json")
    return ToolCall(id=call_id, name=name, arguments=parsed)


@dataclass(slots=True)
class _Partial:
    id: str
    name: str
    initial: dict[str, Any] | None = None
    parts: list[str] = field(default_factory=list)
    size: int = 0


class CallAssembler:
    """Tool calls streamed as fragments, keyed by the vendor's index. Bounded: at most
    ``MAX_CALLS`` calls per answer and ``MAX_ARGUMENT_BYTES`` of argument text per call; past
    either the stream is refused as invalid rather than buffered without end."""

    def __init__(self) -> None:
        self._open: dict[int, _Partial] = {}
        self.started = 0

    def __contains__(self, key: int) -> bool:
        return key in self._open

    def __bool__(self) -> bool:
        return bool(self._open)

    def keys(self) -> list[int]:
        return list(self._open)

    def id_of(self, key: int) -> str:
        partial = self._open.get(key)
        return partial.id if partial else ""

    def start(self, key: int, call_id: str, name: str, initial: dict[str, Any] | None = None) -> None:
        if key in self._open:
            return
        self.started += 1
        if self.started > MAX_CALLS:
            raise failure("stream_invalid", detail=f"more than {MAX_CALLS} tool calls in one answer")
        self._open[key] = _Partial(call_id, name, initial or None)

    def update(self, key: int, *, call_id: str = "", name: str = "") -> None:
        partial = self._open[key]
        partial.id = call_id or partial.id
        partial.name = name or partial.name

    def append(self, key: int, fragment: str) -> None:
        partial = self._open[key]
        partial.size += len(fragment.encode("utf-8", "replace"))
        if partial.size > MAX_ARGUMENT_BYTES:
            raise failure("stream_invalid", detail=f"tool call arguments longer than {MAX_ARGUMENT_BYTES} bytes")
        partial.parts.append(fragment)

    def finish(self, key: int) -> ToolCall | None:
        partial = self._open.pop(key, None)
        if partial is None:
            return None
        raw = "".join(partial.parts) if partial.parts else partial.initial
        return parse_arguments(partial.id, partial.name, raw)

    def finish_all(self) -> list[ToolCall]:
        """Every open call, in index order."""
        return [call for key in sorted(self._open) if (call := self.finish(key)) is not None]
