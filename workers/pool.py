"""Celery's threads pool, with the consumer woken when a task ends.

The consumer's loop (kombu's hub) asks Redis for the next message only while the prefetch
window has room: at every turn of the loop it registers a ``BRPOP`` if fewer messages than the
window are delivered and unacked. A threads pool acks from the task's own thread, so when the
window was full, the ack that frees a place in it does not wake the loop: the loop sleeps in
``epoll`` until its next timer, up to a second. Under a burst of tool calls (acked late, so
the window fills) the tools worker therefore took messages in waves, one a second (bench:
500 tool calls started in bursts with half-second gaps, each waiting up to 5 s in the queue
while the worker sat at a third of a core). Celery's own prefork pool has no such gap: its
results arrive on pipes the loop watches. This pool gives the threads pool one too.

``workers/app.py`` installs it as what ``-P threads`` names, for ``kortex worker`` and for
``celery -A workers.app worker`` alike.

Its tasks also send their events (started, succeeded: what Flower shows) from their own
threads, into a buffer Celery's event dispatcher assumes only the loop touches; ``Events``
gives the app a dispatcher that locks it.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from celery import concurrency
from celery.app.events import Events as CeleryEvents
from celery.concurrency.base import apply_target
from celery.concurrency.thread import ApplyResult
from celery.concurrency.thread import TaskPool as ThreadTaskPool
from celery.events import dispatcher
from celery.events.event import Event, group_from
from celery.utils.time import utcoffset


class TaskPool(ThreadTaskPool):
    """Runs each task in a thread as Celery's does; after the task (and its ack) it writes a
    byte to a pipe the consumer's loop reads, so the loop takes the next message at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._loop: Any = None

    def register_with_event_loop(self, loop: Any) -> None:
        self._loop = loop
        loop.add_reader(self._wake_r, self._drain)

    def on_apply(self, target: Callable[..., Any], args: tuple[Any, ...] | None = None,
                 kwargs: dict[str, Any] | None = None, callback: Callable[..., Any] | None = None,
                 accept_callback: Callable[..., Any] | None = None, **_: Any) -> ApplyResult:
        return ApplyResult(self.executor.submit(self._run, target, args, kwargs, callback, accept_callback))

    def _run(self, target: Callable[..., Any], args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None,
             callback: Callable[..., Any] | None, accept_callback: Callable[..., Any] | None) -> None:
        try:
            apply_target(target, args, kwargs, callback, accept_callback)
        finally:
            self._wake()

    def _wake(self) -> None:
        # A full pipe already holds a wake-up the loop has yet to read: one is enough.
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 4096):
                pass

    def on_stop(self) -> None:
        super().on_stop()  # waits for the running tasks, which may still write a wake-up
        if self._loop is not None:  # the loop must not poll a closed (later reused) descriptor
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._wake_r)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class EventDispatcher(dispatcher.EventDispatcher):
    """Celery's, with its task-event buffer shared safely between threads.

    A worker with an event loop buffers task events and the loop flushes them. Celery appends
    to the buffer without the dispatcher's lock, and its flush publishes the buffer and then
    empties it: an event a pool thread appended during that publish was dropped. A step task
    ends within a millisecond, so its started and succeeded events nearly always landed in the
    flush of its received event: Flower showed most step tasks RECEIVED for ever. Here the
    append and the taking of the buffer hold the lock, and a flush publishes what it took."""

    def send(self, type: str, blind: bool = False, utcoffset: Callable[[], float] = utcoffset,
             retry: bool = False, retry_policy: Any = None, Event: Any = Event, **fields: Any) -> Any:
        group = group_from(type)
        if not self.enabled or group not in self.buffer_group or (self.groups and group not in self.groups):
            return super().send(type, blind=blind, utcoffset=utcoffset, retry=retry, retry_policy=retry_policy,
                                Event=Event, **fields)
        event = Event(type, hostname=self.hostname, utcoffset=utcoffset(), pid=self.pid,
                      clock=self.clock.forward(), **fields)
        with self.mutex:
            buffer = self._group_buffer[group]
            buffer.append(event)
            full = len(buffer) >= self.buffer_limit
        if full:
            self.flush()
        elif self.on_send_buffered:
            self.on_send_buffered()
        return None

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        with self.mutex:
            if errors:
                for event, routing_key, _ in list(self._outbound_buffer):
                    self._publish(event, self.producer, routing_key)
                self._outbound_buffer.clear()  # as Celery's: what failed twice is dropped, not piled up
            if groups:
                taken = self._group_buffer
                self._group_buffer: defaultdict[str, list[Any]] = defaultdict(list)
                for group, events in taken.items():
                    if events:
                        self._publish(events, self.producer, f"{group}.multi")


class Events(CeleryEvents):
    """``app.events`` with the dispatcher above (``Celery(events=...)``, workers/app.py)."""

    dispatcher_cls = "workers.pool:EventDispatcher"


def install() -> None:
    """Make ``-P threads`` name this pool; Celery resolves the name when a worker starts."""
    concurrency.ALIASES["threads"] = "workers.pool:TaskPool"

