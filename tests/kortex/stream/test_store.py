"""The per-turn event stream: ordering, replay after an id, TTLs, text coalescing."""

from __future__ import annotations

import asyncio
import threading
import time

import fakeredis

from kortex.events import DoneEvent, TextEvent, TurnEvent
from kortex.stream.store import EventStore, StepPublisher


def _store(**kw) -> EventStore:
    return EventStore(fakeredis.FakeRedis(decode_responses=True), prefix="t", **kw)


def test_append_read_after_and_ttl() -> None:
    store = _store(active_ttl=600, done_ttl=60)
    ids = store.append("u1", [TurnEvent(turn_id="u1", status="running", step=0),
                              TextEvent(step=0, delta="a"), TextEvent(step=0, delta="b")])
    assert len(ids) == 3 and ids == sorted(ids)
    assert store.redis.ttl(store.key("u1")) == 600
    rest = store.read("u1", after=ids[0])
    assert [e.id for e in rest] == ids[1:] and [e.type for e in rest] == ["text", "text"]
    store.append("u1", [DoneEvent(status="done")], final=True)
    assert 0 < store.redis.ttl(store.key("u1")) <= 60
    assert [e.type for e in store.read("u1")][-1] == "done"
    assert not store.exists("nope")


def test_follow_ends_at_done() -> None:
    store = _store()

    def producer() -> None:
        for i in range(3):
            time.sleep(0.01)
            store.append("u2", [TextEvent(step=0, delta=str(i))])
        store.append("u2", [DoneEvent(status="done")], final=True)

    thread = threading.Thread(target=producer)
    thread.start()
    got = [e.type for e in store.follow("u2", block_ms=100)]
    thread.join()
    assert got == ["text", "text", "text", "done"]


def test_publisher_sends_the_first_delta_at_once_and_batches_the_rest() -> None:
    async def go():
        store = _store()
        pub = StepPublisher(store, "u3", 0, flush_ms=50)
        pub.text("first")
        assert len(store.read("u3")) == 1  # time to first token is not delayed
        for piece in ("a", "b", "c"):
            pub.text(piece)
        assert len(store.read("u3")) == 1  # still buffered
        await asyncio.sleep(0.12)  # the timer flushes without another delta arriving
        entries = store.read("u3")
        assert len(entries) == 2 and '"delta":"abc"' in entries[1].data
        pub.text("d")
        pub.emit(DoneEvent(status="done"), final=True)  # buffered text goes out before done
        assert [e.type for e in store.read("u3")][-2:] == ["text", "done"]

    asyncio.run(go())
