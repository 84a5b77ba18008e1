"""One LLM step of a turn: claim it, stream the model's answer to the turn's event stream, then
either finish the turn or park it with its tool calls for the tool tasks."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kortex import logcontext, metrics, tracing
from kortex.container import Kortex
from kortex.errors import (
    ConfigError,
    Conflict,
    KortexError,
    ProviderError,
    StaleAttempt,
    StreamError,
)
from kortex.events import (
    CitationOut,
    DoneEvent,
    ErrorEvent,
    Event,
    GroundingOut,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEvent,
)
from kortex.llm.base import CompletionRequest, DoneChunk, ToolSchema
from kortex.llm.router import Attempt, Candidate, plan
from kortex.llm.routing import Latency, RoutingDecision
from kortex.messages import AssistantMessage, Message, ToolCall, ToolResult, Usage, UserMessage
from kortex.prompts import DEPTH_EXCEEDED, REGROUND
from kortex.redaction import scrub
from kortex.storage import audit, chats, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import ACTIVE, Spent, TurnRecord
from kortex.stream.store import StepPublisher
from kortex.timeparse import utcnow
from kortex.turns.anomalies import RERUNS, Escalated, action_for, check_answer, check_calls, check_cost, check_depth
from kortex.turns.billing import llm_audit, turn_total, usage_of
from kortex.turns.checkpoints import checkpoint_id
from kortex.turns.closing import Ending, announce, end_turn
from kortex.turns.consume import call_ids, consume
from kortex.turns.context import Window, load
from kortex.turns.grounding import Grounding, check, successful_calls
from kortex.turns.handoff import NOTHING, Handoff, StepDispatch, ToolDispatch, Trace
from kortex.turns.notes import Notes, checked
from kortex.turns.outbox import publish_in, publish_kept
from kortex.turns.profiles import lane_of, profile_of
from kortex.turns.routed import is_auto

if TYPE_CHECKING:
    from kortex.turns.engine import StepHold

log = logging.getLogger(__name__)
FLUSH_LIMIT = 30.0  # seconds the streamed text may take to reach Redis once the model is done


def tool_dispatch(k: Kortex, tenant_id: str, invocation_id: str, tool: str, profile: str = "chat") -> ToolDispatch:
    timeout, _ceiling = k.pipeline.limits_for(tool)
    soft = timeout + k.settings.tools.soft_grace
    return ToolDispatch(tenant_id=tenant_id, invocation_id=invocation_id, tool=tool, soft_limit=soft,
                        hard_limit=soft + k.settings.tools.hard_grace, lane=lane_of(profile))


def run_step(k: Kortex, tenant_id: str, turn_id: str, step: int, trace: Trace = ()) -> Handoff:
    """Run one step through this process's step engine and wait for it (tests, the inline
    driver); the Celery task submits instead, and returns at once."""
    return k.engine.run(StepDispatch(tenant_id=tenant_id, turn_id=turn_id, step=step, trace=trace))


class LeaseLost(Exception):
    """The step's lease lapsed or a later attempt wrote to its stream: another attempt runs it."""


class Released(Exception):
    """The step was given back unfinished (its process is stopping); another worker runs it."""


async def step_async(k: Kortex, tenant_id: str, turn_id: str, step: int, hold: StepHold,
                     trace: Trace = ()) -> Handoff:
    """One step, on the event loop of ``k``: blocking work (SQL, the closing writes) runs on
    ``k``'s I/O threads, so the loop only ever waits on the network. ``trace``: the span that
    handed the step on (its span is this one's parent; the work it hands on is its child)."""
    with tracing.span("kortex.step", parent=trace, attributes={"kortex.turn_id": turn_id, "kortex.step": step}):
        handoff = await _step(k, tenant_id, turn_id, step, hold)
        return handoff.traced(tracing.carrier())


async def _step(k: Kortex, tenant_id: str, turn_id: str, step: int, hold: StepHold) -> Handoff:
    claimed = await hold.io(_claim, k, tenant_id, turn_id, step)
    if claimed is None:
        return NOTHING  # another delivery of this step has it, or the turn moved on
    turn = claimed.turn
    hold.attach(turn)
    logcontext.bind(tenant_id=turn.tenant_id, session_id=turn.session_id, turn_id=turn.id)  # this step's task only
    if step == 0 and turn.attempt == 1:
        metrics.turn_started(turn.profile)
    started = time.monotonic()
    outcome = "error"
    try:
        handoff = await _step_claimed(k, claimed, step, hold)
        # tools: parked for its calls; again: handed back or on to another step; ended: the turn
        # ended (or the step found it had moved on)
        outcome = "tools" if handoff.tools else "again" if handoff.steps else "ended"
        return handoff
    finally:
        metrics.step_done(time.monotonic() - started, outcome)
        if hold.reservation is not None:  # its calls are billed (or were never made)
            await hold.io(k.spend.release, hold.reservation)


async def _step_claimed(k: Kortex, claimed: Claimed, step: int, hold: StepHold) -> Handoff:
    turn, history = claimed.turn, claimed.history
    try:
        if turn.kept_events:  # an outage kept events of the step before: they go out first
            try:
                await hold.io(publish_kept, k, turn.tenant_id, turn.id)
            except KortexError:  # still down: the watchdog publishes them later
                log.warning("kept events of turn %s are still waiting", turn.id, exc_info=True)
        routed: RoutingDecision | None = None
        try:
            if isinstance(history, KortexError):
                candidates: list[Candidate] = []
            elif claimed.latency is not None:  # model "auto": this step's model is chosen now
                last_step = step >= k.settings.llm.max_tool_depth
                tools: tuple[ToolSchema, ...] = ()
                try:
                    profile = profile_of(turn.profile)
                except ConfigError:  # the step fails the turn as unknown_profile before any call
                    system = ""
                else:  # what the request will carry besides the history (its price is the model's too)
                    system, tools = profile.system, (() if last_step else profile.tool_schemas(k))
                routed = k.router.decide(k.providers, history, claimed.latency, last_step=last_step,
                                         tenant=claimed.routing, system=system, tools=tools)
                candidates = k.router.candidates(k.providers, routed)
            else:
                candidates = plan(k.providers, turn.model)
        except KortexError as exc:
            return await hold.io(_fail, k, turn, step, exc.code, exc.message)
        publisher = StepPublisher(k.events, turn.id, step, turn.attempt, k.settings.turn.text_flush_ms,
                                  on_stale=hold.lose)
        publisher.emit(TurnEvent(turn_id=turn.id, status="running", step=step,
                                 model=candidates[0].first_spec if candidates else None))
        if isinstance(history, KortexError):
            metrics.refused(history.code)
            await _settle_text(publisher)
            return await hold.io(_fail, k, turn, step, history.code, history.message)
        notes = Notes(turn, step)
        if routed is not None:
            publisher.emit(notes.route(routed))
        try:
            notes.context(len(history), claimed.total_messages, k.settings.llm.anomalies, publisher,
                          routed=routed is not None)
        except Escalated as stop:  # a deployment that will not answer from a cut history
            await _settle_text(publisher)
            return await hold.io(_fail, k, turn, step, stop.anomaly.kind, stop.anomaly.message,
                                 llm_entries=notes.entries)
        return await _run_claimed(k, turn, step, candidates, history, hold, publisher, routed, notes, claimed.spent)
    except Released:
        return await hold.io(_release, k, turn, step)
    except Exception as exc:  # whatever broke, the client must hear the turn ended
        log.exception("step %s of turn %s failed", step, turn.id)
        code = exc.code if isinstance(exc, KortexError) else "internal"
        return await hold.io(_fail, k, turn, step, code, "the turn failed unexpectedly; see the server logs")


@dataclass(frozen=True, slots=True)
class Claimed:
    turn: TurnRecord
    history: list[Message] | KortexError
    #: a routed turn (``model: "auto"``): the tenant's measured model latencies; else None
    latency: dict[str, Latency] | None = None
    #: the session's messages when the history had to be cut to fit (else how many were loaded)
    total_messages: int = 0
    #: the tenant's own routing terms (its settings' ``routing``: cost_ceiling_usd, latency_sla_ms)
    routing: dict[str, Any] = field(default_factory=dict)
    spent: Spent | None = None  # read with the claim: the session's cap is checked before each call


def _claim(k: Kortex, tenant_id: str, turn_id: str, step: int) -> Claimed | None:
    """Claim the step and read what its model call needs, in one trip to an I/O thread.

    One statement in autocommit on PostgreSQL (the claim, which reads the spend and the
    session's latest messages too; elsewhere the history is a second) where there were five
    round trips (BEGIN, claim, spend, history, COMMIT): under load the I/O thread waits for the
    GIL again after each one, up to the 5 ms switch interval while the event loop is busy.
    The claim alone is the state change; the reads after it change nothing, and if they fail
    the step is given back, as a rolled-back claim was."""
    with k.db.connect() as conn:
        claimed = turns.claim(conn, tenant_id, turn_id, step, lease=k.settings.turn.step_lease,
                              history=k.settings.llm.max_history_messages)
        if claimed is None:
            return None
        turn = claimed.turn
        try:
            history = load(k, conn, turn, claimed.spent, claimed.history)
            latency = None
            if is_auto(k.settings, turn.model) and not isinstance(history, KortexError):
                latency = k.router.latency.get(conn, turn.tenant_id, k.settings.llm.routing.min_latency_samples)
            total = len(history) if isinstance(history, list) else 0
            if total >= k.settings.llm.max_history_messages:  # cut to fit: how much was left out
                total = chats.count_messages(conn, turn.tenant_id, turn.session_id)
        except Exception:
            # Whatever failed (a driver error is translated only when the connection block
            # exits), nothing was said yet: undo the claim, attempt and all, so the engine's
            # retry of a database error claims the step as if this claim had rolled back. If
            # the database is gone for that too, the lease lapses and the watchdog runs it.
            try:
                turns.unclaim_step(conn, turn, step)
            except Exception:
                log.warning("could not undo the claim of step %s of turn %s after a failed read", step, turn.id)
            raise
        routing = (claimed.spent.tenant_settings or {}).get("routing") or {}
        return Claimed(turn, history, latency, total, routing, claimed.spent)


def _release(k: Kortex, turn: TurnRecord, step: int) -> Handoff:
    with k.db.begin() as conn:
        released = turns.release_step(conn, turn, step)
    if not released:
        return NOTHING
    return Handoff(steps=(StepDispatch(tenant_id=turn.tenant_id, turn_id=turn.id, step=step,
                                       lane=lane_of(turn.profile)),))


def _time_limit(k: Kortex, turn: TurnRecord) -> float:
    """The step's own limit, but never past the turn's deadline (the watchdog fails it then)."""
    left = (turn.deadline_at - utcnow()).total_seconds()
    return max(0.0, min(k.settings.turn.step_time_limit, left))


async def _run_claimed(k: Kortex, turn: TurnRecord, step: int, candidates: list[Candidate],
                       history: list[Message], hold: StepHold, publisher: StepPublisher,
                       routed: RoutingDecision | None, notes: Notes, spent: Spent | None = None) -> Handoff:
    settings = k.settings
    depth = settings.llm.max_tool_depth
    limit = _time_limit(k, turn)
    if limit <= 0:
        await _settle_text(publisher)
        return await hold.io(_fail, k, turn, step, "deadline_exceeded", "the turn did not finish before its deadline")
    try:
        profile = profile_of(turn.profile)
    except ConfigError as exc:  # a turn of a kind this process does not run: say so, do not guess
        await _settle_text(publisher)
        return await hold.io(_fail, k, turn, step, "unknown_profile", str(exc))
    request = CompletionRequest(
        system=profile.system,
        messages=tuple(history),
        # The last allowed step gets no tools, so a model answers with what it has gathered.
        tools=profile.tool_schemas(k) if step < depth else (),
        metadata={"tenant_id": turn.tenant_id, "session_id": turn.session_id, "turn_id": turn.id,
                  "purpose": profile.budget_scope},
    )  # model, max_tokens and temperature are set per provider by the router
    # The step's model calls: the answer, and at most one re-ask when the grounding policy is
    # strict (kortex/turns/grounding.py); every call of either is billed and audited.
    checks = settings.llm.anomalies
    checking = checked(checks, routed is not None)
    # A slow first token is abandoned for the fallback only when the deployment checks for it
    # and has not mapped it to another action ([llm.anomalies] scope, actions).
    spikes = checking and routed is not None and action_for("latency_spike", checks) == "fallback"
    deadline = k.router.first_token_deadline(routed) if spikes and routed is not None else None
    window = Window(k, history, spent, turn)  # each call's history cut to its model's window, within caps
    streams = [window.stream(candidates, request, first_token_deadline=deadline)]
    refused, hold.reservation = await hold.io(window.admit, k, streams[0])  # the fit measures: off the loop
    if refused is not None:  # said before any call, as when the budget is spent
        metrics.refused(refused.code)
        await _settle_text(publisher)
        return await hold.io(_fail, k, turn, step, refused.code, refused.message, llm_entries=notes.entries)

    def attempts() -> list[Attempt]:
        return [a for each in streams for a in each.attempts]

    async def answer() -> tuple[str, tuple[ToolCall, ...], DoneChunk, Grounding | None]:
        text, calls, done = await consume(streams[0], publisher, call_ids(history), hold, notes)
        if checking:
            text, calls, done = await recover(text, calls, done)
        if calls:
            return text, calls, done, None
        policy = settings.llm.grounding
        grounding = check(text, history, numbers=policy.check_numbers)
        if checking:
            for noted in check_answer(text, had_results=bool(successful_calls(history)), cited=grounding.summary()
                                      ["cited"], policy=checks):
                if noted.kind == "uncited_answer":  # empty or short once more after a recovery: it stands
                    notes.noted(noted, publisher)
        if policy.policy != "strict" or grounding.grounded:
            return text, calls, done, grounding
        publisher.emit(ErrorEvent(code="ungrounded_answer", fatal=False, message=(
            "the answer above cites or quotes what no tool result of this turn holds; the model is asked "
            "once more, and its new answer follows")))
        again = CompletionRequest(system=request.system, metadata=request.metadata, tools=(), messages=(
            *history, AssistantMessage(content=text), UserMessage(content=REGROUND.format(
                calls=", ".join(sorted(c.id for c in successful_calls(history))) or "none",
                dangling=", ".join(grounding.dangling) or "none",
                numbers=", ".join(grounding.uncited_numbers) or "none"))))
        streams.append(window.stream(candidates, again))
        text, _, done = await consume(streams[-1], publisher, call_ids(history), hold)  # no tools offered
        return text, (), done, check(text, history, numbers=policy.check_numbers)

    async def recover(text: str, calls: tuple[ToolCall, ...], done: DoneChunk
                      ) -> tuple[str, tuple[ToolCall, ...], DoneChunk]:
        """What the step's checks found in its answer or its tool calls, and the recovery for
        the first that asks for more than noting: ``escalate`` ends the turn; ``retry`` and
        ``fallback`` ask again (on the routing decision's fallback when there is one),
        ``rollback`` reruns the step from its parent checkpoint on the same model with its tools;
        each at most once per step and ``max_retries_per_turn`` times a turn, announced, so the
        new answer follows what was shown instead of silently replacing it."""
        findings = check_calls(history, calls, checks) if calls else [
            f for f in check_answer(text, had_results=False, cited=None, policy=checks) if f.kind != "uncited_answer"]
        # Ending the turn outranks running the model again; one rerun answers for every finding
        # that asked for one (each is announced, and the rerun's recovery event follows).
        acted = next((f for f in findings if f.action == "escalate"), None) or next(
            (f for f in findings if f.action != "continue"), None)
        for other in findings:
            if other is not acted:
                (notes.noted if other.action == "continue" else notes.anomaly)(other, publisher)
        if acted is None:
            return text, calls, done
        notes.anomaly(acted, publisher)
        if acted.action == "escalate":
            notes.recovery("escalate", acted.kind, "the turn ends here", publisher)
            raise Escalated(acted)
        done_before = await hold.io(_retries_so_far, k, turn)
        if notes.retries >= checks.max_retries_per_step or done_before >= checks.max_retries_per_turn:
            notes.recovery("continue", acted.kind, "no retries left; the step's answer stands", publisher)
            return text, calls, done
        notes.retries += 1
        rollback = acted.action == "rollback"
        fallback = not rollback and routed is not None and routed.fallback is not None
        again = [Candidate(k.providers.get(routed.fallback.provider), routed.fallback.model)] \
            if fallback and routed is not None and routed.fallback is not None else candidates
        message = (f"rolled back to checkpoint {checkpoint_id(turn.id, step - 1 if step else None)}; the step runs "
                   "again and its new answer follows the one above") if rollback else \
            "the model is asked again; a new answer follows the one above"
        notes.recovery(acted.action, acted.kind, message, publisher, model=again[0].spec)
        rerun = request if (calls or rollback) else request.model_copy(update={"tools": ()})
        streams.append(window.stream(again, rerun))
        text, calls, done = await consume(streams[-1], publisher, call_ids(history), hold, notes)
        looping = [f for f in check_calls(history, calls, checks) if f.action == "escalate"]
        if looping:  # the rerun called the same again: no second chance
            notes.anomaly(looping[0], publisher)
            notes.recovery("escalate", looping[0].kind, "the turn ends here", publisher)
            raise Escalated(looping[0])
        return text, calls, done

    try:
        text, calls, done, grounding = await asyncio.wait_for(answer(), limit)
    except Escalated as stop:
        made = attempts()
        await _settle_text(publisher)
        return await hold.io(_fail, k, turn, step, stop.anomaly.kind, stop.anomaly.message,
                             llm_entries=llm_audit(turn, step, made) + notes.entries, usage=usage_of(made))
    except (LeaseLost, StaleAttempt, Released) as exc:
        publisher.abandon()
        # A lease is also lost when the turn ends under the step (a cancel, the watchdog's
        # deadline): that is no hand-over, and worth no warning.
        ended = None if isinstance(exc, Released) else await hold.io(_ended_status, k, turn)
        why = f"the turn ended ({ended}) while the step ran" if ended else "the step was handed to another attempt"
        entries = llm_audit(turn, step, attempts(), error=ProviderError(why, code="cancelled")) + notes.entries
        if isinstance(exc, Released):
            await hold.io(_audit_alone, k, entries, turn, usage_of(attempts()))
            raise
        if ended:
            log.info("step %s of turn %s stopped: %s", step, turn.id, why)
        else:
            log.warning("step %s of turn %s lost its lease; another attempt runs it", step, turn.id)
        await hold.io(_audit_alone, k, entries, turn, usage_of(attempts()))
        return NOTHING
    except Exception as exc:
        if not isinstance(exc, ProviderError | TimeoutError):
            # A bug, not the vendor: still bill and audit whatever calls were made.
            log.exception("streaming step %s of turn %s failed", step, turn.id)
            exc = ProviderError("the model call failed unexpectedly", code="internal")
        made = attempts()
        last = made[-1] if made else None  # the call that was running
        # The limit was the turn's deadline when that came first: say so, as the watchdog would.
        by_deadline = limit < settings.turn.step_time_limit
        error = exc if isinstance(exc, ProviderError) else ProviderError(
            "the turn did not finish before its deadline" if by_deadline else f"no answer within {limit:.0f}s",
            provider=last.provider if last else candidates[0].provider.name,
            model=last.model.id if last else candidates[0].model.id,
            code="deadline_exceeded" if by_deadline else "step_timeout")
        await _settle_text(publisher)
        return await hold.io(_fail, k, turn, step, error.code, str(error), retryable=error.retryable,
                             llm_entries=llm_audit(turn, step, made, error=error) + notes.entries,
                             usage=usage_of(made))
    answered = streams[-1].answered
    assert answered is not None
    usage = usage_of(attempts())
    if checking:  # what the step cost and how deep it went: recorded, and the turn ends if so mapped
        try:
            for noted in [*check_depth(step, depth, calls, checks),
                          *check_cost(routed.estimated_cost_usd if routed else None, usage.cost_usd, checks)]:
                notes.noted(noted, publisher)
        except Escalated as stop:
            await _settle_text(publisher)
            return await hold.io(_fail, k, turn, step, stop.anomaly.kind, stop.anomaly.message,
                                 llm_entries=llm_audit(turn, step, attempts(), calls=calls, text_chars=len(text))
                                 + notes.entries, usage=usage)
    entries = llm_audit(turn, step, attempts(), calls=calls, text_chars=len(text)) + notes.entries
    if not await _settle_text(publisher):
        await hold.io(_audit_alone, k, entries, turn, usage)
        return NOTHING
    hold.detach()  # what follows is a few statements: the lease need not outlive the stream
    if calls and step >= depth:
        return await hold.io(_depth_exceeded, k, turn, step, text, usage, answered.spec, entries, depth)
    if calls:
        return await hold.io(_park, k, turn, step, text, calls, usage, answered.spec, entries)
    return await hold.io(_finish, k, turn, step, text, usage, answered.spec, entries, done, grounding)


async def _settle_text(publisher: StepPublisher) -> bool:
    """Get the streamed text out before the step's structural events; False when a later
    attempt has the turn. Text that Redis still refuses is in the stored message, so the turn
    goes on (clients that missed it read it from the message)."""
    try:
        async with asyncio.timeout(FLUSH_LIMIT):
            await publisher.flush()
    except TimeoutError:
        publisher.abandon()
        log.warning("text of turn %s could not be published within %.0fs", publisher.turn_id, FLUSH_LIMIT)
    except StaleAttempt:
        return False
    except StreamError:
        log.warning("text of turn %s could not be published", publisher.turn_id, exc_info=True)
    return True


def _finish(k: Kortex, turn: TurnRecord, step: int, text: str, usage: Usage, model_used: str,
            entries: list[AuditEntry], done: DoneChunk, grounding: Grounding | None = None) -> Handoff:
    checked = grounding.as_dict() if grounding is not None else None
    ending: Ending | None = None
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=text), usage=usage,
                                     model_used=model_used, grounding=checked, audit_entries=entries)
        if finished:
            closing: list[Event] = []
            if done.stop_reason == "max_tokens":  # the answer stands, but the client should know it is cut
                closing.append(ErrorEvent(code="max_tokens", fatal=False, message=(
                    f"the answer reached {model_used}'s output limit and may be cut short; "
                    "ask a narrower question or raise max_tokens")))
            if grounding is not None and not grounding.grounded:
                closing.append(ErrorEvent(code="ungrounded_answer", fatal=False, message=_ungrounded(grounding)))
            ending = end_turn(k, conn, turn, [*closing, _done(turn, usage, grounding)], answer=text)
    if ending is None:
        _audit_alone(k, entries, turn, usage)
        return NOTHING
    return announce(k, ending)


def _done(turn: TurnRecord, usage: Usage, grounding: Grounding | None) -> DoneEvent:
    if grounding is None:
        return DoneEvent(status="done", usage=turn_total(turn, usage))
    return DoneEvent(status="done", usage=turn_total(turn, usage),
                     citations=[CitationOut(**c.as_dict()) for c in grounding.citations],
                     grounding=GroundingOut(**grounding.summary()))


def _ungrounded(grounding: Grounding) -> str:
    parts = []
    if grounding.dangling:
        parts.append(f"cites {', '.join(grounding.dangling[:5])}, which name no successful tool call of this turn")
    if grounding.uncited_numbers:
        parts.append(f"quotes {', '.join(grounding.uncited_numbers[:5])}, found in no tool result")
    return "the answer " + " and ".join(parts) + "; check those claims before acting on them"


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
    events: list[Event] = [ToolCallEvent(step=step, call_id=c.id, name=c.name, arguments=scrub(c.arguments))
                           for c in calls]
    events += [ToolResultEvent(step=step, call_id=r.call_id, name=r.name, is_error=True, error_code=r.error_code,
                               content=r.content) for r in refused.values()]
    try:
        with k.db.begin() as conn:
            invocations = turns.park_for_tools(conn, turn, step=step, message=message, usage=usage,
                                               model_used=model_used, refused=refused,
                                               audit_entries=entries + refusals)
            # The calls are published once the park has won, before it commits: the first tool
            # result may follow the commit at once, and must not overtake its call.
            publish_in(k, conn, tenant_id=turn.tenant_id, turn_id=turn.id, events=events, attempt=turn.attempt)
    except Conflict as exc:
        if exc.code != "stale_step":
            raise
        log.warning("turn %s moved on during step %s; dropping its result", turn.id, step)
        _audit_alone(k, entries, turn, usage)
        return NOTHING
    return Handoff(tools=tuple(tool_dispatch(k, turn.tenant_id, inv.id, inv.name, turn.profile)
                               for inv in invocations))


def _retries_so_far(k: Kortex, turn: TurnRecord) -> int:
    """Recoveries that ran the model again in earlier steps of the turn (its audit rows): a
    rollback or a fallback is a call more, as a retry is, and the turn's limit bounds them all."""
    with k.db.connect() as conn:
        return sum(audit.count_for_turn(conn, turn.tenant_id, turn.id, "recovery", subject=action)
                   for action in RERUNS)


def _audit_alone(k: Kortex, entries: list[AuditEntry], turn: TurnRecord | None = None,
                 usage: Usage | None = None) -> None:
    """Every LLM call is billed and audited, even when its turn moved on without it (cancelled,
    failed by the watchdog, or run again by a later attempt): its tokens and cost land on the
    turn too, so the turn's and its session's usage (the session token cap) count them."""
    try:
        with k.db.begin() as conn:
            audit.write_entries(conn, entries)
            if turn is not None and usage is not None:
                turns.add_usage(conn, turn.tenant_id, turn.id, usage)
    except KortexError:
        log.exception("could not write %d audit rows", len(entries))


def _depth_exceeded(
    k: Kortex, turn: TurnRecord, step: int, text: str, usage: Usage, model_used: str, entries: list[AuditEntry],
    depth: int,
) -> Handoff:
    note = DEPTH_EXCEEDED.format(depth=depth)
    content = f"{text}\n\n{note}" if text else note
    error = {"code": "tool_depth_exceeded", "message": note}
    ending: Ending | None = None
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=AssistantMessage(content=content),
                                     usage=usage, model_used=model_used, error=error, audit_entries=entries)
        if finished:
            ending = end_turn(k, conn, turn, [
                TextEvent(step=step, delta=("\n\n" if text else "") + note),
                ErrorEvent(code="tool_depth_exceeded", message=note),
                DoneEvent(status="done", usage=turn_total(turn, usage), error="tool_depth_exceeded"),
            ], answer=content)
    if ending is None:
        _audit_alone(k, entries, turn, usage)
        return NOTHING
    return announce(k, ending)


def _ended_status(k: Kortex, turn: TurnRecord) -> str | None:
    """The turn's status if it has ended (cancelled, failed, done), else None."""
    with k.db.connect() as conn:
        status = turns.get_turn(conn, turn.tenant_id, turn.id).status
    return None if status in ACTIVE else status


def _stored_error(code: str, message: str, retryable: bool) -> dict[str, Any]:
    """The turn's error as stored: what its error event said, so a replay says it too (a client
    offers "try again" on ``retryable``)."""
    return {"code": code, "message": message, **({"retryable": True} if retryable else {})}


def _fail(
    k: Kortex, turn: TurnRecord, step: int, code: str, message: str, *, retryable: bool = False,
    llm_entries: list[AuditEntry] | None = None, usage: Usage | None = None,
) -> Handoff:
    usage = usage or Usage()  # calls that were billed before the failure still count
    ending: Ending | None = None
    with k.db.begin() as conn:
        finished = turns.finish_turn(conn, turn, step=step, message=None, usage=usage, model_used=None,
                                     status="failed", error=_stored_error(code, message, retryable),
                                     audit_entries=llm_entries or ())
        if finished:
            ending = end_turn(k, conn, turn, [ErrorEvent(code=code, message=message, retryable=retryable),
                                              DoneEvent(status="failed", usage=turn_total(turn, usage), error=code)])
    if ending is None:
        if llm_entries:
            _audit_alone(k, llm_entries, turn, usage)
        return NOTHING
    return announce(k, ending)
