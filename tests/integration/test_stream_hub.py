"""The SSE hub on a real Redis: a reader that joins a stream another reader is blocked on gets
every entry from its own cursor, even when a read built before it joined has just returned."""

from __future__ import annotations

import asyncio
import time

import redis
from redis.asyncio import Redis as AsyncRedis

from kortex.stream.hub import StreamHub
from tests.integration.conftest import REDIS_URL


def test_late_subscriber_is_not_fed_a_read_that_started_after_its_cursor(redis_prefix: str) -> None:
    key = f"{redis_prefix}:hub-race"
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def go() -> tuple[list[str], list[str]]:
        hub = StreamHub(lambda: AsyncRedis.from_url(REDIS_URL, decode_responses=True,
                                                    single_connection_client=True, socket_timeout=None))
        await hub.start()
        try:
            for i in range(3):
                sync.xadd(key, {"t": "text", "d": str(i)})
            async with hub.subscribe(key) as first:
                seen_first = [(await first.get(2)).data for _ in range(3)]  # type: ignore[union-attr]
                await asyncio.sleep(0.2)  # the hub's XREAD now blocks after entry 2
                # Written without yielding to the loop, so the reply to that XREAD is already on
                # the reader's socket when the second reader joins from the beginning.
                sync.xadd(key, {"t": "text", "d": "3"})
                time.sleep(0.05)
                async with hub.subscribe(key) as late:
                    seen_late = []
                    while (entry := await late.get(1.0)) is not None:
                        seen_late.append(entry.data)
                return seen_first, seen_late
        finally:
            await hub.stop()
            sync.delete(key)

    seen_first, seen_late = asyncio.run(go())
    assert seen_first == ["0", "1", "2"]
    assert seen_late == ["0", "1", "2", "3"]
