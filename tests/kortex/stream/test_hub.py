"""One reader connection serves many subscribers; new subscribers are picked up at once."""

from __future__ import annotations

import asyncio
import time

import fakeredis

from kortex.events import DoneEvent, TextEvent
from kortex.stream.hub import StreamHub
from kortex.stream.store import EventStore


def test_fans_out_many_streams_over_one_reader_and_replays_from_an_id() -> None:
    async def go():
        server = fakeredis.FakeServer()
        factory = lambda: fakeredis.FakeAsyncRedis(server=server, decode_responses=True)  # noqa: E731
        store = EventStore(fakeredis.FakeRedis(server=server, decode_responses=True), prefix="h")
        hub = StreamHub(factory, block_ms=5000)
        await hub.start()
        first_ids = store.append("a", [TextEvent(step=0, delta="a0"), TextEvent(step=0, delta="a1")])

        async def reader(turn: str, after: str) -> list[str]:
            out = []
            async with hub.subscribe(store.key(turn), after) as sub:
                async for entry in sub:
                    out.append(entry.data)
                    if entry.type == "done":
                        return out
            return out

        ra = asyncio.create_task(reader("a", "0-0"))
        ra_late = asyncio.create_task(reader("a", first_ids[0]))
        rb = asyncio.create_task(reader("b", "0-0"))
        await asyncio.sleep(0.05)
        assert hub.subscriber_count == 3
        started = time.monotonic()
        store.append("b", [TextEvent(step=0, delta="b0"), DoneEvent(status="done")])
        store.append("a", [DoneEvent(status="done")])
        a, a_late, b = await asyncio.wait_for(asyncio.gather(ra, ra_late, rb), 2)
        # The blocked XREAD was interrupted for the new subscribers, not left to its 5 s timeout.
        assert time.monotonic() - started < 1.0
        assert [x.split('"delta":"')[1][:2] for x in a[:2]] == ["a0", "a1"] and len(a) == 3
        assert len(a_late) == 2 and "a1" in a_late[0]
        assert len(b) == 2 and "b0" in b[0]
        assert hub.subscriber_count == 0
        await hub.stop()

    asyncio.run(go())


def test_stop_ends_the_reader_even_when_its_client_swallows_the_cancellation() -> None:
    """A shutdown that lands while the reader connects must not hang: some clients (fakeredis,
    in client_id) swallow the cancellation of the command in flight."""

    class Stubborn:
        async def client_id(self) -> int:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass  # swallowed, as the library does
            return 7

        async def aclose(self) -> None:
            return None

    async def go() -> float:
        hub = StreamHub(lambda: Stubborn())  # type: ignore[arg-type,return-value]
        await hub.start()
        await asyncio.sleep(0.01)  # the reader is inside client_id
        started = time.monotonic()
        await asyncio.wait_for(hub.stop(), timeout=3)
        return time.monotonic() - started

    assert asyncio.run(go()) < 1


def test_get_many_hands_over_everything_buffered_and_times_out_empty() -> None:
    async def go() -> tuple[list[str], list[str], list[str]]:
        server = fakeredis.FakeServer()
        factory = lambda: fakeredis.FakeAsyncRedis(server=server, decode_responses=True)  # noqa: E731
        store = EventStore(fakeredis.FakeRedis(server=server, decode_responses=True), prefix="h")
        hub = StreamHub(factory, block_ms=200)
        await hub.start()
        try:
            ids = store.append("t", [TextEvent(step=0, delta=str(i)) for i in range(5)])
            async with hub.subscribe(store.key("t")) as sub:
                got: list[str] = []
                while len(got) < 5:
                    got += [e.id for e in await sub.get_many(timeout=2)]
                idle = await sub.get_many(timeout=0.1)  # nothing more: an empty hand, not an error
            return ids, got, [e.id for e in idle]
        finally:
            await hub.stop()

    ids, got, idle = asyncio.run(go())
    assert got == ids and idle == []


def test_a_shards_next_read_follows_its_readers_as_they_join_advance_and_leave() -> None:
    """The kept pieces of a shard's next XREAD (kortex/stream/hub.py, _track) always name each
    stream with readers once, after its slowest reader's position, keys and ids in one order;
    a stream whose last reader left is no longer named."""
    import random

    from kortex.stream.entries import Entry
    from kortex.stream.hub import Subscription, _bulk

    async def go() -> None:
        hub = StreamHub(lambda: fakeredis.FakeAsyncRedis(decode_responses=True))
        shard = hub._shards[0]
        rng = random.Random(7)
        live: list[Subscription] = []
        for _ in range(2000):
            op = rng.random()
            if op < 0.35 or not live:
                sub = Subscription(hub, f"s:{rng.randrange(12)}", f"{rng.randrange(50)}-0", 10_000)
                shard.add([sub])
                live.append(sub)
            elif op < 0.55:
                sub = live.pop(rng.randrange(len(live)))
                shard.remove(sub)
            else:  # a round fed a stream: its readers move on, the read follows the slowest
                key = rng.choice(live).key
                at = max(s.cursor[0] for s in shard.subs[key]) + rng.randrange(1, 4)
                entries = [Entry(id=f"{n}-0", type="text", data="x") for n in range(at - 2, at + 1)]
                for sub in shard.subs[key]:
                    if rng.random() < 0.7:
                        sub._feed(entries)
                shard._track(key)
            expected = {key: min(subs, key=lambda s: s.cursor) for key, subs in shard.subs.items()}
            assert list(shard._keys) == list(shard._ids) == list(shard._since)
            assert set(shard._keys) == set(expected)
            for key, slowest in expected.items():
                assert shard._keys[key] == _bulk(key)
                assert shard._ids[key] == _bulk(slowest.cursor_id)
                assert shard._since[key] == slowest.cursor

    asyncio.run(go())
