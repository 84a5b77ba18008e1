"""A thread pool that takes its queued work key by key (tenant by tenant), not oldest first.

The step engine's blocking work (claims, closing writes, audit rows) runs on a few I/O threads,
as many as the database pool has connections. With one FIFO queue in front of them, a tenant
that starts 500 turns at once queued 500 claims ahead of everyone else's: another tenant's
one-step turn waited behind all of them (fairness bench: its first event 100-700 ms after its
POST was answered, while the flood's steps were being claimed). Here each key has its own
queue and a free thread takes the next piece of work from the next key in the ring, so a
caller waits for at most one piece of each other key's work ahead of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from kortex.roundrobin import RoundRobin

T = TypeVar("T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class FairThreadPool(Executor):
    """At most ``workers`` threads (started as work arrives, then kept); ``submit_for(key, ...)``
    queues under ``key``, ``submit`` under the empty key. The ring serves keys in turn."""

    def __init__(self, workers: int, name: str = "fair") -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one thread")
        self._max = workers
        self._name = name
        self._cv = threading.Condition()
        self._queued: RoundRobin[_Work] = RoundRobin()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for work (each will take one piece once woken)
        self._closed = False

    @property
    def queued(self) -> int:
        return len(self._queued)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.submit_for("", fn, *args, **kwargs)

    def submit_for(self, key: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queued.push(key, (future, fn, args, kwargs))
            self._cv.notify()
            if len(self._queued) > self._idle and len(self._threads) < self._max:
                thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _next(self) -> _Work | None:
        with self._cv:
            while not self._queued:
                if self._closed:
                    return None
                self._idle += 1
                try:
                    self._cv.wait()
                finally:
                    self._idle -= 1
            return self._queued.pop()

    def _work(self) -> None:
        while (work := self._next()) is not None:
            future, fn, args, kwargs = work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller, as ThreadPoolExecutor does
                future.set_exception(exc)
            else:
                future.set_result(result)
            del work, future, fn, args, kwargs

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cv:
            self._closed = True
            if cancel_futures:
                for future, *_ in self._queued.clear():
                    future.cancel()
            self._cv.notify_all()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
