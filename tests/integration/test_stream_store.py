"""Stream writes from the step engine's event loop, on a real Redis: a write goes out at once,
whatever else the loop has to do, and a lane whose connection broke reconnects."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from kortex.errors import StreamError
from kortex.events import TextEvent
from kortex.stream.store import EventStore
from tests.integration.conftest import REDIS_URL
from tests.integration.redisproc import RedisServer
from tests.kortex.stream.test_store import check_deleted_turns_stay_closed

pytestmark = pytest.mark.integration


def _store(url: str, prefix: str) -> EventStore:
    return EventStore(redis.Redis.from_url(url, decode_responses=True), prefix=prefix,
                      async_redis=lambda: AsyncRedis.from_url(url, decode_responses=True, socket_timeout=5))


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"kxstore{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{name}:*"):
        client.delete(key)
    client.close()


@pytest.mark.parametrize("quick", [True, False])
def test_a_write_reaches_redis_before_the_loop_runs_anything_else(prefix: str, quick: bool) -> None:
    """Once a lane starts its pipeline, the command is on the wire before the loop turns to any
    other ready callback: on a busy loop (hundreds of streaming steps) one turn lasts 100 ms
    and more, and the client's first event used to wait it out before the write was sent."""
    store = _store(REDIS_URL, prefix)
    watcher = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    key = store.key("busy")

    async def go() -> list[object]:
        await store.aappend("warm", [TextEvent(step=0, delta="x")], attempt=1, quick=quick)  # the lane's connection
        seen: list[object] = []
        write = asyncio.ensure_future(store.aappend("busy", [TextEvent(step=0, delta="now")], attempt=1, quick=quick))
        # The write's task and the lane's sender get their first steps (the bulk lane first
        # lets one turn pass, gathering appends made in it).
        for _ in range(2 if quick else 3):
            await asyncio.sleep(0)
        # A callback that holds the loop, as a busy turn of it does: a blocking read of the
        # stream. A write still waiting for the loop could never be sent while it blocks.
        seen.append(watcher.xread({key: "0"}, block=2000) or "nothing within 2 s")
        await write
        await store.aclose()
        return seen

    try:
        (got,) = asyncio.run(go())
    finally:
        watcher.close()
        store.redis.close()
    assert got != "nothing within 2 s", "the write waited for the loop"
    assert [entry[1]["t"] for _, entries in got for entry in entries] == ["text"]  # type: ignore[union-attr]


def test_a_lane_whose_redis_restarted_reconnects_and_loses_nothing_it_was_told_was_written(
        tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    store = _store(server.url, "kxlane")

    async def go() -> tuple[list[str], list[str]]:
        outcomes: list[str] = []
        written: list[str] = []
        for i in range(6):
            if i == 2:
                server.kill()
            if i == 3:
                server.start()
            try:
                await store.aappend("t", [TextEvent(step=0, delta=str(i))], attempt=1, quick=True)
                outcomes.append("ok")
                written.append(str(i))
            except StreamError:
                outcomes.append("refused")
            await asyncio.sleep(0.05)
        await store.aclose()
        return outcomes, written

    try:
        outcomes, written = asyncio.run(go())
        entries = store.read("t")
    finally:
        store.redis.close()
        server.stop()
    assert outcomes[:2] == ["ok", "ok"] and outcomes[2] == "refused"  # Redis was down: told so
    assert outcomes[-2:] == ["ok", "ok"]  # back up: the lane connected again by itself
    # appendfsync always: what was acknowledged survived the kill, in order
    assert [TextEvent.model_validate_json(e.data).delta for e in entries] == written


def test_a_deleted_turns_stream_stays_closed_on_a_real_redis(prefix: str) -> None:
    store = _store(REDIS_URL, prefix)
    try:
        check_deleted_turns_stay_closed(store, f"t{uuid.uuid4().hex[:8]}")
    finally:
        store.close()
