"""Per-process runtime of a worker: one event loop thread and one Kortex container, created in
the process that uses them (after the prefork fork, never before)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from celery.signals import worker_process_shutdown

from kortex.aio import LoopThread
from kortex.config import Settings
from kortex.container import Kortex

T = TypeVar("T")

_loop = LoopThread("kortex-worker-loop")
_kortex: Kortex | None = None
_pid: int | None = None
_lock = threading.Lock()


def kortex(settings: Settings) -> Kortex:
    """This process's container, rebuilt after a fork or when the settings object changes."""
    global _kortex, _pid
    with _lock:
        if _kortex is None or _pid != os.getpid() or _kortex.settings is not settings:
            _kortex = Kortex.create(settings)
            _pid = os.getpid()
        return _kortex


def run(settings: Settings, work: Callable[[Kortex], Coroutine[Any, Any, T]], timeout: float | None = None) -> T:
    """Run ``work(kortex)`` on this process's loop and wait for it."""
    k = kortex(settings)
    return _loop.run(work(k), timeout)


def loop_responsive(timeout: float) -> bool:
    """Whether this process's loop still runs coroutines (a tool may have blocked its thread)."""

    async def ping() -> bool:
        return True

    try:
        return _loop.run(ping(), timeout)
    except Exception:
        return False


def wait_to_be_killed(limit: float) -> None:
    """The loop is wedged by code that ignores cancellation: nothing this process runs can
    finish. Block until the worker's hard time limit replaces the process with a fresh one."""
    time.sleep(limit)


@worker_process_shutdown.connect
def _close(**_: Any) -> None:
    global _kortex
    if _kortex is not None and _pid == os.getpid():
        try:
            _loop.run(_kortex.aclose(), timeout=5)
        except Exception:  # shutting down anyway
            pass
        _kortex = None
    _loop.stop()
