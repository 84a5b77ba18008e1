"""One LLM step of a turn: claim it, stream the model's answer to the turn's event stream, then
either finish the turn or park it with its tool calls for the tool tasks."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kortex.container import Kortex
from kortex.errors import Conflict, KortexError, ProviderError
from kortex.events import DoneEvent, ErrorEvent, TextEvent, ToolCallEvent, TurnEvent
from kortex.ids import new_call_id
from kortex.llm.base import CompletionRequest, DoneChunk, TextChunk, ToolCallChunk, WarningChunk
from kortex.llm.registry import Resolved
from kortex.messages import AssistantMessage, Message, ToolCall, Usage
from kortex.prompts import DEPTH_EXCEEDED, INVESTIGATOR
from kortex.storage import audit, chats, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.stream.store import StepPublisher
from kortex.turns.handoff import NOTHING, Handoff, ToolDispatch

log = logging.getLogger(__name__)


def tool_dispatch(k: Kortex, tenant_id: str, invocation_id: str, tool: str) -> ToolDispatch:
    timeout, _ceiling = k.pipeline.limits_for(tool)
    soft = timeout + k.settings.tools.soft_grace
    return ToolDispatch(tenant_id=tenant_id, invocation_id=invocation_id, tool=tool, soft_limit=soft,
                        hard_limit=soft + k.settings.tools.hard_grace)


def _unique_calls(calls: list[ToolCall], taken: set[str]) -> tuple[ToolCall, ...]:
    """Give every call an id unique in the conversation: providers occasionally omit one or
    repeat an id from an earlier step, and results are matched to calls by id."""
    seen = set(taken)
    out = []
    for call in calls:
        if not call.id or call.id in seen or len(call.id) > 200:
            call = call.model_copy(update={"id": new_call_id()})
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def run_step(k: Kortex, tenant_id: str, turn_id: str, step: int) -> Handoff:
    with k.db.connect() as conn:
        turn = turns.claim_step(conn, tenant_id, turn_id, step)
        if turn is None:
            return NOTHING  # another delivery of this step has it, or the turn moved on
        try:
            resolved = k.providers.resolve(turn.model)
        except KortexError as exc:
            _fail(k, turn, step, exc.code, exc.message)
            return NOTHING
        k.events.append(turn.id, [TurnEvent(turn_id=turn.id, status="running", step=step, model=resolved.spec)])
        history = chats.load_history(conn, turn.tenant_id, turn.session_id,
                                     limit=k.settings.llm.max_history_messages)
    try:
        return _run_claimed(k, turn, step, resolved, history)
    except Exception as exc:  # whatever broke, the client must hear the turn ended
        log.exception("step %s of turn %s failed", step, turn.id)
        code = exc.code if isinstance(exc, KortexError) else "internal"
        _fail(k, turn, step, code, "the turn failed unexpectedly; see the server logs")
        return NOTHING


def _run_claimed(k: Kortex, turn: TurnRecord, step: int, resolved: Resolved, history: list[Message]) -> Handoff:
    settings = k.settings
    depth = settings.llm.max_tool_depth
    provider_config = settings.llm.providers.get(resolved.provider.name)
    request = CompletionRequest(
        model=resolved.model.id,
        system=INVESTIGATOR,
        messages=tuple(history),
        # The last allowed step gets no tools, so a model answers with what it has gathered.
        tools=k.tools.schemas(k.policy) if step < depth else (),
        max_tokens=provider_config.max_tokens if provider_config else 4096,
        temperature=provider_config.temperature if provider_config else 0.2,
        metadata={"tenant_id": turn.tenant_id, "session_id": turn.session_id, "turn_id": turn.id,
                  "purpose": "chat"},
    )
    publisher = StepPublisher(k.events, turn.id, step, settings.turn.text_flush_ms)
    started = time.monotonic()
    limit = settings.turn.step_time_limit
    try:
        text, calls, done = k.loop.run(
            asyncio.wait_for(_consume(resolved, request, publisher, _call_ids(history)), limit), timeout=limit + 5)
    except (ProviderError, TimeoutError) as exc:
        error = exc if isinstance(exc, ProviderError) else ProviderError(
            f"no answer within {limit:.0f}s", provider=resolved.provider.name, model=resolved.model.id,
            code="step_timeout")
        _fail(k, turn, step, error.code, str(error), retryable=error.retryable,
              llm_entry=_llm_audit(turn, step, resolved, None, started, error=error))
        return NOTHING
    usage = Usage(input_tokens=done.usage.input_tokens, output_tokens=done.usage.output_tokens,
                  cost_usd=resolved.model.cost(done.usage.input_tokens, done.usage.output_tokens))
    entry = _llm_audit(turn, step, resolved, done, started, usage=usage, calls=calls, text_chars=len(text))
    if calls and step >= depth:
        return _depth_exceeded(k, turn, step, text, usage, resolved, entry, depth)
    if calls:
        message = AssistantMessage(content=text, tool_calls=calls)
        try:
            with k.db.begin() as conn:
                invocations = turns.park_for_tools(conn, turn, step=step, message=message, usage=usage,
                                                   model_used=resolved.spec)
                audit.write_entries(conn, [entry])
        except Conflict as exc:
            if exc.code != "stale_step":
                raise
            log.warning("turn %s moved on during step %s; dropping its result", turn.id, step)
            return NOTHING
        k.events.append(turn.id, [ToolCallEvent(step=step, call_id=c.id, name=c.name, arguments=c.arguments)
                                  for c in calls])
        return Handoff(tools=tuple(tool_dispatch(k, turn.tenant_id, inv.id, inv.name) for inv in invocations))
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=text), usage=usage,
                                     model_used=resolved.spec)
        if finished:
            audit.write_entries(conn, [entry])
    if finished:
        k.events.append(turn.id, [DoneEvent(status="done", usage=_total(turn, usage))], final=True)
    return NOTHING


def _call_ids(history: list[Message]) -> set[str]:
    return {c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls}


async def _consume(
    resolved: Resolved, request: CompletionRequest, publisher: StepPublisher, taken: set[str]
) -> tuple[str, tuple[ToolCall, ...], DoneChunk]:
    text: list[str] = []
    calls: list[ToolCall] = []
    done: DoneChunk | None = None
    try:
        async for chunk in resolved.provider.stream(request):
            if isinstance(chunk, TextChunk):
                text.append(chunk.text)
                publisher.text(chunk.text)
            elif isinstance(chunk, ToolCallChunk):
                calls.append(chunk.call)
            elif isinstance(chunk, WarningChunk):
                publisher.emit(ErrorEvent(code=chunk.code, message=chunk.message))
            elif isinstance(chunk, DoneChunk):
                done = chunk
    finally:
        publisher.flush()  # whatever was streamed reaches the client before any error
    if done is None:
        raise ProviderError("stream ended without a final chunk", provider=resolved.provider.name,
                            model=resolved.model.id, retryable=True)
    return "".join(text), _unique_calls(calls, taken), done


def _total(turn: TurnRecord, usage: Usage) -> Usage:
    return Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd) + usage


def _llm_audit(
    turn: TurnRecord,
    step: int,
    resolved: Resolved,
    done: DoneChunk | None,
    started: float,
    *,
    usage: Usage | None = None,
    calls: tuple[ToolCall, ...] = (),
    text_chars: int = 0,
    error: ProviderError | None = None,
) -> AuditEntry:
    # Prompts and answers stay out of the audit row: they may quote secrets from telemetry.
    payload: dict[str, Any] = {
        "step": step, "provider": resolved.provider.name, "model": resolved.model.id,
        "stop_reason": done.stop_reason if done else "error", "tool_calls": [c.name for c in calls],
        "text_chars": text_chars,
    }
    if error is not None:
        payload.update(error_code=error.code, status=error.status, retryable=error.retryable)
    usage = usage or Usage()
    return AuditEntry(
        tenant_id=turn.tenant_id, kind="llm_call", subject=resolved.spec, ok=error is None, payload=payload,
        session_id=turn.session_id, turn_id=turn.id, input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens, cost_usd=usage.cost_usd,
        latency_ms=int((time.monotonic() - started) * 1000),
    )


def _depth_exceeded(
    k: Kortex, turn: TurnRecord, step: int, text: str, usage: Usage, resolved: Resolved, entry: AuditEntry,
    depth: int,
) -> Handoff:
    note = DEPTH_EXCEEDED.format(depth=depth)
    content = f"{text}\n\n{note}" if text else note
    error = {"code": "tool_depth_exceeded", "message": note}
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=content),
                                     usage=usage, model_used=resolved.spec, error=error)
        if finished:
            audit.write_entries(conn, [entry])
    if finished:
        k.events.append(turn.id, [
            TextEvent(step=step, delta=("\n\n" if text else "") + note),
            ErrorEvent(code="tool_depth_exceeded", message=note),
            DoneEvent(status="done", usage=_total(turn, usage), error="tool_depth_exceeded"),
        ], final=True)
    return NOTHING


def _fail(
    k: Kortex, turn: TurnRecord, step: int, code: str, message: str, *, retryable: bool = False,
    llm_entry: AuditEntry | None = None,
) -> None:
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=None, usage=Usage(), model_used=None,
                                     status="failed", error={"code": code, "message": message})
        if finished and llm_entry is not None:
            audit.write_entries(conn, [llm_entry])
    if finished:
        k.events.append(turn.id, [ErrorEvent(code=code, message=message, retryable=retryable),
                                  DoneEvent(status="failed", usage=_total(turn, Usage()), error=code)], final=True)
