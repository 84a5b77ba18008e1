"""The loop thread a container runs its streams on gives back what it opened when stopped."""

from __future__ import annotations

import asyncio
import os

from kortex.aio import LoopThread


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_stopped_loop_thread_leaves_no_descriptor_open() -> None:
    first = LoopThread("kortex-test-loop")
    first.run(asyncio.sleep(0))
    first.stop()  # whatever is opened once per process is open now
    before = _descriptors()
    for _ in range(10):
        loop = LoopThread("kortex-test-loop")
        assert loop.run(asyncio.sleep(0, result=7)) == 7
        loop.stop()
        assert not loop.started
    # a stopped but unclosed loop kept its selector, wake-up pipe, eventfd and io_uring: six a time
    assert _descriptors() - before < 3
