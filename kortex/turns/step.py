"""One LLM step of a turn: claim it, stream the model's answer to the turn's event stream, then
either finish the turn or park it with its tool calls for the tool tasks."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import Any

from kortex import budget
from kortex.container import Kortex
from kortex.errors import BudgetExceeded, Conflict, KortexError, ProviderError, StreamError
from kortex.events import DoneEvent, ErrorEvent, Event, TextEvent, ToolCallEvent, ToolResultEvent, TurnEvent
from kortex.ids import new_call_id
from kortex.llm.base import CompletionRequest, DoneChunk, TextChunk, ToolCallChunk, WarningChunk
from kortex.llm.router import Attempt, Candidate, RoutedStream, plan
from kortex.messages import AssistantMessage, Message, ToolCall, ToolResult, Usage
from kortex.prompts import DEPTH_EXCEEDED, INVESTIGATOR
from kortex.redaction import scrub
from kortex.storage import audit, chats, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord
from kortex.stream.store import StepPublisher
from kortex.timeparse import utcnow
from kortex.turns.closing import publish_done
from kortex.turns.handoff import NOTHING, Handoff, ToolDispatch

log = logging.getLogger(__name__)


def tool_dispatch(k: Kortex, tenant_id: str, invocation_id: str, tool: str) -> ToolDispatch:
    timeout, _ceiling = k.pipeline.limits_for(tool)
    soft = timeout + k.settings.tools.soft_grace
    return ToolDispatch(tenant_id=tenant_id, invocation_id=invocation_id, tool=tool, soft_limit=soft,
                        hard_limit=soft + k.settings.tools.hard_grace)


def _unique_calls(calls: list[ToolCall], taken: set[str]) -> tuple[ToolCall, ...]:
    """Give every call an id unique in the conversation: providers occasionally omit one or
    repeat an id from an earlier step, and results are matched to calls by id. Names are cut
    to what storage holds (no tool has a longer one, so the pipeline refuses such a call)."""
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


def run_step(k: Kortex, tenant_id: str, turn_id: str, step: int) -> Handoff:
    with k.db.connect() as conn:
        turn = turns.claim_step(conn, tenant_id, turn_id, step, lease=k.settings.turn.step_lease)
    if turn is None:
        return NOTHING  # another delivery of this step has it, or the turn moved on
    try:
        try:
            candidates = plan(k.providers, turn.model)
        except KortexError as exc:
            _fail(k, turn, step, exc.code, exc.message)
            return NOTHING
        k.events.append(turn.id, [TurnEvent(turn_id=turn.id, status="running", step=step, attempt=turn.attempt,
                                            model=candidates[0].first_spec)])
        with k.db.connect() as conn:
            try:  # the budget is checked before every LLM call, not only when the turn began
                budget.check_spend(k.settings.llm.budget, budget.spend(conn, turn.tenant_id, turn.session_id))
            except BudgetExceeded as exc:
                _fail(k, turn, step, exc.code, exc.message)
                return NOTHING
            history = chats.load_history(conn, turn.tenant_id, turn.session_id,
                                         limit=k.settings.llm.max_history_messages)
        return _run_claimed(k, turn, step, candidates, history)
    except Exception as exc:  # whatever broke, the client must hear the turn ended
        log.exception("step %s of turn %s failed", step, turn.id)
        code = exc.code if isinstance(exc, KortexError) else "internal"
        _fail(k, turn, step, code, "the turn failed unexpectedly; see the server logs")
        return NOTHING


def _time_limit(k: Kortex, turn: TurnRecord) -> float:
    """The step's own limit, but never past the turn's deadline (the watchdog fails it then)."""
    left = (turn.deadline_at - utcnow()).total_seconds()
    return max(0.0, min(k.settings.turn.step_time_limit, left))


def _run_claimed(k: Kortex, turn: TurnRecord, step: int, candidates: list[Candidate],
                 history: list[Message]) -> Handoff:
    settings = k.settings
    depth = settings.llm.max_tool_depth
    limit = _time_limit(k, turn)
    if limit <= 0:
        _fail(k, turn, step, "deadline_exceeded", "the turn did not finish before its deadline")
        return NOTHING
    request = CompletionRequest(
        system=INVESTIGATOR,
        messages=tuple(history),
        # The last allowed step gets no tools, so a model answers with what it has gathered.
        tools=k.tools.schemas(k.policy) if step < depth else (),
        metadata={"tenant_id": turn.tenant_id, "session_id": turn.session_id, "turn_id": turn.id,
                  "purpose": "chat"},
    )  # model, max_tokens and temperature are set per provider by the router
    routed = RoutedStream(candidates, request, settings.llm)
    publisher = StepPublisher(k.events, turn.id, step, settings.turn.text_flush_ms)
    try:
        text, calls, done = k.loop.run(
            asyncio.wait_for(_consume(k, turn, routed, publisher, _call_ids(history)), limit), timeout=limit + 5)
    except LeaseLost:
        log.warning("step %s of turn %s lost its lease; another attempt runs it", step, turn.id)
        _audit_alone(k, _llm_audit(turn, step, routed.attempts, error=ProviderError(
            "the step was handed to another attempt", code="cancelled")))
        return NOTHING
    except Exception as exc:
        if not isinstance(exc, ProviderError | TimeoutError):
            # A bug, not the vendor: still bill and audit whatever calls were made.
            log.exception("streaming step %s of turn %s failed", step, turn.id)
            exc = ProviderError("the model call failed unexpectedly", code="internal")
        last = routed.attempts[-1] if routed.attempts else None  # the call that was running
        error = exc if isinstance(exc, ProviderError) else ProviderError(
            f"no answer within {limit:.0f}s", provider=last.provider if last else candidates[0].provider.name,
            model=last.model.id if last else candidates[0].model.id, code="step_timeout")
        _fail(k, turn, step, error.code, str(error), retryable=error.retryable,
              llm_entries=_llm_audit(turn, step, routed.attempts, error=error), usage=_usage(routed.attempts))
        return NOTHING
    answered = routed.answered
    assert answered is not None
    usage = _usage(routed.attempts)
    entries = _llm_audit(turn, step, routed.attempts, calls=calls, text_chars=len(text))
    if calls and step >= depth:
        return _depth_exceeded(k, turn, step, text, usage, answered.spec, entries, depth)
    if calls:
        return _park(k, turn, step, text, calls, usage, answered.spec, entries)
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=text), usage=usage,
                                     model_used=answered.spec)
        if finished:
            audit.write_entries(conn, entries)
    if finished:
        closing: list[Event] = []
        if done.stop_reason == "max_tokens":  # the answer stands, but the client should know it is cut
            closing.append(ErrorEvent(code="max_tokens", fatal=False, message=(
                f"the answer reached {answered.spec}'s output limit and may be cut short; "
                "ask a narrower question or raise max_tokens")))
        publish_done(k, turn, [*closing, DoneEvent(status="done", usage=_total(turn, usage))])
    else:
        _audit_alone(k, entries)
    return NOTHING


def _park(k: Kortex, turn: TurnRecord, step: int, text: str, calls: tuple[ToolCall, ...], usage: Usage,
          model_used: str, entries: list[AuditEntry]) -> Handoff:
    """Store the calls and hand them to the tools queue; calls past the per-step cap are
    answered at once with an error the model can act on."""
    cap = k.settings.llm.max_tool_calls_per_step
    refused = {
        c.id: ToolResult(call_id=c.id, name=c.name, is_error=True, error_code="too_many_calls",
                         content={"error": True, "code": "TOO_MANY_CALLS", "error_code": "too_many_calls",
                                  "message": f"at most {cap} tool calls run per answer; ask for this one again"})
        for c in calls[cap:]
    }
    # A refused call is still a tool call the model made: it gets its audit row like any other.
    refusals = [AuditEntry(tenant_id=turn.tenant_id, kind="tool_call", subject=c.name, ok=False,
                           session_id=turn.session_id, turn_id=turn.id,
                           payload={"call_id": c.id, "step": step, "arguments": scrub(c.arguments),
                                    "error_code": "too_many_calls"})
                for c in calls[cap:]]
    message = AssistantMessage(content=text, tool_calls=calls)
    try:
        with k.db.begin() as conn:
            invocations = turns.park_for_tools(conn, turn, step=step, message=message, usage=usage,
                                               model_used=model_used, refused=refused)
            audit.write_entries(conn, entries + refusals)
    except Conflict as exc:
        if exc.code != "stale_step":
            raise
        log.warning("turn %s moved on during step %s; dropping its result", turn.id, step)
        _audit_alone(k, entries)
        return NOTHING
    events: list[Event] = [ToolCallEvent(step=step, call_id=c.id, name=c.name, arguments=scrub(c.arguments))
                           for c in calls]
    events += [ToolResultEvent(step=step, call_id=r.call_id, name=r.name, is_error=True, error_code=r.error_code,
                               content=r.content) for r in refused.values()]
    try:
        k.events.append(turn.id, events)
    except StreamError:  # the calls are stored and will run; clients see their results
        log.warning("could not publish the tool calls of turn %s", turn.id, exc_info=True)
    return Handoff(tools=tuple(tool_dispatch(k, turn.tenant_id, inv.id, inv.name) for inv in invocations))


def _audit_alone(k: Kortex, entries: list[AuditEntry]) -> None:
    """Every LLM call is billed and audited, even when its turn moved on without it."""
    try:
        with k.db.begin() as conn:
            audit.write_entries(conn, entries)
    except KortexError:
        log.exception("could not write %d audit rows", len(entries))


def _usage(attempts: list[Attempt]) -> Usage:
    """What the step cost: every call, including a frugal attempt that was escalated."""
    total = Usage()
    for a in attempts:
        total += Usage(input_tokens=a.usage.input_tokens, output_tokens=a.usage.output_tokens, cost_usd=a.cost_usd)
    return total


def _call_ids(history: list[Message]) -> set[str]:
    return {c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls}


class LeaseLost(Exception):
    """The step's lease could not be renewed: the watchdog gave the step to another attempt."""


async def _consume(
    k: Kortex, turn: TurnRecord, routed: RoutedStream, publisher: StepPublisher, taken: set[str]
) -> tuple[str, tuple[ToolCall, ...], DoneChunk]:
    text: list[str] = []
    calls: list[ToolCall] = []
    done: DoneChunk | None = None
    keeper = asyncio.ensure_future(_keep_lease(k, turn))
    try:
        async with aclosing(routed.stream()) as chunks:
            async for chunk in chunks:
                if keeper.done():
                    raise LeaseLost()
                if isinstance(chunk, TextChunk):
                    text.append(chunk.text)
                    publisher.text(chunk.text)
                elif isinstance(chunk, ToolCallChunk):
                    calls.append(chunk.call)
                elif isinstance(chunk, WarningChunk):
                    publisher.emit(ErrorEvent(code=chunk.code, message=chunk.message, fatal=False))
                elif isinstance(chunk, DoneChunk):
                    done = chunk
    finally:
        keeper.cancel()
        publisher.flush()  # whatever was streamed reaches the client before any error
    if done is None:
        raise ProviderError("stream ended without a final chunk", retryable=True, code="stream_truncated")
    return "".join(text), _unique_calls(calls, taken), done


async def _keep_lease(k: Kortex, turn: TurnRecord) -> None:
    """Renew the step's lease while it streams; returns when it is lost."""
    lease = k.settings.turn.step_lease
    while True:
        await asyncio.sleep(lease / 3)
        try:
            with k.db.connect() as conn:  # a short blocking write on the streaming loop; see StepPublisher
                if not turns.renew_lease(conn, turn, lease=lease):
                    return
        except KortexError:  # a database blip: try again at the next tick, the lease still runs
            log.warning("could not renew the lease of turn %s", turn.id, exc_info=True)


def _total(turn: TurnRecord, usage: Usage) -> Usage:
    return Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd) + usage


def _llm_audit(
    turn: TurnRecord,
    step: int,
    attempts: list[Attempt],
    *,
    calls: tuple[ToolCall, ...] = (),
    text_chars: int = 0,
    error: ProviderError | None = None,
) -> list[AuditEntry]:
    """One row per LLM call. ``error`` is what ended the step: it is recorded on the call that
    was still running (a timeout) when that call has no error of its own."""
    entries = []
    for index, attempt in enumerate(attempts):
        last = index == len(attempts) - 1
        failure = attempt.error if attempt.error is not None and attempt.error.code != "cancelled" else None
        if failure is None and last and error is not None and attempt.stop_reason in (None, "error"):
            failure = error  # includes "cancelled": a call cut short is not a success
        # Prompts and answers stay out of the audit row: they may quote secrets from telemetry.
        payload: dict[str, Any] = {
            "step": step, "attempt": index, "provider": attempt.provider, "model": attempt.model.id,
            "fast": attempt.fast, "stop_reason": "error" if failure else attempt.stop_reason,
            "tool_calls": [c.name for c in calls] if last and failure is None else [],
            "text_chars": text_chars if last and failure is None else 0,
            "cache_read_tokens": attempt.usage.cache_read_tokens,
            "cache_write_tokens": attempt.usage.cache_write_tokens,
            "retries": attempt.retries,
        }
        if failure is not None:
            payload.update(error_code=failure.code, status=failure.status, retryable=failure.retryable)
        entries.append(AuditEntry(
            tenant_id=turn.tenant_id, kind="llm_call", subject=attempt.spec, ok=failure is None, payload=payload,
            session_id=turn.session_id, turn_id=turn.id, input_tokens=attempt.usage.input_tokens,
            output_tokens=attempt.usage.output_tokens, cost_usd=attempt.cost_usd, latency_ms=attempt.latency_ms,
        ))
    return entries


def _depth_exceeded(
    k: Kortex, turn: TurnRecord, step: int, text: str, usage: Usage, model_used: str, entries: list[AuditEntry],
    depth: int,
) -> Handoff:
    note = DEPTH_EXCEEDED.format(depth=depth)
    content = f"{text}\n\n{note}" if text else note
    error = {"code": "tool_depth_exceeded", "message": note}
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=content),
                                     usage=usage, model_used=model_used, error=error)
        if finished:
            audit.write_entries(conn, entries)
    if finished:
        publish_done(k, turn, [
            TextEvent(step=step, delta=("\n\n" if text else "") + note),
            ErrorEvent(code="tool_depth_exceeded", message=note),
            DoneEvent(status="done", usage=_total(turn, usage), error="tool_depth_exceeded"),
        ])
    else:
        _audit_alone(k, entries)
    return NOTHING


def _fail(
    k: Kortex, turn: TurnRecord, step: int, code: str, message: str, *, retryable: bool = False,
    llm_entries: list[AuditEntry] | None = None, usage: Usage | None = None,
) -> None:
    usage = usage or Usage()  # calls that were billed before the failure still count
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=None, usage=usage, model_used=None,
                                     status="failed", error={"code": code, "message": message})
        if finished and llm_entries:
            audit.write_entries(conn, llm_entries)
    if finished:
        publish_done(k, turn, [ErrorEvent(code=code, message=message, retryable=retryable),
                               DoneEvent(status="failed", usage=_total(turn, usage), error=code)])
    elif llm_entries:
        _audit_alone(k, llm_entries)
