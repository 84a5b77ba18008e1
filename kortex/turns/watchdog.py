"""The periodic sweep that keeps turns moving when workers die or messages are lost:
fails turns past their deadline, settles tool calls past their hard limit, re-enqueues work
that was committed but never picked up, expires proposals and recovers their interrupted
executions. ``run_watchdog`` is its loop, run by one leader per deployment in a process of its
own (``kortex beat``), so the queues it polices cannot starve it; the leader also deletes what
the retention policy no longer keeps (``Pruning``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError, OperationalError

from kortex import metrics
from kortex.container import Kortex
from kortex.errors import KortexError
from kortex.events import DoneEvent, ErrorEvent
from kortex.messages import ToolResult
from kortex.storage import audit, retention, sweeps, turns
from kortex.storage.audit import AuditEntry
from kortex.storage.invocations import tool_call_from_record
from kortex.storage.records import InvocationRecord, TurnRecord
from kortex.timeparse import utcnow
from kortex.tools.spec import ToolContext
from kortex.turns import outbox, spool
from kortex.turns.billing import billed
from kortex.turns.closing import Cut, Ending, announce, bill_cuts, cut_short, end_turn, lost_call, settled_calls
from kortex.turns.handoff import Handoff, StepDispatch, stored_trace
from kortex.turns.ports import JOB_SWEEPS, Leadership, QueuePort, Work
from kortex.turns.profiles import lane_of, load_builtin
from kortex.turns.step import tool_dispatch
from kortex.turns.toolrun import settle, settle_spooled

log = logging.getLogger(__name__)

#: While a broker, Redis or database outage lasts, each thing it stops is logged this often.
OUTAGE_LOG_EVERY = 60.0


def _connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it: kombu wraps redis-py's) is a connection that failed,
    which is expected while a service is down or restarting: its traceback says no more than
    its first line does."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, RedisConnectionError | RedisTimeoutError | ConnectionError | TimeoutError
                      | OperationalError | InterfaceError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class _Outages:
    """The watchdog retries every interval: an expected connection error is logged as one line,
    without its traceback, at most once every ``every`` seconds per thing it stops, and once more
    when that works again (beat logged 650 traceback lines in 35 s of a Redis outage). Any other
    error is logged with its traceback every time."""

    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self._logged: dict[str, float] = {}  # what failed: when it was last logged

    def failed(self, what: str, exc: BaseException, level: int = logging.WARNING) -> None:
        if not _connection_error(exc):
            log.log(level, "watchdog could not %s", what, exc_info=exc)
            return
        now, last = self.clock(), self._logged.get(what)
        if last is not None and now - last < self.every:
            return
        self._logged[what] = now
        text = str(exc).strip()
        log.warning("watchdog %s %s: %s: %s (said again every %gs while it lasts)",
                    "still could not" if last is not None else "could not", what, exc.__class__.__name__,
                    text.splitlines()[0] if text else "", self.every)

    def worked(self, what: str) -> None:
        if self._logged.pop(what, None) is not None:
            log.info("watchdog can %s again", what)


_outages = _Outages(OUTAGE_LOG_EVERY)


@dataclass(frozen=True, slots=True)
class SweepReport:
    failed_turns: int
    timed_out_tools: int
    requeued_steps: int
    requeued_tools: int
    handoff: Handoff
    expired_proposals: int = 0
    recovered_executions: int = 0
    republished_events: int = 0


def _backlog(queue: QueuePort | None, work: Work) -> int:
    if queue is None:
        return 0
    what = f"read the {work} queue's depth"
    try:
        depth = queue.backlog(work) or 0  # unknown: as if empty (a duplicate is harmless, a loss is not)
    except Exception as exc:  # the broker is down: enqueueing would fail too, so wait for the next sweep
        _outages.failed(what, exc)
        return -1
    _outages.worked(what)
    return depth


def sweep(k: Kortex, queue: QueuePort | None = None) -> SweepReport:
    """One pass. With ``queue``, work that is merely waiting is never re-enqueued: a queued turn
    or pending tool call counts as lost only while its queue is empty (its message is then not
    waiting there) and its row has not been touched for ``requeue_after`` (a process that holds a
    step, running or waiting for a slot, keeps touching it)."""
    now = utcnow()
    handoff = Handoff()
    try:  # first: a turn's kept closing events are all its client is waiting for
        republished = outbox.republish(k)
    except KortexError as exc:
        _outages.failed("publish kept events", exc, logging.ERROR)
        republished = 0
    else:
        _outages.worked("publish kept events")
    with k.db.connect() as conn:
        expired = sweeps.expired_turns(conn, now)
    failed = 0
    cuts: list[tuple[Ending, Cut]] = []
    for turn in expired:
        try:
            failing = _expire(k, turn)
        except KortexError:  # one bad row must not stop the sweep; the next one retries it
            log.exception("watchdog could not fail turn %s", turn.id)
            continue
        if failing is None:
            continue
        failed += 1
        ending, cut = failing
        if cut is None:
            handoff += announce(k, ending)
        else:
            cuts.append((ending, cut))
    # The steps the deadline cut mid-call are stopped together and waited for once (at most
    # BILL_WAIT in all), so each done counts its call's bill, as a cancel's does.
    for ending, _ in bill_cuts(k, cuts):
        handoff += announce(k, ending)

    with k.db.connect() as conn:
        overdue = sweeps.overdue_invocations(conn, now)
    for inv in overdue:
        try:  # the step a settled call hands on is in the turn's trace, as if the call had ended itself
            handoff += _settle_overdue(k, inv).traced(stored_trace(inv.traceparent))
        except KortexError:
            log.exception("watchdog could not settle tool call %s", inv.id)

    cutoff = now - timedelta(seconds=k.settings.turn.requeue_after)
    steps_waiting, tools_waiting = _backlog(queue, "steps"), _backlog(queue, "tools")
    batch_waiting = _backlog(queue, "batch")  # a batch turn's steps and tools share one queue

    def idle(lane: str, chat_waiting: int) -> bool:
        return (batch_waiting if lane == "batch" else chat_waiting) == 0

    with k.db.begin() as conn:
        lapsed = sweeps.lapsed_steps(conn, now)  # their worker died mid-step: run the step again
        audit.write_entries(conn, [lost_call(t) for t in lapsed])
        stale_turns = lapsed + [t for t in sweeps.stale_queued_turns(conn, cutoff)
                                if idle(lane_of(t.profile), steps_waiting)]
        stale_tools = [i for i in sweeps.stale_pending_invocations(conn, cutoff)
                       if idle(lane_of(i.profile), tools_waiting)]
    # Handed on again from the rows, each with the trace context its row kept: the step runs
    # again in its turn's trace, not in a new one of its own.
    handoff += Handoff(
        steps=tuple(StepDispatch(tenant_id=t.tenant_id, turn_id=t.id, step=t.step, lane=lane_of(t.profile),
                                 trace=stored_trace(t.traceparent))
                    for t in stale_turns),
        tools=tuple(replace(tool_dispatch(k, i.tenant_id, i.id, i.name, i.profile), trace=stored_trace(i.traceparent))
                    for i in stale_tools),
    )
    load_builtin()  # the rooms built on the engine register their sweeps when loaded
    for job_sweep in JOB_SWEEPS:  # kinds of batch work keep their own items moving (kortex/postmortems/)
        try:
            handoff += job_sweep(k, now, batch_waiting == 0)
        except KortexError:
            log.exception("watchdog could not sweep batch jobs")
    try:  # a chat turn's admission slot that was not given back (kortex/turns/admission.py)
        with k.db.connect() as conn:
            freed, recounted = k.slots.reconcile(conn)
        _outages.worked("reconcile admission slots")
        if freed or recounted:
            log.info("watchdog: %d admission slots freed, %d live turns counted again", freed, recounted)
    except (KortexError, RedisError) as exc:
        _outages.failed("reconcile admission slots", exc)
    try:  # each one an audit row, as a human decision is
        expired_proposals = k.proposals.expire_due(now)
    except KortexError:  # the hand-offs above (steps already moved back to queued) must still go out
        log.exception("watchdog could not expire proposals")
        expired_proposals = 0
    try:  # confirmed proposals whose execution a dying process cut off
        recovered = k.proposals.recover_executions(now)
    except KortexError:
        log.exception("watchdog could not recover proposal executions")
        recovered = 0
    if republished:
        log.info("watchdog: published %d batches of events Redis had refused", republished)
    if failed or overdue or stale_turns or stale_tools or expired_proposals or recovered:
        log.info("watchdog: %d turns failed, %d tools timed out, %d steps (%d of dead workers) and %d tools "
                 "re-enqueued, %d proposals expired, %d proposal executions recovered", failed, len(overdue),
                 len(stale_turns), len(lapsed), len(stale_tools), expired_proposals, recovered)
    return SweepReport(failed, len(overdue), len(stale_turns), len(stale_tools), handoff, expired_proposals,
                       recovered, republished)


def _settle_overdue(k: Kortex, inv: InvocationRecord) -> Handoff:
    """The worker died or hung past the hard limit. If the call's effect was stored before its
    result was lost (a proposal), that is its result; otherwise the model hears a timeout."""
    spooled = spool.get(k, inv.id)
    if spooled is not None:  # it finished, but the database could not take its result then
        return settle_spooled(k, inv, spooled)
    ctx = ToolContext(tenant_id=inv.tenant_id, session_id=inv.session_id, turn_id=inv.turn_id,
                      call_id=inv.call_id, step=inv.step, now=utcnow(), sources=k.sources, services=dict(k.services))
    entries: list[AuditEntry] = []
    recovered = k.pipeline.recover(tool_call_from_record(inv), ctx, audit=entries)
    if recovered is not None:
        return settle(k, inv, recovered, entries, events=ctx.events)
    result = ToolResult(call_id=inv.call_id, name=inv.name, is_error=True, error_code="timeout",
                        content={"error": "tool_timeout", "tool": inv.name, "code": "TIMEOUT",
                                 "message": "the tool did not finish within its hard time limit (its worker stopped, or it hung)"})
    entry = AuditEntry(tenant_id=inv.tenant_id, kind="tool_call", subject=inv.name, ok=False,
                       session_id=inv.session_id, turn_id=inv.turn_id,
                       payload={"call_id": inv.call_id, "step": inv.step, "error_code": "timeout",
                                "settled_by": "watchdog"})
    return settle(k, inv, result, [entry])


def _expire(k: Kortex, turn: TurnRecord) -> tuple[Ending, Cut | None] | None:
    """Fail ``turn`` for its deadline: the ending to announce and the step it cut mid-call, if
    any (for ``bill_cuts``); None when the turn ended otherwise first."""
    error = {"code": "deadline_exceeded", "message": "the turn did not finish before its deadline"}
    with k.db.begin() as conn:
        ended = turns.fail_turn(conn, turn, error)
        if ended is None:
            return None
        # Read again under the lock the compare-and-set took: ``turn`` was read before it, and a
        # step may have billed (or claimed the turn) since.
        now = turns.get_turn(conn, turn.tenant_id, turn.id)
        cut = cut_short(conn, turn, now)  # a dead worker's call is audited there (worker_lost)
        # Unfenced: the compare-and-set above won, so whichever attempt last wrote is over.
        ending = end_turn(k, conn, turn, [*settled_calls(ended),
                                          ErrorEvent(code="deadline_exceeded", message=error["message"]),
                                          DoneEvent(status="failed", usage=billed(now), error="deadline_exceeded")],
                          attempt=0)
    return ending, cut


class Pruning:
    """The retention policy (kortex/storage/retention.py), run at most once per
    ``retention.every`` by whoever offers it a turn each interval: the watchdog's leader, or the
    embedded mode's timer. Its run is bounded by ``retention.run_seconds``, so the sweeps that
    share its loop wait no longer than that."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._last: float | None = None  # when this process last started a run
        self._resume = 0  # where the last run stopped, when its time bound stopped it

    def run(self, k: Kortex) -> retention.PruneReport | None:
        """A run if one is due (None otherwise). The policy is read from ``k`` each time: the
        embedded mode may swap its settings."""
        policy = k.settings.retention
        started = self.clock()
        if not policy.enabled or (self._last is not None and started - self._last < policy.every):
            return None
        self._last = started  # also when it fails: a failing run is tried again in ``every``, not each sweep
        report = retention.prune(k.db, policy, now=utcnow(), start=self._resume, clock=self.clock)
        self._resume = report.resume
        if report.total or not report.finished:
            deleted = ", ".join(f"{n} {table}" for table, n in report.rows.items() if n) or "none"
            log.info("retention: deleted rows past their retention: %s%s", deleted,
                     "" if report.finished else f"; stopped at its {policy.run_seconds:g}s bound with more left, "
                                                f"for the next run (in {policy.every:g}s)")
        return report


def _prune(k: Kortex, pruning: Pruning) -> None:
    try:
        pruning.run(k)
    except Exception as exc:  # the sweep's own work is done; the next due run tries again
        _outages.failed("delete rows past their retention", exc)
    else:
        _outages.worked("delete rows past their retention")


def run_watchdog(k: Kortex, queue: QueuePort, leader: Leadership, *, every: float,
                 stop: threading.Event, alive: Callable[[], None] | None = None,
                 pruning: Pruning | None = None) -> None:
    """Sweep every ``every`` seconds while this process leads, until ``stop`` is set. A process
    that does not lead asks again each interval and takes over when the leader is gone.
    ``alive`` is called after every interval that reached the database (a health check's
    heartbeat: a leader that sweeps or a standby that asked), never while it cannot. The leader
    offers ``pruning`` a turn after each sweep."""
    pruning = pruning or Pruning()
    try:
        while not stop.is_set():
            try:
                leads = leader.ensure()
            except Exception as exc:  # the database is unreachable: no sweep, and no heartbeat
                _outages.failed("check the leadership", exc)
                stop.wait(every)
                continue
            _outages.worked("check the leadership")
            try:
                if leads:
                    report = sweep(k, queue)
                    queue.dispatch(report.handoff)
                    metrics.watchdog({"failed_turns": report.failed_turns, "timed_out_tools": report.timed_out_tools,
                                      "requeued_steps": report.requeued_steps,
                                      "requeued_tools": report.requeued_tools,
                                      "expired_proposals": report.expired_proposals,
                                      "recovered_executions": report.recovered_executions,
                                      "republished_events": report.republished_events})
                    _prune(k, pruning)
                if alive is not None:
                    alive()
            except Exception as exc:  # a database or broker outage: the next interval tries again
                _outages.failed("sweep", exc)
            else:
                _outages.worked("sweep")
            stop.wait(every)
    finally:
        leader.release()


__all__ = ["Pruning", "SweepReport", "run_watchdog", "sweep"]
