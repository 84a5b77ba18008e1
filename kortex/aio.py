"""A per-process event loop on a background thread, for synchronous callers (Celery tasks, the
CLI) that drive the async domain. The loop outlives each call, so connection pools persist.

The loop is uvloop's where it is installed (a dependency everywhere but Windows), as uvicorn
picks it for the API: the step engine streams hundreds of steps on this one loop, and the
standard library's loop spent about a tenth of a busy turns worker's CPU on itself (py-spy).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows, or an install without it
        return asyncio.new_event_loop
    return uvloop.new_event_loop


new_loop = _loop_factory()


class LoopThread:
    def __init__(self, name: str = "kortex-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._loop is not None and self._pid == os.getpid()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        self._ensure()
        assert self._loop is not None
        return self._loop

    def _ensure(self) -> None:
        with self._lock:
            # After a fork the child inherits the object but not the thread: start afresh.
            if self._loop is not None and self._pid == os.getpid() and self._thread and self._thread.is_alive():
                return
            ready = threading.Event()
            loop = new_loop()

            def runner() -> None:
                asyncio.set_event_loop(loop)
                ready.set()
                loop.run_forever()

            thread = threading.Thread(target=runner, name=self._name, daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread, self._pid = loop, thread, os.getpid()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop: that would deadlock")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None and self._thread is not None and self._pid == os.getpid():
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=5)
                if not self._thread.is_alive():
                    # Stopped is not closed: the loop's selector, its wake-up pipe and (uvloop)
                    # io_uring and eventfd stay open until it is, six descriptors a container
                    # (a test suite's run of 1,400 tests passed select()'s limit of 1,024).
                    self._loop.close()
            self._loop = self._thread = self._pid = None
