"""The SSE hub on a real Redis: a reader that joins a stream another reader is blocked on gets
every entry from its own cursor, even when a read built before it joined has just returned."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis

from kortex.stream.hub import StreamHub, Subscription, _raw
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


def _hub(**kwargs: Any) -> StreamHub:
    return StreamHub(lambda: AsyncRedis.from_url(REDIS_URL, decode_responses=True, single_connection_client=True,
                                                 socket_timeout=None, client_name="kx-hub-test"), **kwargs)


def test_many_streams_joining_while_reads_run_each_get_every_entry_once_in_order(redis_prefix: str) -> None:
    """Readers join in waves while the shards are mid-read and writers keep writing: each reader
    sees exactly the entries after its starting id, in order, and none waits for a block timeout."""
    streams = 300
    per_stream = 12
    keys = [f"{redis_prefix}:many:{n}" for n in range(streams)]
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    written: dict[str, list[str]] = {key: [] for key in keys}

    async def go() -> dict[str, list[str]]:
        hub = _hub(block_ms=30_000, shards=3)
        await hub.start()
        try:
            for key in keys:  # history before anyone reads
                for i in range(per_stream // 2):
                    written[key].append(sync.xadd(key, {"t": "text", "d": f"{i}", "a": "1", "s": str(i)}))

            async def reader(n: int, key: str) -> tuple[str, list[str]]:
                # Half start from the beginning, half from their stream's second entry.
                after = "0-0" if n % 2 else written[key][1]
                got = []
                async with hub.subscribe(key, after) as sub:
                    while len(got) < per_stream - (0 if n % 2 else 2):
                        entries = await sub.get_many(timeout=10)
                        assert entries, f"reader {n} waited 10 s for an entry"
                        got.extend(e.id for e in entries)
                return key, got

            async def writer() -> None:
                for i in range(per_stream // 2, per_stream):
                    for key in keys:
                        written[key].append(sync.xadd(key, {"t": "text", "d": f"{i}"}))
                    await asyncio.sleep(0.01)

            tasks = []
            for wave in range(3):  # joins arrive while earlier readers' reads are blocked or in flight
                tasks += [asyncio.create_task(reader(n, keys[n])) for n in range(wave, streams, 3)]
                if wave == 0:
                    write = asyncio.create_task(writer())
                await asyncio.sleep(0.02)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            await write
            assert hub.subscriber_count == 0
            return dict(results)
        finally:
            await hub.stop()
            sync.delete(*keys)

    results = asyncio.run(go())
    for n, key in enumerate(keys):
        expected = written[key] if n % 2 else written[key][2:]
        assert results[key] == expected, key


def test_readers_carry_on_without_loss_after_the_hub_loses_its_redis_connections(redis_prefix: str) -> None:
    key = f"{redis_prefix}:hub-kill"
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def go() -> tuple[list[str], list[str]]:
        hub = _hub(block_ms=2000, shards=2)
        await hub.start()
        ids: list[str] = []
        got: list[str] = []
        try:
            async with hub.subscribe(key) as sub:
                for i in range(5):
                    ids.append(sync.xadd(key, {"t": "text", "d": str(i)}))
                while len(got) < 5:
                    got.extend(e.id for e in await sub.get_many(timeout=5))
                await asyncio.sleep(0.1)  # blocked again
                killed = 0
                for client in sync.client_list():
                    if client.get("name") == "kx-hub-test":
                        sync.client_kill_filter(_id=client["id"])
                        killed += 1
                assert killed >= 2  # the readers and the control connection
                for i in range(5, 10):
                    ids.append(sync.xadd(key, {"t": "text", "d": str(i)}))
                while len(got) < 10:
                    entries = await sub.get_many(timeout=10)
                    assert entries, "no entry within 10 s of the reconnect"
                    got.extend(e.id for e in entries)
            return ids, got
        finally:
            await hub.stop()
            sync.delete(key)

    ids, got = asyncio.run(go())
    assert got == ids


def test_a_reader_that_falls_too_far_behind_is_told_to_reconnect(redis_prefix: str) -> None:
    from kortex.stream.hub import SubscriptionOverflow

    key = f"{redis_prefix}:hub-overflow"
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def go() -> tuple[list[str], list[str], bool]:
        hub = _hub(max_backlog=20)
        await hub.start()
        try:
            async with hub.subscribe(key) as sub:
                first = sync.xadd(key, {"t": "text", "d": "0"})
                seen = [(await sub.get(5)).id]  # type: ignore[union-attr]
                pipe = sync.pipeline()
                for i in range(100):
                    pipe.xadd(key, {"t": "text", "d": str(i)})
                written = [first, *pipe.execute()]
                told = False
                try:
                    while True:
                        entry = await sub.get(5)
                        assert entry is not None
                        seen.append(entry.id)
                except SubscriptionOverflow:
                    told = True
            return seen, written, told
        finally:
            await hub.stop()
            sync.delete(key)

    seen, written, told = asyncio.run(go())
    # What it was handed came in order with no gap, then it was told to reconnect (from its
    # last id, losing nothing) instead of buffering without bound.
    assert told and seen == written[:len(seen)]



def test_a_new_turns_first_answer_is_not_held_by_a_busy_shards_pause(redis_prefix: str) -> None:
    """Twenty busy streams keep the only shard in paced rounds of 5 s. A reader joins a stream
    with nothing in it yet (a queued turn): its status entry (the preamble) and then its first
    text arrive at once, not at the next paced round, and its later entries, read by its own
    shard from then on, arrive once each and in order."""
    busy = [f"{redis_prefix}:busy:{n}" for n in range(20)]
    key = f"{redis_prefix}:newcomer"
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def go() -> tuple[list[float], list[str], list[str]]:
        hub = _hub(shards=1, round_ms=5000, block_ms=30_000, preamble=frozenset({"turn"}))
        await hub.start()
        stop = asyncio.Event()

        async def keep_busy() -> None:
            while not stop.is_set():
                for k in busy:
                    sync.xadd(k, {"t": "text", "d": "x"})
                await asyncio.sleep(0.01)

        async def drain(k: str) -> None:
            async with hub.subscribe(k) as sub:
                while not stop.is_set():
                    await sub.get_many(timeout=0.5)

        writer = asyncio.create_task(keep_busy())
        readers = [asyncio.create_task(drain(k)) for k in busy]
        try:
            await asyncio.sleep(0.5)  # the busy shard is in its 5 s pause from now on
            async with hub.subscribe(key) as sub:
                await asyncio.sleep(0.3)  # joined; the round it cut short has been read
                written: list[str] = []
                got: list[str] = []
                waited = []
                for kind in ("turn", "text"):  # each written once the one before has been read
                    written.append(sync.xadd(key, {"t": kind, "d": kind}))
                    began = time.monotonic()
                    entry = await sub.get(timeout=10)
                    waited.append(time.monotonic() - began)
                    got += [entry.id] if entry is not None else []
                written += [sync.xadd(key, {"t": "text", "d": str(i)}) for i in range(3)]
                while len(got) < len(written):
                    entries = await sub.get_many(timeout=12)
                    assert entries, "the reader's later entries never came"
                    got.extend(e.id for e in entries)
                return waited, written, got
        finally:
            stop.set()
            await asyncio.gather(writer, *readers, return_exceptions=True)
            await hub.stop()
            sync.delete(key, *busy)

    waited, written, got = asyncio.run(go())
    assert got == written  # each once, in order, across the move between shards
    assert max(waited) < 2.0, f"the first events waited {waited} s for the busy shard's 5 s round"


def test_a_shards_read_leaves_before_the_loop_runs_anything_else(redis_prefix: str) -> None:
    """With the client as production makes it (a socket timeout), a shard's XREAD is on the wire
    in the step that builds it: redis-py would send it from a task of its own, a turn of the
    loop later, and on a busy API loop a turn is milliseconds before every read and every
    newcomer's first entry."""
    key = f"{redis_prefix}:hub-send"
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def go() -> str:
        hub = StreamHub(lambda: AsyncRedis.from_url(REDIS_URL, decode_responses=True, single_connection_client=True,
                                                    socket_timeout=30))
        shard = hub._shards[0]
        reader = _raw(hub._factory())
        client_id = int(await reader.client_id())
        shard._unhurried(reader)
        shard.add([Subscription(hub, key, "0-0", 100)])  # what the round names: this stream, from the start
        read = asyncio.ensure_future(shard._xread(reader, 10, 2000))
        await asyncio.sleep(0)  # the read's first step
        # Hold the loop, as a busy turn of it does, and look at what Redis has from the reader.
        deadline = time.monotonic() + 1.0
        command = ""
        while time.monotonic() < deadline:
            command = next(c["cmd"] for c in sync.client_list() if int(c["id"]) == client_id)
            if command == "xread":
                break
            time.sleep(0.01)
        sync.xadd(key, {"t": "text", "d": "x"})
        assert await asyncio.wait_for(read, 5)  # the read still ends with the entry
        await reader.aclose()
        return command

    try:
        assert asyncio.run(go()) == "xread"
    finally:
        sync.delete(key)
        sync.close()
