"""Reading a routed stream into the step's answer: its text published as it comes, its tool
calls with ids unique in the conversation, its final chunk; a warning becomes a notice event
(a slow first token, an anomaly and its fallback). The read races the step's hold, so a lost
lease or a stopping process ends it at once; an answer longer than ``llm.max_answer_chars``
ends it too, as a failure. What the model wrote enters Kortex here, for every provider: made
storable first (no NUL, no NaN, no nesting past ``kortex.nesting.MAX_DEPTH``), so PostgreSQL
never refuses the step's closing transaction and its events can be published.

Bounds on tool calls hold here, whichever provider built them (the vendor adapters hold their
calls to the first already, kortex/llm/convert.py; pseudo-tool markers, scripted and offline
calls are held here): each call's arguments at most ``MAX_ARGUMENT_BYTES`` as stored (compact
JSON), and every call's argument bytes count toward ``llm.max_answer_chars`` with the text.
That bound, not a sibling, because what it protects is the same for both: the answer is held,
stored in one message, published and re-sent to the model on every later step, and billed as
output. Counted per call, never per text piece. Calls past ``llm.max_tool_calls_per_step`` are
refused by the step; they keep their id and name (what the model is told was refused), not
their arguments."""

from __future__ import annotations

import asyncio
import math
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from kortex.errors import ProviderError
from kortex.events import ErrorEvent
from kortex.ids import new_call_id
from kortex.llm.base import DoneChunk, TextChunk, ToolCallChunk, WarningChunk
from kortex.llm.convert import MAX_ARGUMENT_BYTES
from kortex.llm.failures import failure
from kortex.llm.router import RoutedStream
from kortex.llm.wire import dumps
from kortex.messages import AssistantMessage, Message, ToolCall
from kortex.nesting import MAX_DEPTH
from kortex.stream.store import StepPublisher
from kortex.text import storable as storable_text
from kortex.turns.anomalies import found
from kortex.turns.notes import Notes

if TYPE_CHECKING:
    from kortex.turns.engine import StepHold


def call_ids(history: list[Message]) -> set[str]:
    return {c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls}


def unique_calls(calls: list[ToolCall], taken: set[str]) -> tuple[ToolCall, ...]:
    """Give every call an id unique in the conversation: providers occasionally omit one or
    repeat an id from an earlier step, and results are matched to calls by id. Names are cut
    to what storage holds (no tool has a longer one, so the pipeline refuses such a call)."""
    return _unique([storable(call) for call in calls], taken)


def _unique(calls: list[ToolCall], taken: set[str]) -> tuple[ToolCall, ...]:
    seen = set(taken)
    out = []
    for call in calls:
        if not call.id or call.id in seen or len(call.id) > 200:
            call = call.model_copy(update={"id": new_call_id()})
        if len(call.name) > 200:
            call = call.model_copy(update={"name": call.name[:200]})
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def storable(call: ToolCall) -> ToolCall:
    """``call`` as PostgreSQL stores it. NULs and lone surrogates in its name and argument strings
    (keys too) become U+FFFD; an id with one is dropped (a new one is given). A non-finite number (NaN, infinity,
    which a vendor's parsed JSON may hold) or nesting past ``MAX_DEPTH`` makes the arguments
    ``invalid_json``, as bad JSON text does (kortex/llm/convert.py): the model corrects that call,
    the step goes on."""
    update: dict[str, Any] = {}
    if storable_text(call.id) is not call.id:
        update["id"] = ""
    if storable_text(call.name) is not call.name:
        update["name"] = storable_text(call.name)
    try:
        update["arguments"] = _storable(call.arguments)
    except (ValueError, RecursionError):
        update.update(arguments={}, arguments_error="invalid_json")
    return call.model_copy(update=update)


def _storable(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict | list | tuple):
        # The arguments are an object (level 1): its contents may nest MAX_DEPTH - 1 more.
        depth += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            return {storable_text(k) if isinstance(k, str) else k: _storable(v, depth) for k, v in value.items()}
        return [_storable(v, depth) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _refused(call: ToolCall) -> ToolCall:
    """A call past ``llm.max_tool_calls_per_step``: the step answers it ``too_many_calls``
    (kortex/turns/step.py), for which its id and name are all the model needs; its arguments
    would only be stored, published and re-sent."""
    if not call.arguments and call.arguments_error is None:
        return call
    return call.model_copy(update={"arguments": {}, "arguments_error": None})


def _too_long(routed: RoutedStream, limit: int) -> ProviderError:
    """An answer past ``llm.max_answer_chars`` fails its step, and nothing of it is stored. Not
    retryable: asking the same provider again would most likely run on the same way."""
    last = routed.attempts[-1] if routed.attempts else None
    return ProviderError(
        f"the answer passed {limit} characters (llm.max_answer_chars); it was stopped and not kept",
        provider=last.provider if last else "", model=last.model.id if last else "", code="stream_invalid",
        detail=f"more than {limit} characters of text and tool-call arguments in one answer")


def _argument_bytes(call: ToolCall, routed: RoutedStream) -> int:
    """The call's arguments as stored (compact UTF-8 JSON), in bytes; past ``MAX_ARGUMENT_BYTES``
    the answer fails as the vendor adapters fail it (kortex/llm/convert.py). Bytes, counted as
    characters toward ``llm.max_answer_chars``: the same for ASCII, stricter for the rest.
    (Depth is bounded already: ``storable``, so orjson measures it.)"""
    size = len(dumps(call.arguments))
    if size > MAX_ARGUMENT_BYTES:
        last = routed.attempts[-1] if routed.attempts else None
        raise failure("stream_invalid", provider=last.provider if last else "",
                      model=last.model.id if last else "",
                      detail=f"tool call arguments longer than {MAX_ARGUMENT_BYTES} bytes")
    return size


async def consume(
    routed: RoutedStream, publisher: StepPublisher, taken: set[str], hold: StepHold, notes: Notes | None = None,
) -> tuple[str, tuple[ToolCall, ...], DoneChunk]:
    text: list[str] = []
    calls: list[ToolCall] = []
    done: DoneChunk | None = None
    limit = routed.llm.max_answer_chars
    size = 0

    async def read() -> None:
        nonlocal done, size
        async with aclosing(routed.stream()) as chunks:  # type: ignore[type-var]
            async for chunk in chunks:
                if isinstance(chunk, TextChunk):
                    piece = chunk.text
                    size += len(piece)
                    if size > limit:
                        # Leaving the loop closes the vendor's stream: a provider that ignores
                        # max_tokens (or never stops) is cut off here, not at the step's time limit.
                        raise _too_long(routed, limit)
                    piece = storable_text(piece)  # streamed and stored alike, or the answer could not be kept
                    text.append(piece)
                    publisher.text(piece)
                elif isinstance(chunk, ToolCallChunk):
                    call = storable(chunk.call)
                    size += _argument_bytes(call, routed)
                    if size > limit:
                        raise _too_long(routed, limit)
                    calls.append(call)
                elif isinstance(chunk, WarningChunk) and chunk.code == "latency_spike" and notes is not None:
                    # The first model sent nothing in time; the decision's fallback answers (no
                    # text had been shown, so nothing is said twice). The deadline is armed only
                    # when [llm.anomalies] maps the kind to fallback (kortex/turns/step.py).
                    spike = found("latency_spike", chunk.message, routed.llm.anomalies)
                    notes.anomaly(spike, publisher)
                    notes.recovery(spike.action, spike.kind, chunk.message, publisher,
                                   model=routed.candidates[-1].spec)
                elif isinstance(chunk, WarningChunk):
                    publisher.emit(ErrorEvent(code=chunk.code, message=chunk.message, fatal=False))
                elif isinstance(chunk, DoneChunk):
                    done = chunk

    # The read races the hold: a lost lease, a fenced write or a stopping process ends the
    # read at once (closing the vendor's HTTP stream), not when a stalled vendor next sends.
    reader = asyncio.ensure_future(read())
    try:
        racers: set[asyncio.Future[Any]] = {reader, hold.ended}
        await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            raise hold.ended.result()
        reader.result()  # the provider's failure, if any
    finally:
        if not reader.done():  # the hold ended, or this step itself was cancelled (its time limit)
            reader.cancel()
            # wait() never raises what the reader raised, and a cancel of this task still
            # propagates (suppressing CancelledError here would swallow it).
            await asyncio.wait({reader})
            if not reader.cancelled():
                reader.exception()  # retrieved: the reader's own failure is moot once stopped
    if done is None:
        raise ProviderError("stream ended without a final chunk", retryable=True, code="stream_truncated")
    cap = routed.llm.max_tool_calls_per_step
    unique = _unique(calls, taken)
    return "".join(text), unique[:cap] + tuple(_refused(c) for c in unique[cap:]), done


__all__ = ["call_ids", "consume", "storable", "unique_calls"]
