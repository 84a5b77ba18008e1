"""The engine's I/O threads take queued work tenant by tenant (kortex/fairthreads.py)."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from kortex.fairthreads import FairThreadPool


def test_queued_work_is_taken_key_by_key_not_oldest_first() -> None:
    pool = FairThreadPool(1)
    gate, holding = threading.Event(), threading.Event()
    order: list[str] = []
    try:
        pool.submit_for("a", lambda: holding.set() or gate.wait(5))  # holds the only thread ...
        assert holding.wait(5)  # ... from before the rest is queued
        futures = [pool.submit_for("a", order.append, f"a{i}") for i in range(5)]
        futures += [pool.submit_for("b", order.append, "b0"), pool.submit_for("c", order.append, "c0"),
                    pool.submit_for("b", order.append, "b1")]
        gate.set()
        for f in futures:
            f.result(5)
        # b and c queued behind five of a's: each waited for one of a's, not all of them.
        assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "a3", "a4"]
    finally:
        gate.set()
        pool.shutdown()


def test_results_and_exceptions_reach_the_caller_and_threads_are_bounded() -> None:
    pool = FairThreadPool(3)
    try:
        assert pool.submit(lambda x: x * 2, 21).result(5) == 42

        def boom() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            pool.submit_for("t", boom).result(5)
        seen: set[str] = set()
        barrier = threading.Barrier(3, timeout=5)

        def meet() -> None:
            seen.add(threading.current_thread().name)
            barrier.wait()

        for f in [pool.submit_for(str(i % 2), meet) for i in range(3)]:
            f.result(5)  # three at once: only possible on three threads
        assert len(pool._threads) == 3
        for f in [pool.submit(lambda: None) for _ in range(50)]:
            f.result(5)
        assert len(pool._threads) == 3
    finally:
        pool.shutdown()


def test_shutdown_can_cancel_what_is_queued_and_refuses_new_work() -> None:
    pool = FairThreadPool(1)
    gate, started = threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or gate.wait(5))
    assert started.wait(5)
    queued = pool.submit_for("a", lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert running.result(5) is True  # what had started finishes
    with pytest.raises(CancelledError):
        queued.result(5)
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    pool.shutdown(wait=True)
