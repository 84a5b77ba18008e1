"""Hand work to the queues: the one place that turns a domain ``Handoff`` into Celery messages."""

from __future__ import annotations

import functools
from typing import Any

from celery import Celery

from kortex import tracing
from kortex.turns.handoff import Handoff, ItemDispatch, Lane, StepDispatch, ToolDispatch, Trace
from kortex.turns.ports import Work
from workers.queues import Queue, TaskName


def warm(app: Celery) -> None:
    """Resolve what ``send_task`` resolves on first use, once, before traffic: Celery looks up
    its result backend lazily, scanning every installed package's entry points (py-spy: a
    burst of POSTs on a fresh API spent most of its time there); with
    ``result_backend_thread_safe`` (workers/app.py) all threads then share it."""
    _ = app.backend


#: the W3C trace context a hand-off carries in its message headers (kortex/tracing.py)
TRACE_HEADERS = ("traceparent", "tracestate")


def _headers(trace: Trace) -> dict[str, str] | None:
    """The trace context of the span that caused the work: the hand-off's own, or (the API
    posting a turn) the current span's. None when tracing is off: no header at all."""
    pairs = trace or tracing.carrier()
    return dict(pairs) if pairs else None


def _queue(lane: Lane, chat: Queue) -> str:
    """A batch turn's steps and tools share the batch queue; a chat turn's have one each."""
    return Queue.BATCH.value if lane == "batch" else chat.value


#: the message priority of a busy tenant's step (StepDispatch.busy). On Redis a lower number
#: is served first and every other message has 0, so these wait behind the rest of the queue.
BUSY_PRIORITY = 6


@functools.cache
def _on_redis(broker_url: str | None) -> bool:
    return (broker_url or "").startswith(("redis://", "rediss://", "unix://"))


def _declare(app: Celery, queue: str) -> list[Any] | None:
    """What ``send_task`` declares before publishing. Celery declares the target queue on every
    send (kombu binds a copy of the queue, its exchange and bindings to the channel just to find
    it in the connection's cache: a fifth of send_task's CPU). On Redis, Celery sends a message
    for a direct queue (all of ours, workers/app.py) through the anonymous exchange, an LPUSH
    onto the queue's list, which reads no binding: nothing to declare (a fresh list each time:
    kombu may add to it). A queue of another exchange type is routed by the bindings its
    declaration writes, and an AMQP broker drops a message for a queue that does not exist:
    there, Celery's own default."""
    if _on_redis(app.conf.broker_url) and app.amqp.queues[queue].exchange.type == "direct":
        return []
    return None


def _send(app: Celery, name: TaskName, kwargs: dict[str, Any], queue: str, **options: Any) -> None:
    # kwargsrepr is what Flower and the worker's log show (ids only, no tenant data): the
    # built-in repr of a flat dict of ids, not Celery's recursive saferepr (another fifth of
    # send_task's CPU).
    app.send_task(name.value, kwargs=kwargs, queue=queue, argsrepr="()", kwargsrepr=repr(kwargs),
                  declare=_declare(app, queue), **options)


def send_step(app: Celery, step: StepDispatch) -> None:
    _send(app, TaskName.STEP, {"tenant_id": step.tenant_id, "turn_id": step.turn_id, "step": step.step},
          _queue(step.lane, Queue.TURNS), headers=_headers(step.trace),
          priority=BUSY_PRIORITY if step.busy else None)


def send_tool(app: Celery, tool: ToolDispatch) -> None:
    _send(app, TaskName.TOOL, {"tenant_id": tool.tenant_id, "invocation_id": tool.invocation_id, "tool": tool.tool,
                               "hard_limit": tool.hard_limit},
          _queue(tool.lane, Queue.TOOLS), soft_time_limit=tool.soft_limit, time_limit=tool.hard_limit,
          headers=_headers(tool.trace))


def send_item(app: Celery, item: ItemDispatch) -> None:
    # Ids only: Flower shows the task by name with nothing a tenant would not want shown.
    _send(app, TaskName.POSTMORTEM_ITEM, {"tenant_id": item.tenant_id, "item_id": item.item_id}, Queue.BATCH.value)


def dispatch(app: Celery, handoff: Handoff) -> None:
    for tool in handoff.tools:
        send_tool(app, tool)
    for step in handoff.steps:
        send_step(app, step)
    for item in handoff.items:
        send_item(app, item)


class CeleryQueue:
    """The queue port (kortex.turns.ports.QueuePort) on Celery: hands off as ``dispatch`` does
    and reads a queue's depth from the broker (Redis: the lengths of its lists)."""

    _QUEUES: dict[Work, Queue] = {"steps": Queue.TURNS, "tools": Queue.TOOLS, "batch": Queue.BATCH}

    def __init__(self, app: Celery) -> None:
        self.app = app

    def dispatch(self, handoff: Handoff) -> None:
        dispatch(self.app, handoff)

    def backlog(self, work: Work, timeout: float = 1.0) -> int | None:
        """The depth of one queue, given up after ``timeout`` (see ``_fail_fast``): the watchdog
        reads three in each sweep, and with the broker down the connection's own retries held a
        sweep (and the deadline and lease work in it, which needs only the database) about
        6 s per queue."""
        with self._fail_fast(timeout) as conn:
            return self._depth(conn.default_channel, self._QUEUES[work])

    def depths(self, timeout: float = 0.4) -> dict[str, int]:
        """Every queue's depth by its name, for a scrape: one connection, each connect or
        command given up after ``timeout`` with no retry, and the first error raised (the
        rest would only fail too): Prometheus gives up on a scrape after 10 s."""
        with self._fail_fast(timeout) as conn:
            channel = conn.default_channel
            return {q.value: self._depth(channel, q) for q in self._QUEUES.values()}

    def _fail_fast(self, timeout: float) -> Any:
        """A broker connection whose connect and commands each give up after ``timeout``, with
        no retry: a connection for reading otherwise retries for seconds."""
        fail_fast = {"max_retries": 0, "socket_connect_timeout": timeout, "socket_timeout": timeout,
                     "retry_on_timeout": False}
        return self.app.connection_for_read(connect_timeout=timeout, transport_options=fail_fast)

    @staticmethod
    def _depth(channel: Any, queue: Queue) -> int:
        # Not passive: on Redis an empty queue has no key, and a passive declare calls that NOT_FOUND.
        # Declaring a virtual transport's queue only names it; its depth is the answer's count.
        return int(channel.queue_declare(queue=queue.value).message_count)
