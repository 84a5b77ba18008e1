"""What an API process does the moment it is told to stop, before uvicorn's graceful stop.

uvicorn stops taking connections and waits (``timeout_graceful_shutdown``) for the open ones to
finish. An event stream finishes when its turn does, so a stop waited the whole timeout, then
cancelled each stream mid-write (a traceback logged per stream, the client cut off with half an
event) and a restart in the meantime found the port still taken. uvicorn has no hook for the
start of a stop, but it catches SIGTERM and SIGINT with handlers of its own while it serves:
``on_stop_signal`` runs a callback on the event loop at such a signal, then hands the signal on
to uvicorn's handler, whose behaviour (a second Ctrl-C forces the exit) is unchanged."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signal(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` on ``loop`` when the process is told to stop; returns what undoes it.
    Outside the main thread (an app under a test client) signals cannot be caught: nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before: dict[int, object] = {}

    def caught(sig: int, frame: FrameType | None) -> None:
        try:
            loop.call_soon_threadsafe(callback)  # not here: a signal lands between any two bytecodes
        except RuntimeError:  # the loop has closed: nothing is left to end
            pass
        handler = before.get(sig)
        if callable(handler):
            handler(sig, frame)
        elif handler == signal.SIG_DFL:  # nobody caught it before: what it would have done
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)

    for sig in STOP_SIGNALS:
        before[sig] = signal.signal(sig, caught)

    def undo() -> None:
        for sig, handler in before.items():
            if signal.getsignal(sig) is caught:
                signal.signal(sig, handler)  # type: ignore[arg-type]

    return undo


__all__ = ["STOP_SIGNALS", "on_stop_signal"]
