"""The per-turn event stream: ordering, replay after an id, TTLs, text coalescing."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import fakeredis
import pytest

from kortex.errors import StaleAttempt, StreamError
from kortex.events import DoneEvent, TextEvent, TurnEvent
from kortex.stream.keys import turn_fence
from kortex.stream.store import TOMBSTONE_TTL, EventStore, StepPublisher, StreamClosed


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


def _async_store(**kw) -> EventStore:
    server = fakeredis.FakeServer()
    return EventStore(fakeredis.FakeRedis(server=server, decode_responses=True), prefix="t",
                      async_redis=lambda: fakeredis.FakeAsyncRedis(server=server, decode_responses=True), **kw)


def test_publisher_sends_the_first_delta_at_once_and_batches_the_rest() -> None:
    async def go():
        store = _async_store()
        pub = StepPublisher(store, "u3", 0, attempt=1, flush_ms=400)
        pub.text("first")
        deadline = time.monotonic() + 0.2  # well inside the flush interval: not held for it
        while len(store.read("u3")) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        assert len(store.read("u3")) == 1  # time to first token is not delayed
        # Text that arrives while a write is in flight goes out right after it; the test waits
        # for that write to settle, however long a busy machine makes it (a GC pause in a full
        # run once did), so what follows is the batching case.
        await pub.flush()
        for piece in ("a", "b", "c"):
            pub.text(piece)
        await asyncio.sleep(0.01)
        assert len(store.read("u3")) == 1  # still buffered
        await asyncio.sleep(0.6)  # the timer flushes without another delta arriving
        entries = store.read("u3")
        assert len(entries) == 2 and '"delta":"abc"' in entries[1].data
        pub.text("d")
        pub.emit(DoneEvent(status="done"))  # buffered text goes out before what is emitted
        await pub.flush()
        assert [e.type for e in store.read("u3")][-2:] == ["text", "done"]

    asyncio.run(go())


def test_every_event_carries_its_attempt_and_the_turns_sequence() -> None:
    store = _store()
    store.append("u4", [TurnEvent(turn_id="u4", status="running", step=0), TextEvent(step=0, delta="a")], attempt=1)
    store.append("u4", [TextEvent(step=0, delta="b")])  # a writer outside any attempt takes the current one
    store.append("u4", [TurnEvent(turn_id="u4", status="running", step=1)], attempt=2)
    bodies = [json.loads(e.data) for e in store.read("u4")]
    assert [(b["attempt"], b["seq"]) for b in bodies] == [(1, 1), (1, 2), (1, 3), (2, 4)]
    assert TextEvent.model_validate(bodies[1]).attempt == 1  # clients parse them as event fields


def test_a_superseded_attempt_cannot_write_and_nothing_follows_done() -> None:
    store = _store()
    store.append("u5", [TurnEvent(turn_id="u5", status="running", step=0), TextEvent(step=0, delta="tok")],
                 attempt=1)
    store.append("u5", [TurnEvent(turn_id="u5", status="running", step=0)], attempt=2)  # the step is re-run
    with pytest.raises(StaleAttempt):
        store.append("u5", [TextEvent(step=0, delta="tok")], attempt=1)  # the paused first attempt wakes up
    store.append("u5", [TextEvent(step=0, delta="tok"), DoneEvent(status="done")], attempt=2, final=True)
    with pytest.raises(StreamClosed):
        store.append("u5", [TextEvent(step=0, delta="late")])
    assert [(e.type, json.loads(e.data)["attempt"]) for e in store.read("u5")] == [
        ("turn", 1), ("text", 1), ("turn", 2), ("text", 2), ("done", 2)]


def test_a_stopped_attempt_cannot_write_but_the_done_after_it_can() -> None:
    """A cancel stops the step it cut short without closing the stream: the step's next write
    is refused, and the cancel's own done (outside any attempt) goes in under that attempt."""
    store = _store(active_ttl=600)
    store.stop("u11", 2)  # before the step wrote anything: the fence is born with the stream's TTL
    assert store.redis.ttl(turn_fence("t", "u11")) == 600
    for attempt in (1, 2):
        with pytest.raises(StreamClosed):
            store.append("u11", [TurnEvent(turn_id="u11", status="running", step=0)], attempt=attempt)
    store.stop("u12", 1)
    store.stop("u12", 1)  # twice is once
    store.append("u12", [DoneEvent(status="cancelled")], final=True)
    assert [(e.type, json.loads(e.data)["attempt"]) for e in store.read("u12")] == [("done", 0)]
    store.append("u13", [TurnEvent(turn_id="u13", status="running", step=0), TextEvent(step=0, delta="a")],
                 attempt=1)
    store.stop("u13", 1)
    with pytest.raises(StreamClosed):
        store.append("u13", [TextEvent(step=0, delta="late")], attempt=1)
    store.append("u13", [DoneEvent(status="cancelled")], final=True)
    assert [(e.type, json.loads(e.data)["attempt"]) for e in store.read("u13")] == [
        ("turn", 1), ("text", 1), ("done", 1)]


def test_only_a_later_attempt_reopens_a_closed_stream() -> None:
    """``done`` went out inside a transaction that never committed: the step runs again under
    a higher attempt, and its events must reach the stream; nothing else may follow done."""
    store = _store()
    store.append("u8", [TurnEvent(turn_id="u8", status="running", step=0)], attempt=3)
    store.append("u8", [DoneEvent(status="done")], attempt=3, final=True)
    for attempt in (0, 3):
        with pytest.raises(StreamClosed):
            store.append("u8", [TextEvent(step=0, delta="late")], attempt=attempt)
    store.append("u8", [TurnEvent(turn_id="u8", status="running", step=0)], attempt=4)
    store.append("u8", [TextEvent(step=0, delta="again"), DoneEvent(status="done")], attempt=4, final=True)
    with pytest.raises(StreamClosed):
        store.append("u8", [TextEvent(step=0, delta="late")], attempt=4)
    assert [(e.type, json.loads(e.data)["attempt"]) for e in store.read("u8")] == [
        ("turn", 3), ("done", 3), ("turn", 4), ("text", 4), ("done", 4)]


def check_deleted_turns_stay_closed(store: EventStore, turn: str) -> None:
    """A turn cancelled (its ``done`` in, closing the stream) while its step still streams, and
    its session deleted: the step's next write is refused, and nothing makes the stream again."""
    store.append(turn, [TurnEvent(turn_id=turn, status="running", step=0), TextEvent(step=0, delta="a")], attempt=1)
    store.append(turn, [DoneEvent(status="cancelled")], final=True)  # the cancel, unfenced
    store.delete(turn)
    assert not store.exists(turn)
    for attempt in (1, 0, 2):  # the running step; a tool result or the watchdog; any later attempt
        with pytest.raises(StreamClosed):
            store.append(turn, [TextEvent(step=0, delta="late")], attempt=attempt)
    assert not store.exists(turn) and store.read(turn) == []
    assert 0 < store.redis.ttl(turn_fence(store.prefix, turn)) <= TOMBSTONE_TTL  # a tombstone, not kept forever

    never_closed = turn + "-open"  # deleted with no done in (its fence expired, or none was written)
    store.append(never_closed, [TextEvent(step=0, delta="a")], attempt=1)
    store.delete(never_closed)
    with pytest.raises(StreamClosed):
        store.append(never_closed, [TextEvent(step=0, delta="late")], attempt=1)
    assert not store.exists(never_closed)


def test_a_deleted_turns_stream_stays_closed_to_a_step_still_running() -> None:
    check_deleted_turns_stay_closed(_store(), "u10")


def test_a_publisher_of_a_deleted_turn_stops_at_its_next_write() -> None:
    async def go() -> None:
        store = _async_store()
        stopped: list[bool] = []
        publisher = StepPublisher(store, "u11", step=0, attempt=1, flush_ms=0, on_stale=lambda: stopped.append(True))
        publisher.text("first")
        await publisher.flush()
        store.append("u11", [DoneEvent(status="cancelled")], final=True)
        store.delete("u11")
        publisher.text("second")
        with pytest.raises(StaleAttempt):
            await publisher.flush()
        assert stopped == [True] and not store.exists("u11")
        await store.aclose()

    asyncio.run(go())


def test_a_stream_gets_its_ttl_whatever_event_comes_first() -> None:
    store = _store(active_ttl=600, done_ttl=60)
    store.append("u9", [TextEvent(step=0, delta="a tool's progress before any step event")])
    assert store.redis.ttl(store.key("u9")) == 600
    assert store.redis.ttl(turn_fence("t", "u9")) == 600  # the fence hash goes with its stream


def test_a_fenced_publisher_stops_and_says_so() -> None:
    async def go():
        store = _async_store()
        stopped = []
        pub = StepPublisher(store, "u6", 0, attempt=1, flush_ms=0, on_stale=lambda: stopped.append(True))
        pub.text("a")
        await pub.flush()
        store.append("u6", [TurnEvent(turn_id="u6", status="running", step=0)], attempt=2)
        pub.text("b")
        with pytest.raises(StaleAttempt):
            await pub.flush()
        assert stopped == [True] and pub.stale
        pub.text("c")  # ignored from now on
        assert [json.loads(e.data).get("delta") for e in store.read("u6")] == ["a", None]

    asyncio.run(go())


def test_a_publisher_keeps_text_through_a_failed_write() -> None:
    async def go():
        store = _async_store()
        pub = StepPublisher(store, "u7", 0, attempt=1, flush_ms=0)
        real = store.aappend
        calls = {"n": 0}

        async def flaky(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] <= 2:
                raise StreamError("redis went away")
            return await real(*args, **kwargs)

        store.aappend = flaky  # type: ignore[method-assign]
        for piece in ("a", "b", "c"):
            pub.text(piece)
        await pub.flush()
        assert "".join(json.loads(e.data)["delta"] for e in store.read("u7")) == "abc"

    asyncio.run(go())


def test_appends_made_together_share_one_pipeline_and_keep_their_own_replies() -> None:
    async def go():
        store = _async_store()
        store.append("fenced", [TurnEvent(turn_id="fenced", status="running", step=0)], attempt=2)
        await store.aappend("warm", [TextEvent(step=0, delta="x")])  # makes the batch
        batch = store._batch
        sent = []
        real = batch._pipeline

        async def spy(items):
            sent.append(len(items))
            return await real(items)

        batch._pipeline = spy
        writes = [store.aappend(f"t{i}", [TextEvent(step=0, delta=str(i))], attempt=1) for i in range(40)]
        writes.append(store.aappend("fenced", [TextEvent(step=0, delta="late")], attempt=1))
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert sent == [41]  # one round trip for all of them
        assert all(isinstance(r, list) and len(r) == 1 for r in results[:40])
        assert isinstance(results[40], StaleAttempt)  # refused alone
        assert [json.loads(e.data)["delta"] for e in store.read("t7")] == ["7"]

    asyncio.run(go())


@pytest.mark.parametrize("delta", ["plain", 'quotes " and \\\\ backslash', "naïve — ünïcode ✓", "ctrl \x01\n\t", ""])
def test_pre_encoded_text_is_the_json_of_a_text_event(delta: str) -> None:
    from kortex.stream.store import Encoded

    encoded = Encoded.text(3, delta)
    assert encoded.type == "text"
    assert json.loads(encoded.body) == json.loads(TextEvent(step=3, delta=delta).model_dump_json(exclude={"attempt", "seq"}))
    store = _store()
    store.append("u10", [encoded], attempt=1)
    (entry,) = store.read("u10")
    assert TextEvent.model_validate_json(entry.data) == TextEvent(step=3, delta=delta, attempt=1, seq=1)


def test_a_quick_append_does_not_wait_behind_the_bulk_pipeline_in_flight() -> None:
    async def go():
        store = _async_store()
        await store.aappend("warm", [TextEvent(step=0, delta="x")])  # makes both lanes
        bulk = store._batch
        held = asyncio.Event()
        release = asyncio.Event()
        real = bulk._pipeline

        async def slow(items):  # the bulk lane's round trip takes as long as the test says
            held.set()
            await release.wait()
            return await real(items)

        bulk._pipeline = slow
        streamed = [asyncio.ensure_future(store.aappend(f"busy{i}", [TextEvent(step=0, delta="...")], attempt=1))
                    for i in range(20)]
        await asyncio.wait_for(held.wait(), 2)
        first = await asyncio.wait_for(store.aappend(
            "newcomer", [TurnEvent(turn_id="newcomer", status="running", step=0)], attempt=1, quick=True), 2)
        assert len(first) == 1 and [e.type for e in store.read("newcomer")] == ["turn"]
        assert not any(w.done() for w in streamed)  # the bulk was still in flight meanwhile
        release.set()
        await asyncio.gather(*streamed)

    asyncio.run(go())


def test_a_publisher_sends_its_step_quick_until_its_first_text_is_out() -> None:
    lanes: list[tuple[list[str], bool]] = []

    class Recording:
        async def aappend(self, turn_id, events, *, attempt=0, final=False, quick=False):
            lanes.append(([e.type for e in events], quick))
            return ["1-0"] * len(events)

    async def go():
        pub = StepPublisher(Recording(), "t", 0, attempt=1, flush_ms=0)  # type: ignore[arg-type]
        pub.emit(TurnEvent(turn_id="t", status="running", step=0))
        await pub.flush()
        pub.text("first")
        await pub.flush()
        pub.text("more")
        pub.emit(DoneEvent(status="done"))
        await pub.flush()

    asyncio.run(go())
    assert lanes == [(["turn"], True), (["text"], True), (["text", "done"], False)]
