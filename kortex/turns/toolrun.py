"""One tool call of a turn: claim it, run it through the pipeline, store and publish the result;
the last result of a step hands the turn back to the ``turns`` queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from kortex import logcontext, metrics, tracing
from kortex.container import Kortex
from kortex.errors import ConfigError, KortexError, StorageError
from kortex.events import Event, ToolProgressEvent, ToolResultEvent
from kortex.messages import ToolCall, ToolResult
from kortex.storage import audit, invocations, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.records import InvocationRecord
from kortex.timeparse import utcnow
from kortex.tools.policy import ToolPolicy
from kortex.tools.spec import ToolContext
from kortex.turns import spool
from kortex.turns.handoff import NOTHING, Handoff, StepDispatch, Trace
from kortex.turns.outbox import publish_in
from kortex.turns.profiles import lane_of, profile_of

log = logging.getLogger(__name__)


def result_event(inv: InvocationRecord, result: ToolResult) -> ToolResultEvent:
    return ToolResultEvent(step=inv.step, call_id=result.call_id, name=result.name, is_error=result.is_error,
                           error_code=result.error_code, truncated=result.truncated,
                           elapsed_ms=result.elapsed_ms, content=result.content)


def run_tool(k: Kortex, tenant_id: str, invocation_id: str, tool: str, hard_limit: float,
             trace: Trace = ()) -> Handoff:
    """Run one tool call (a tool task); ``trace`` is the span of the step that called it."""
    with tracing.span("kortex.tool", parent=trace, attributes={"kortex.tool": tool}) as current:
        handoff = _run_tool(k, tenant_id, invocation_id, tool, hard_limit, current)
        return handoff.traced(tracing.carrier())


def _run_tool(k: Kortex, tenant_id: str, invocation_id: str, tool: str, hard_limit: float, current: Any) -> Handoff:
    with k.db.connect() as conn:
        inv = invocations.claim_invocation(conn, tenant_id, invocation_id, hard_limit=hard_limit + 5)
        running = None if inv is not None else invocations.get_invocation(conn, tenant_id, invocation_id, "running")
    if inv is None:
        # A duplicate delivery, or the watchdog already settled it; or the retry of a run whose
        # result the database refused, which left it in the spool.
        spooled = spool.get(k, invocation_id) if running is not None else None
        return settle_spooled(k, running, spooled) if running is not None and spooled is not None else NOTHING
    if inv.name != tool:
        log.warning("invocation %s is %s, task said %s", inv.id, inv.name, tool)
    ctx = ToolContext(tenant_id=tenant_id, session_id=inv.session_id, turn_id=inv.turn_id, call_id=inv.call_id,
                      step=inv.step, now=utcnow(), sources=k.sources, services=dict(k.services))
    entries: list[AuditEntry] = []

    def progress(call: ToolCall, elapsed_ms: int) -> None:
        k.events.append(inv.turn_id, [ToolProgressEvent(
            step=inv.step, call_id=call.id, name=call.name, elapsed_ms=elapsed_ms,
            message=f"{call.name} is taking longer than usual; still working")])

    started = time.monotonic()
    with logcontext.bound(tenant_id=inv.tenant_id, session_id=inv.session_id, turn_id=inv.turn_id):
        result = k.pipeline.run(invocations.tool_call_from_record(inv), ctx, audit=entries, on_progress=progress,
                                policy=_policy(k, inv))
    outcome = result.error_code or "error" if result.is_error else "ok"
    # The name is the model's: one it made up would be a new label value, and a new series, each
    # time (unbounded). Registered names are bounded by configuration.
    label = inv.name if k.pipeline.registry.get(inv.name) is not None else "unknown"
    metrics.tool_done(label, time.monotonic() - started, outcome)
    if current is not None:
        current.set_attribute("kortex.outcome", outcome)
        current.set_attribute("kortex.turn_id", inv.turn_id)
    # Events a tool raised (a proposal card) go out with its result, never with an error.
    return settle(k, inv, result, entries, events=[] if result.is_error else ctx.events)


def settle(k: Kortex, inv: InvocationRecord, result: ToolResult, entries: list[AuditEntry],
           from_status: tuple[str, ...] = ("running",), events: Sequence[Event] = (), *,
           published: bool = False) -> Handoff:
    """Store a result with its audit rows, publish it (with ``events`` a tool raised), and
    advance the turn if it was the last of its step.

    The result is published once its compare-and-set has won but before the commit: once the
    last sibling commits, the next step may start streaming, and a result published after that
    would reach clients after the next step's text, or after ``done``. A result that lost the
    race (the watchdog answered the call first) is never published, so clients see one
    ``tool_result`` per call: the one the model sees. ``published``: Redis already has them.
    """
    def publish(conn: Connection) -> bool:
        """True once Redis has the events; otherwise they are kept in this transaction."""
        return bool(publish_in(k, conn, tenant_id=inv.tenant_id, turn_id=inv.turn_id,
                               events=[result_event(inv, result), *events]))

    completion = _store(k, inv, result, entries, from_status, publish, events, published)
    if completion is None:
        log.info("tool call %s was settled before its result arrived", inv.call_id)
        _audit_late(k, inv, entries)
        return NOTHING
    if completion.next_step is None:
        return NOTHING
    lane = lane_of(inv.profile)
    busy = lane == "chat" and k.slots.busy(inv.tenant_id, k.settings.turn.busy_tenant_turns)
    return Handoff(steps=(StepDispatch(tenant_id=inv.tenant_id, turn_id=inv.turn_id, step=completion.next_step,
                                       lane=lane, busy=busy),))


def _audit_late(k: Kortex, inv: InvocationRecord, entries: list[AuditEntry]) -> None:
    """The call ran, though its turn ended (or the watchdog answered it) first: it still gets
    its audit row, unless the watchdog already wrote the call's."""
    if not entries:
        return
    try:
        with k.db.begin() as conn:
            if not any(row["kind"] == "tool_call" and (row["payload"] or {}).get("call_id") == inv.call_id
                       for row in audit.list_for_turn(conn, inv.tenant_id, inv.turn_id)):
                audit.write_entries(conn, entries)
    except KortexError:
        log.exception("could not write the audit rows of tool call %s", inv.call_id)


def _policy(k: Kortex, inv: InvocationRecord) -> ToolPolicy:
    """The policy of the call's turn profile, as the model was offered it: a tool the profile
    did not offer is denied even if the deployment allows it (deny by default)."""
    try:
        return profile_of(inv.profile).policy(k)
    except ConfigError:
        return ToolPolicy(allowed=frozenset())


def settle_spooled(k: Kortex, inv: InvocationRecord, spooled: spool.Spooled) -> Handoff:
    """Store a result an earlier run computed but could not store (see kortex/turns/spool.py)."""
    log.info("storing the spooled result of tool call %s", inv.call_id)
    handoff = settle(k, inv, spooled.result, spooled.entries, events=spooled.events, published=spooled.published)
    spool.drop(k, inv.id)
    return handoff


def _store(k: Kortex, inv: InvocationRecord, result: ToolResult, entries: list[AuditEntry],
           from_status: tuple[str, ...], publish: Callable[[Connection], bool],
           events: Sequence[Event], published: bool) -> turns.Completion | None:
    """A result is worth a few retries, and then the spool: it is never thrown away.
    ``published`` stays set once Redis has the events: a retry after a failed commit, or the
    store of a spooled result, must not announce the result twice."""
    for delay in (0.2, 0.5, 1.0, None):
        try:
            with k.db.begin() as conn:
                completion = turns.complete_invocation(conn, inv.tenant_id, inv.id, result, from_status=from_status,
                                                       audit_entries=entries)
                if completion is not None:
                    if not published:
                        published = publish(conn)
            return completion
        except StorageError:
            if delay is None:
                # Keep what the tool computed: the task's retry (or the watchdog) stores it.
                spool.put(k, inv.id, result, entries, list(events), published=published)
                raise
            log.warning("storing the result of %s failed; retrying", inv.call_id, exc_info=True)
            time.sleep(delay)
    return None
