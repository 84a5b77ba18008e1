"""Celery tasks: shells that take ids, make one call into kortex/, and hand on what it returns."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from kortex.config import Settings
from kortex.errors import KortexError, StorageError, StreamError
from kortex.postmortems.jobs import start_item
from kortex.turns.engine import EngineBusy
from kortex.turns.handoff import Handoff, StepDispatch, Trace
from kortex.turns.toolrun import run_tool
from kortex.turns.watchdog import sweep
from workers import runtime
from workers.app import app
from workers.dispatch import BUSY_PRIORITY, TRACE_HEADERS, CeleryQueue, dispatch
from workers.queues import Queue, TaskName

log = logging.getLogger(__name__)
# Decorator limits are fixed when the module loads; everything else reads the settings the
# app carries at call time (the embedded mode swaps them in before its worker starts).
TRANSIENT = (StorageError, StreamError)
BUSY_BACKOFF = 0.5  # seconds (jittered up to twice that) before a step the engine had no room for is offered again


def _settings() -> Settings:
    return app.conf.kortex_settings  # type: ignore[no-any-return]


@app.task(bind=True, name=TaskName.STEP.value, queue=Queue.TURNS.value, ignore_result=True, acks_late=True,
          soft_time_limit=60, time_limit=90, max_retries=None)
def step(self: Task, *, tenant_id: str, turn_id: str, step: int) -> None:
    """Hand the step to this process's step engine and return: the LLM stream waits on the
    engine's event loop, not in a worker slot. The message is taken without an ack (the
    turns queue is no_ack, workers/app.py); if the process dies before the step ends, the
    watchdog runs it again (its lease lapses, or its queued turn stops being touched). When
    the engine's waiting room is full (or this tenant's share of it), the step goes back to the
    queue for a moment rather than hold the slot that another tenant's step needs to get in;
    a stopping engine hands it straight back. The step's own time limit is enforced on the
    loop."""
    k = runtime.kortex(_settings())
    # Its lane, from the queue it came from: a step handed back (busy, stopping) goes back there.
    delivery = getattr(self.request, "delivery_info", None) or {}
    queue = delivery.get("routing_key")
    dispatched = StepDispatch(tenant_id=tenant_id, turn_id=turn_id, step=step, trace=_trace(self),
                              lane="batch" if queue == Queue.BATCH.value else "chat",
                              busy=delivery.get("priority") == BUSY_PRIORITY)
    try:
        try:
            k.engine.submit(dispatched, _hand_on, block=False)
        except EngineBusy:
            # No room: the engine keeps it and offers it again shortly (touched meanwhile, and
            # handed back if the process stops warmly).
            try:
                k.engine.defer(dispatched, _hand_on, BUSY_BACKOFF * (1 + random.random()))
            except EngineBusy:  # not even there: back to the queue, where any worker may take it
                time.sleep(BUSY_BACKOFF)  # not at once: this worker would take it straight back
                dispatch(app, Handoff(steps=(dispatched,)))
    except KortexError as exc:
        if exc.code != "shutting_down":
            raise
        dispatch(app, Handoff(steps=(dispatched,)))  # no ack to withhold: send it back for another worker


def _hand_on(outcome: Handoff | BaseException) -> None:
    if isinstance(outcome, KortexError) and outcome.code == "shutting_down":
        return  # the process is stopping: it hands the step back itself (workers/runtime.py)
    if isinstance(outcome, BaseException):
        log.error("a step ended with %s", outcome.__class__.__name__, exc_info=outcome)
        return
    dispatch(app, outcome)


def _trace(task: Task) -> Trace:
    """The caller's trace context, from the message headers (workers/dispatch.py puts it there)."""
    request = task.request
    headers = getattr(request, "headers", None) or {}
    found = {key: headers.get(key) or getattr(request, key, None) for key in TRACE_HEADERS}
    return tuple(sorted((k, str(v)) for k, v in found.items() if v))


@app.task(
    bind=True, name=TaskName.TOOL.value, queue=Queue.TOOLS.value, ignore_result=True, acks_late=True,
    autoretry_for=TRANSIENT, retry_backoff=True, retry_backoff_max=30, max_retries=5,
)
def tool(self: Task, *, tenant_id: str, invocation_id: str, tool: str, hard_limit: float) -> None:
    trace = _trace(self)
    try:
        handoff = runtime.run(_settings(), lambda k: run_tool(k, tenant_id, invocation_id, tool, hard_limit, trace))
    except SoftTimeLimitExceeded:
        # The pipeline answers at the tool's own timeout, so only storage hanging gets here.
        # The watchdog settles the call once its hard deadline passes.
        log.warning("tool %s (%s) hit the worker's soft time limit", tool, invocation_id)
        return
    dispatch(app, handoff)


@app.task(
    bind=True, name=TaskName.POSTMORTEM_ITEM.value, queue=Queue.BATCH.value, ignore_result=True, acks_late=True,
    autoretry_for=TRANSIENT, retry_backoff=True, retry_backoff_max=30, max_retries=5, soft_time_limit=30,
    time_limit=60,
)
def postmortem_item(self: Task, *, tenant_id: str, item_id: str) -> None:
    """Start one incident's post-mortem: create its turn and hand step 0 to the batch lane.
    Ids only in the arguments (Flower shows them); the job's progress lives in the database."""
    dispatch(app, runtime.run(_settings(), lambda k: start_item(k, tenant_id, item_id)))


@app.task(name=TaskName.WATCHDOG.value, queue=Queue.TURNS.value, ignore_result=True, acks_late=False,
          soft_time_limit=60, time_limit=90)
def watchdog() -> dict[str, Any]:
    """One sweep on demand (``celery call kortex.turn.watchdog``); the periodic sweeps run in
    ``kortex beat``'s own process, not here."""
    queue = CeleryQueue(app)
    report = runtime.run(_settings(), lambda k: sweep(k, queue))
    queue.dispatch(report.handoff)
    return {"failed_turns": report.failed_turns, "timed_out_tools": report.timed_out_tools,
            "requeued_steps": report.requeued_steps, "requeued_tools": report.requeued_tools,
            "expired_proposals": report.expired_proposals, "recovered_executions": report.recovered_executions}
