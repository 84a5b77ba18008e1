"""Queued items taken key by key (tenant by tenant) in turn, not oldest first: whoever queues
under a key waits for at most one item of each other key ahead of it. The API's post and
stream lanes (api/deps.py, ``FairLane``) and the step engine's I/O threads
(kortex/fairthreads.py) both serve their waiting work this way. Not thread-safe: callers hold
their own lock (or stay on one event loop)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RoundRobin(Generic[T]):
    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        self._ring: deque[str] = deque()  # keys with items queued, in serving order
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def push(self, key: str, item: T) -> None:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._ring.append(key)
        queue.append(item)
        self._n += 1

    def pop(self) -> T:
        """The next key's oldest item; that key then waits for every other key's turn.
        IndexError when nothing is queued."""
        key = self._ring[0]
        queue = self._queues[key]
        item = queue.popleft()
        self._n -= 1
        if queue:
            self._ring.rotate(-1)
        else:
            del self._queues[key]
            self._ring.popleft()
        return item

    def clear(self) -> list[T]:
        """Everything queued, taken out."""
        items = list(self)
        self._queues.clear()
        self._ring.clear()
        self._n = 0
        return items
