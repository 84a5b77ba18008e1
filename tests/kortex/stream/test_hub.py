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
