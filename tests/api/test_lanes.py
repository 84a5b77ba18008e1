"""A burst of turn posts does not hold up the opening of event streams: each has its own lane
of the API's thread pool (api/deps.py, Lanes). Over a real socket, with posts held inside
the request (their enqueue blocks) until the stream has opened."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from api.main import create_app
from kortex.turns.handoff import Handoff
from tests.api.test_stream_slots import serve
from tests.conftest import Harness

# More posts in flight than the thread pool's shared limiter (40) has threads: before the
# lanes, they held all of them and a stream's open waited for the last post.
POSTS = 48


@pytest.fixture
def held() -> threading.Event:
    return threading.Event()


@pytest.fixture
def server(harness_factory: Any, held: threading.Event) -> Iterator[tuple[str, Any, Harness]]:
    h = harness_factory(turn={"heartbeat": 0.1}, llm={"budget": {"max_concurrent_turns_per_tenant": 100}})
    entered = [0]

    def dispatch(handoff: Handoff) -> None:
        entered[0] += 1
        held.wait(30)  # the broker is slow: each post holds its thread here

    app = create_app(h.settings, dispatch=dispatch, embedded_worker=False)
    app.state_entered = entered  # type: ignore[attr-defined]
    with serve(app) as url:
        yield url, app, h
        held.set()


def test_streams_open_while_a_burst_of_posts_holds_the_thread_pool(server, held: threading.Event) -> None:
    url, app, h = server
    key = h.api_key(h.tenant("busy"))
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        sessions = [client.post("/v1/sessions", json={"model": "scripted:text_only"}).json()["id"]
                    for _ in range(POSTS + 1)]
        held.set()  # the first turn posts and enqueues at once
        first = client.post(f"/v1/sessions/{sessions[0]}/messages", json={"content": "hi"}).json()
        held.clear()
        with ThreadPoolExecutor(POSTS) as pool:
            posts = [pool.submit(client.post, f"/v1/sessions/{sid}/messages", json={"content": "hi"})
                     for sid in sessions[1:]]
            deadline = time.monotonic() + 20
            while app.state_entered[0] < 3:  # posts are inside their requests, holding threads
                assert time.monotonic() < deadline, "the posts never reached their enqueue"
                time.sleep(0.02)
            time.sleep(0.3)  # and the rest are queued behind them
            assert not any(p.done() for p in posts)
            started = time.monotonic()
            with client.stream("GET", str(first["events_url"]), headers={"Accept": "text/event-stream"},
                               timeout=5) as resp:
                assert resp.status_code == 200
                line = next(resp.iter_lines())
            opened_in = time.monotonic() - started
            assert line.startswith("retry:")
            assert not any(p.done() for p in posts)  # the posts were still held when it opened
            held.set()
            assert all(p.result().status_code == 202 for p in posts)
    assert opened_in < 5


def test_a_lane_serves_waiting_tenants_round_robin_not_first_come() -> None:
    """One place, held; tenant a queues five calls, then c and b one each: a freed place goes
    to the next tenant in the ring, so b and c each wait for one call of a, not for all five."""
    import asyncio

    from api.deps import FairLane

    async def go() -> list[str]:
        lane = FairLane(1)
        gate = threading.Event()
        order: list[str] = []
        holder = asyncio.ensure_future(lane.run("a", gate.wait, 10))
        await asyncio.sleep(0.05)  # the holder has the place
        calls = [asyncio.ensure_future(lane.run("a", order.append, f"a{i}")) for i in range(5)]
        calls += [asyncio.ensure_future(lane.run(t, order.append, f"{t}0")) for t in ("c", "b")]
        await asyncio.sleep(0.05)
        assert lane.waiting == 7 and not order
        gate.set()
        await asyncio.gather(holder, *calls)
        return order

    assert asyncio.run(go()) == ["a0", "c0", "b0", "a1", "a2", "a3", "a4"]


def test_a_caller_that_goes_away_while_waiting_does_not_lose_the_lane_a_place() -> None:
    import asyncio

    from api.deps import FairLane

    async def go() -> tuple[list[str], int]:
        lane = FairLane(1)
        gate = threading.Event()
        order: list[str] = []
        holder = asyncio.ensure_future(lane.run("a", gate.wait, 10))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(lane.run("b", order.append, "gone"))
        stays = asyncio.ensure_future(lane.run("c", order.append, "stays"))
        await asyncio.sleep(0.05)
        gone.cancel()  # the client hung up while its post waited
        gate.set()
        await asyncio.gather(holder, stays)
        # the lane is whole again: one call goes straight through
        await asyncio.wait_for(lane.run("d", order.append, "after"), 5)
        return order, lane._busy

    order, busy = asyncio.run(go())
    assert order == ["stays", "after"] and busy == 0
