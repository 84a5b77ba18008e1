"""The asyncio floor: the least any engine must do for N paced turns, in one event loop.

    python -m bench.floor --fake URL --prefix P --n N [--model bench-paced]

Per turn: stream the model's answer from the fake server with aiohttp (Anthropic's wire
format, parsed by hand), XADD every text delta to the turn's Redis Stream with redis.asyncio,
publish the tool call and a canned result, send the second request, publish ``done``. No
database, no queue, no tool pipeline: the cost of the work itself.

The process prints ``ready`` once warm, starts all N turns when a line ``go`` arrives on
stdin and stays alive (so its CPU can be read from /proc) until stdin closes. The client
side, reading each turn's stream from Redis as Kortex's client reads SSE, runs in the
benchmark's own process (``measure``), so the floor's CPU is the producer's alone, as
Kortex's is its processes' alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import redis.asyncio as aredis

from bench.client import Batch, TurnTiming
from bench.scripts import QUESTION, TOOL_CALL

MAXLEN = 20_000
TOOL = {"name": TOOL_CALL["name"], "description": "Deploys of a product in a time range",
        "input_schema": {"type": "object", "properties": {"product": {"type": "string"},
                                                          "time_range": {"type": "string"}}}}
# What a small tool result weighs on the wire (Kortex's get_recent_deploys over the seeded scenario).
TOOL_RESULT = json.dumps({"deploys": [{"product": "checkout", "version": f"v2.{i}.0", "at": "2026-04-07T14:30:00Z",
                                       "author": "ci", "notes": "routine"} for i in range(5)], "truncated": False})


def stream_key(prefix: str, i: int) -> str:
    return f"{prefix}:floor:{i}"


@dataclass
class Call:
    id: str
    name: str
    args: str = ""


async def _publish(r: aredis.Redis, key: str, kind: str, body: dict[str, Any]) -> None:
    await r.xadd(key, {"t": kind, "d": json.dumps({"type": kind, **body})}, maxlen=MAXLEN, approximate=True)


async def _step(http: aiohttp.ClientSession, r: aredis.Redis, url: str, model: str, key: str, step: int,
                messages: list[dict[str, Any]]) -> tuple[str, list[Call]]:
    body = {"model": model, "max_tokens": 1024, "stream": True, "messages": messages, "tools": [TOOL]}
    headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01"}
    text: list[str] = []
    calls: list[Call] = []
    async with http.post(f"{url}/v1/messages", json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            if not raw.startswith(b"data: "):
                continue
            event = json.loads(raw[6:])
            kind = event.get("type")
            if kind == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    text.append(delta["text"])
                    await _publish(r, key, "text", {"step": step, "delta": delta["text"]})
                elif delta["type"] == "input_json_delta":
                    calls[-1].args += delta["partial_json"]
            elif kind == "content_block_start" and event["content_block"]["type"] == "tool_use":
                block = event["content_block"]
                calls.append(Call(block["id"], block["name"]))
    return "".join(text), calls


async def turn(http: aiohttp.ClientSession, r: aredis.Redis, url: str, model: str, key: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for step in range(8):
        await _publish(r, key, "turn", {"status": "running", "step": step})
        text, calls = await _step(http, r, url, model, key, step, messages)
        if not calls:
            break
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text.strip() else []
        results = []
        for call in calls:
            args = json.loads(call.args or "{}")
            content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": args})
            await _publish(r, key, "tool_call", {"id": call.id, "name": call.name, "arguments": args})
            await _publish(r, key, "tool_result", {"id": call.id, "result": TOOL_RESULT})
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": TOOL_RESULT})
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": results}]
    async with r.pipeline(transaction=False) as pipe:
        pipe.xadd(key, {"t": "done", "d": json.dumps({"type": "done", "status": "done"})}, maxlen=MAXLEN,
                  approximate=True)
        pipe.expire(key, 3600)
        await pipe.execute()


async def serve(url: str, redis_url: str, prefix: str, n: int, model: str, warmup_model: str) -> None:
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=120))
    r = aredis.Redis.from_url(redis_url, max_connections=max(64, n + 16))
    try:
        for i in range(3):  # warm: imports, the first connections, the parser
            await turn(http, r, url, warmup_model, f"{prefix}:floorwarm:{i}")
        print("ready", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            return
        outcomes = await asyncio.gather(*(turn(http, r, url, model, stream_key(prefix, i)) for i in range(n)),
                                        return_exceptions=True)
        failures = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        print(json.dumps({"finished": n - len(failures), "failures": failures[:5]}), flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the benchmark has read our CPU
    finally:
        await http.close()
        await r.aclose()


# ---- the client side, in the benchmark's process ------------------------------------------------


async def read_turn(r: aredis.Redis, key: str, t0: list[float], timing: TurnTiming, deadline: float) -> None:
    """Follow one turn's stream from the start, as an SSE client would, until ``done``."""
    last = "0-0"
    while time.perf_counter() < deadline:
        reply = await r.xread({key: last}, count=500, block=1000)
        now = time.perf_counter()
        for _key, entries in reply or []:
            for eid, fields in entries:
                last = eid
                kind = fields[b"t"].decode()
                timing.events += 1
                at = now - t0[0]
                timing.first_event = at if timing.first_event is None else timing.first_event
                if kind == "text" and timing.first_text is None:
                    timing.first_text = at
                if kind == "done":
                    timing.done, timing.status = at, "done"
                    return
    timing.error = "not done in time"


async def measure(proc_stdin: Any, redis_url: str, prefix: str, n: int, timeout: float) -> Batch:
    """Start the floor's N turns (it must be ``ready``) and read them; the clock starts before ``go``."""
    r = aredis.Redis.from_url(redis_url, max_connections=n + 16)
    timings = [TurnTiming() for _ in range(n)]
    t0 = [0.0]
    deadline = time.perf_counter() + timeout + 5
    try:
        readers = [asyncio.ensure_future(read_turn(r, stream_key(prefix, i), t0, timings[i], deadline))
                   for i in range(n)]
        await asyncio.sleep(0.5)  # let every reader block on its (still empty) stream
        t0[0] = time.perf_counter()
        proc_stdin.write(b"go\n")
        proc_stdin.flush()
        done, pending = await asyncio.wait(readers, timeout=timeout)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await r.aclose()
    batch = Batch(timings=timings, timed_out=bool(pending))
    if all(t.ok for t in timings):
        batch.wall = max(t.done for t in timings if t.done is not None)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fake", required=True, help="the fake LLM server's URL")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--model", default="bench-paced")
    parser.add_argument("--warmup-model", default="bench-zero")
    args = parser.parse_args()
    asyncio.run(serve(args.fake, args.redis, args.prefix, args.n, args.model, args.warmup_model))


if __name__ == "__main__":
    main()
