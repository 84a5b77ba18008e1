"""The benchmark's client of the Kortex API: create sessions, post a message, read the turn's
Server-Sent Events until ``done``, noting when each kind of event first arrived.

Every clock is started by the caller *before* its POST, so a turn's figures include the POST
itself (the part of Kortex's latency a client pays first).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class TurnTiming:
    """When things happened for one turn, in seconds after its clock started; None: never."""

    posted: float | None = None
    opened: float | None = None  # the event stream's response headers arrived
    first_event: float | None = None
    first_text: float | None = None
    done: float | None = None
    events: int = 0
    status: str | None = None  # the done event's status ("done", "failed")
    error: str | None = None  # why the client gave up, if it did

    @property
    def ok(self) -> bool:
        return self.done is not None and self.status == "done" and self.error is None


def connector() -> aiohttp.TCPConnector:
    # No per-host cap: a thousand concurrent SSE readers are a thousand connections.
    return aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)


def session(timeout: float = 3600) -> aiohttp.ClientSession:
    # A tool_result event is one SSE line of up to the 64 KiB output cap plus its JSON: more
    # than aiohttp's default line buffer.
    return aiohttp.ClientSession(connector=connector(), read_bufsize=1 << 20,
                                 timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=30))


class KortexClient:
    def __init__(self, http: aiohttp.ClientSession, url: str, key: str) -> None:
        self.http = http
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}

    async def create_session(self, model: str, name: str = "bench") -> str:
        async with self.http.post(f"{self.url}/v1/sessions", json={"name": name, "model": model},
                                  headers=self.headers) as resp:
            body = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"POST /v1/sessions: {resp.status} {body}")
            return str(body["id"])

    async def create_sessions(self, model: str, n: int, parallel: int = 16) -> list[str]:
        """Made before any clock starts: a session is the client's setup, not a turn's cost."""
        gate = asyncio.Semaphore(parallel)

        async def one() -> str:
            async with gate:
                return await self.create_session(model)

        return list(await asyncio.gather(*(one() for _ in range(n))))

    @staticmethod
    def message_path(session_id: str) -> str:
        return f"/v1/sessions/{session_id}/messages"

    async def turn(self, session_id: str, content: str, t0: float | None = None,
                   timing: TurnTiming | None = None) -> TurnTiming:
        """POST a message and follow its events to ``done``; times are from ``t0`` (default: now,
        just before the POST), written into ``timing`` as they happen (a cancelled turn keeps
        what it saw)."""
        return await self.turn_at(self.message_path(session_id), {"content": content}, t0, timing)

    async def turn_at(self, path: str, body: dict[str, Any], t0: float | None = None,
                      timing: TurnTiming | None = None) -> TurnTiming:
        """POST ``body`` to ``path`` (answered 202 with ``events_url``), then follow the events."""
        t0 = time.perf_counter() if t0 is None else t0
        timing = TurnTiming() if timing is None else timing
        try:
            async with self.http.post(self.url + path, json=body, headers=self.headers) as resp:
                answer = await resp.json()
                if resp.status != 202:
                    timing.error = f"POST {resp.status}: {str(answer)[:200]}"
                    return timing
            timing.posted = time.perf_counter() - t0
            await self.follow(str(answer["events_url"]), t0, timing)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            timing.error = f"{exc.__class__.__name__}: {exc}"[:200]
        return timing

    async def follow(self, events_url: str, t0: float, timing: TurnTiming) -> None:
        url = events_url if events_url.startswith("http") else self.url + events_url
        headers = {**self.headers, "Accept": "text/event-stream"}
        async with self.http.get(url, headers=headers) as resp:
            if resp.status != 200:
                timing.error = f"GET events {resp.status}"
                return
            timing.opened = time.perf_counter() - t0
            kind: str | None = None
            data: list[str] = []
            async for raw in resp.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif not line and kind is not None:
                    now = time.perf_counter() - t0
                    timing.events += 1
                    if timing.first_event is None:
                        timing.first_event = now
                    if kind == "text" and timing.first_text is None:
                        timing.first_text = now
                    if kind == "done":
                        timing.done = now
                        timing.status = _status("\n".join(data))
                        return
                    kind, data = None, []
            timing.error = "the stream ended before done"


def _status(data: str) -> str | None:
    try:
        body: Any = json.loads(data)
    except ValueError:
        return None
    return str(body.get("status")) if isinstance(body, dict) else None


@dataclass
class Batch:
    """N turns sent at once: their timings and the batch's wall time."""

    timings: list[TurnTiming] = field(default_factory=list)
    wall: float | None = None  # clock start -> last done, or None when not all finished
    timed_out: bool = False

    @property
    def finished(self) -> list[TurnTiming]:
        return [t for t in self.timings if t.ok]

    def errors(self) -> list[str]:
        seen: dict[str, int] = {}
        for t in self.timings:
            reason = t.error or (None if t.ok else f"done={t.done} status={t.status}")
            if reason:
                seen[reason] = seen.get(reason, 0) + 1
        return [f"{n}x {reason}" for reason, n in sorted(seen.items(), key=lambda kv: -kv[1])]


async def send_at_once(client: KortexClient, session_ids: list[str], content: str, timeout: float) -> Batch:
    """Every turn posted at the same instant (one clock for all); the batch is cut at ``timeout``
    and reports what finished by then."""
    return await posts_at_once(client, [(client.message_path(sid), {"content": content}) for sid in session_ids],
                               timeout)


async def posts_at_once(client: KortexClient | list[KortexClient], posts: list[tuple[str, dict[str, Any]]],
                        timeout: float, timings: list[TurnTiming] | None = None) -> Batch:
    """``client``: one for every post, or one per post (posts of several tenants at once)."""
    t0 = time.perf_counter()
    timings = [TurnTiming() for _ in posts] if timings is None else timings
    clients = client if isinstance(client, list) else [client] * len(posts)
    tasks = [asyncio.ensure_future(clients[i].turn_at(path, body, t0, timings[i]))
             for i, (path, body) in enumerate(posts)]
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10)
    for i, t in enumerate(timings):
        if t.done is None and t.error is None and tasks[i] in pending:
            t.error = f"not done within {timeout:.0f} s"
    batch = Batch(timings=timings, timed_out=bool(pending))
    if not pending and all(t.ok for t in timings):
        batch.wall = max(t.done for t in timings if t.done is not None)
    return batch
