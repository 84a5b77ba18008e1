"""SSE fan-out benchmark: the stream hub beside a raw ASGI floor, on the same uvicorn, in one run.

    .venv/bin/python bench/sse.py [--streams 2000] [--rate 5] [--seconds 10]

Hub side: one uvicorn process serves ``/hub/<n>``: a raw ASGI endpoint that subscribes to the
Redis Stream ``<prefix>:turn:<n>:events`` through Kortex's ``StreamHub`` and writes what it
gets formatted by ``api.sse.format_entries`` (the loop of ``api.sse.turn_events``, without the
database lookups that precede it). A writer process XADDs to every stream ``--rate`` times a
second (fields ``t``, ``d``, ``a``, ``s``; the body carries its write time).

Floor: the same uvicorn process serves ``/floor/<n>``: raw ASGI that makes the same events at
the same rate in-process (no Redis) and writes the same bytes, one chunk per event.

Clients (two processes, raw sockets) open ``--streams`` connections to one side at once, and
count events. Figures per side: time until every stream delivered its first event ("live"),
events/s delivered over ``--seconds`` after that, lag (write time to receipt) p50/p99, and the
server's CPU. Needs Redis (KORTEX_TEST_REDIS_URL); leaves no keys or processes behind.

``run(args) -> dict`` is what ``./dev bench`` calls; ``args`` needs ``streams``, ``rate``,
``seconds`` (an ``argparse.Namespace`` or anything with those attributes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CLIENTS = 2
TICK = 0.05  # writer and floor make their events in ticks of this length
PAD = "x" * 60  # a body about the size of a text delta event


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _body(n: int, seq: int) -> str:
    return json.dumps({"type": "text", "step": 0, "delta": PAD, "n": n, "seq": seq, "ts": time.time()})


# --- the server: hub and floor behind one raw ASGI app --------------------------------------

def make_app(prefix: str, rate: float) -> Any:
    from redis.asyncio import Redis as AsyncRedis

    from api.sse import format_entries, format_entry
    from kortex.stream.entries import Entry

    hub_module = importlib.import_module(os.environ.get("BENCH_HUB_MODULE", "kortex.stream.hub"))
    state: dict[str, Any] = {}
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    def hub() -> Any:
        if "hub" not in state:
            state["hub"] = hub_module.StreamHub(
                lambda: AsyncRedis.from_url(REDIS_URL, decode_responses=True, single_connection_client=True,
                                            socket_timeout=None, client_name=f"{prefix}:hub"))
        return state["hub"]

    async def serve_hub(n: int, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        async with hub().subscribe(f"{prefix}:turn:{n}:events") as sub:
            many = getattr(sub, "get_many", None)
            while True:
                if many is not None:
                    entries = await many(timeout=15)
                else:  # a hub without get_many (the one before it, for comparison)
                    entry = await sub.get(timeout=15)
                    entries = [entry] if entry is not None else []
                chunk = format_entries(entries)[0] if entries else ": keepalive\n\n"
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})

    async def serve_floor(n: int, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
        seq = 0
        interval = 1 / rate
        next_at = time.monotonic()
        while True:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            seq += 1
            entry = Entry(id=f"{int(time.time() * 1000)}-{seq}", type="text", data=_body(n, seq))
            await send({"type": "http.response.body", "body": format_entry(entry).encode(), "more_body": True})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if "hub" in state:
                        await state["hub"].stop()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"].strip("/").split("/")
        if path == ["ping"]:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        serve = serve_hub if path[0] == "hub" else serve_floor
        task = asyncio.ensure_future(serve(int(path[1]), send))
        # The client leaving ends the response; either way the other side is cleaned up.
        waiter = asyncio.ensure_future(_disconnected(receive))
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        for t in (task, waiter):
            t.cancel()
        with contextlib.suppress(BaseException):
            await task

    return app


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def serve(port: int, prefix: str, rate: float) -> None:
    import uvicorn

    from kortex import heap

    _raise_fd_limit()
    app = make_app(prefix, rate)
    heap.settle()  # as the API does once started (kortex/heap.py); hub and floor share the process
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096, lifespan="on")


# --- the writer ------------------------------------------------------------------------------

# One tick's entries are written by Redis itself: a Python writer making 10,000 XADDs a second
# would take most of a core on this machine, starving the process being measured.
_WRITE = """
local body = '{"type": "text", "step": 0, "delta": "' .. ARGV[3] .. '", "seq": ' .. ARGV[2] .. ', "ts": ' .. ARGV[1] .. '}'
for i = 1, #KEYS do
    redis.call('XADD', KEYS[i], 'MAXLEN', '~', 1000, '*', 't', 'text', 'd', body, 'a', '1', 's', ARGV[2])
end
return #KEYS
"""


def write(prefix: str, streams: int, rate: float, seconds: float) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    script = client.register_script(_WRITE)
    keys = [f"{prefix}:turn:{n}:events" for n in range(streams)]
    # Each stream is written ``rate`` times a second; streams are spread over the ticks of a
    # period so the writes are even, not a burst of every stream at once.
    period = max(1, round(1 / (rate * TICK))) if rate * TICK < 1 else 1
    per_tick = max(1, round(rate * TICK)) if rate * TICK >= 1 else 1
    slices = [keys[i::period] for i in range(period)]
    started = time.monotonic()
    next_tick = started
    tick = 0
    while time.monotonic() - started < seconds:
        for _ in range(per_tick):
            script(keys=slices[tick % period], args=[f"{time.time():.6f}", tick, PAD])
        tick += 1
        next_tick += TICK
        time.sleep(max(0.0, next_tick - time.monotonic()))


# --- the clients -----------------------------------------------------------------------------

async def _client(port: int, side: str, ids: list[int], warmup: float, seconds: float) -> dict[str, Any]:
    _raise_fd_limit()
    started = time.monotonic()
    first: dict[int, float] = {}
    lags: list[float] = []
    counted = 0
    window: dict[str, float] = {}
    all_live = asyncio.Event()

    async def one(n: int) -> None:
        nonlocal counted
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(f"GET /{side}/{n} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode())
        buf = b""
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                buf += data
                *events, buf = buf.split(b"\n\n")
                now = time.time()
                for event in events:
                    at = event.rfind(b'"ts": ')
                    if at < 0:
                        continue
                    if n not in first:
                        first[n] = time.monotonic() - started
                        if len(first) == len(ids):
                            all_live.set()
                    if window and window["from"] <= now < window["to"]:
                        counted += 1
                        lags.append(now - float(event[at + 6:event.index(b"}", at)]))
        finally:
            writer.close()

    tasks = [asyncio.create_task(one(n)) for n in ids]
    try:
        await asyncio.wait_for(all_live.wait(), timeout=max(60.0, len(ids) / 20))
        live = time.monotonic() - started
    except TimeoutError:
        live = float("nan")
    begin = time.time() + warmup
    window.update({"from": begin, "to": begin + seconds})
    await asyncio.sleep(max(0.0, window["to"] - time.time()) + 0.05)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"live_s": live, "live_streams": len(first), "events": counted, "lags": lags,
            "window": [window["from"], window["to"]]}


def client_main(port: int, side: str, ids: list[int], warmup: float, seconds: float) -> None:
    result = asyncio.run(_client(port, side, ids, warmup, seconds))
    sys.stdout.write(json.dumps(result))


# --- joins without HTTP ----------------------------------------------------------------------

async def _joins(prefix: str, streams: int, rate: float) -> float:
    """Seconds until ``streams`` subscriptions made at once, in this process, each got an entry
    (with the writer running): the hub's own share of going live, without uvicorn's."""
    from redis.asyncio import Redis as AsyncRedis

    hub_module = importlib.import_module(os.environ.get("BENCH_HUB_MODULE", "kortex.stream.hub"))
    hub = hub_module.StreamHub(lambda: AsyncRedis.from_url(REDIS_URL, decode_responses=True,
                                                           single_connection_client=True, socket_timeout=None))
    await hub.start()
    writer = _spawn("_write", f"{prefix}-join", str(streams), str(rate), "120")
    live: list[float] = []
    try:
        await asyncio.sleep(0.5)  # every stream has an entry or two
        started = time.monotonic()

        async def reader(n: int) -> None:
            async with hub.subscribe(f"{prefix}-join:turn:{n}:events") as sub:
                if await sub.get(timeout=120) is not None:
                    live.append(time.monotonic() - started)
                await asyncio.sleep(3600)

        tasks = [asyncio.create_task(reader(n)) for n in range(streams)]
        while len(live) < streams and time.monotonic() - started < 120:
            await asyncio.sleep(0.01)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        _stop(writer)
        await hub.stop()
    return max(live) if len(live) == streams else float("nan")


# --- the run ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _spawn(*argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, __file__, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _side(side: str, port: int, server: subprocess.Popen[bytes], args: Any, prefix: str) -> dict[str, Any]:
    warmup = 2.0
    writer = None
    if side == "hub":
        # Long enough for every stream to go live, then the warm-up and the measured window.
        budget = max(60.0, args.streams / 20) + warmup + args.seconds + 5
        writer = _spawn("_write", prefix, str(args.streams), str(args.rate), str(budget))
    clients = [_spawn("_client", str(port), side, ",".join(str(n) for n in range(c, args.streams, CLIENTS)),
                      str(warmup), str(args.seconds)) for c in range(CLIENTS)]
    samples: list[tuple[float, float]] = []
    sampling = threading.Event()

    def sample() -> None:  # the server's CPU, so the measured window's share can be cut out after
        while not sampling.wait(0.2):
            with contextlib.suppress(OSError):
                samples.append((time.time(), _cpu_seconds(server.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        outputs = [json.loads(c.communicate(timeout=300)[0] or b"{}") for c in clients]
    finally:
        sampling.set()
        sampler.join()
        for c in clients:
            _stop(c)
        if writer is not None:
            _stop(writer)
    begin = min(o["window"][0] for o in outputs)
    end = max(o["window"][1] for o in outputs)
    inside = [(t, c) for t, c in samples if begin <= t <= end]
    cpu_pct = (100 * (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
               if len(inside) >= 2 and inside[-1][0] > inside[0][0] else float("nan"))
    for n, o in enumerate(outputs):
        print(f"  {side} client {n}: live {o['live_s']:.2f} s ({o['live_streams']} streams), {o['events']} events, "
              f"window {o['window'][0] - begin:.2f}..{o['window'][1] - begin:.2f} s", file=sys.stderr)
    lags = [lag for o in outputs for lag in o.get("lags", [])]
    events = sum(o.get("events", 0) for o in outputs)
    return {
        "live_s": max(o.get("live_s", float("nan")) for o in outputs),
        "live_streams": sum(o.get("live_streams", 0) for o in outputs),
        "events_per_s": events / args.seconds,
        "lag_p50_ms": _pct(lags, 0.5) * 1000,
        "lag_p99_ms": _pct(lags, 0.99) * 1000,
        "server_cpu_pct": cpu_pct,
    }


def run(args: Any) -> dict[str, Any]:
    """Both sides, floor first; a dict of figures (also what ``main`` prints). ``args`` may lack
    any of ``streams``, ``rate``, ``seconds``, ``sides`` (an umbrella's namespace): defaults apply."""
    import redis

    args = argparse.Namespace(streams=int(getattr(args, "streams", None) or 2000),
                              rate=float(getattr(args, "rate", None) or 5.0),
                              seconds=float(getattr(args, "seconds", None) or 10.0),
                              sides=getattr(args, "sides", None) or "floor,hub")

    _raise_fd_limit()
    prefix = f"kxbench-sse-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    server = _spawn("_serve", str(port), prefix, str(args.rate))
    client = redis.Redis.from_url(REDIS_URL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the benchmark server did not start")
            time.sleep(0.1)
        sides = args.sides.split(",")
        empty = {"live_s": float("nan"), "live_streams": 0, "events_per_s": float("nan"),
                 "lag_p50_ms": float("nan"), "lag_p99_ms": float("nan"), "server_cpu_pct": float("nan")}
        floor = _side("floor", port, server, args, prefix) if "floor" in sides else empty
        hub = _side("hub", port, server, args, prefix) if "hub" in sides else empty
        hub["joins_in_process_s"] = asyncio.run(_joins(prefix, args.streams, args.rate)) if "hub" in sides \
            else float("nan")
    finally:
        _stop(server)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))  # the sides' and the joins' streams
        if keys:
            client.delete(*keys)
        client.close()
    ratio = hub["events_per_s"] / floor["events_per_s"] if floor["events_per_s"] else float("nan")
    return {"streams": args.streams, "rate": args.rate, "seconds": args.seconds,
            "offered_per_s": args.streams * args.rate, "floor": floor, "hub": hub, "hub_vs_floor": ratio}


def report(result: dict[str, Any]) -> None:
    print(f"SSE fan-out: {result['streams']} streams x {result['rate']} events/s "
          f"(offered {result['offered_per_s']:.0f} events/s), {result['seconds']} s measured")
    print(f"{'':8}{'live (s)':>10}{'events/s':>11}{'lag p50 ms':>12}{'lag p99 ms':>12}{'server CPU':>12}")
    for name in ("floor", "hub"):
        r = result[name]
        print(f"{name:8}{r['live_s']:>10.2f}{r['events_per_s']:>11.0f}{r['lag_p50_ms']:>12.1f}"
              f"{r['lag_p99_ms']:>12.1f}{r['server_cpu_pct']:>11.0f}%")
    print(f"hub delivers {100 * result['hub_vs_floor']:.0f}% of the floor's events/s; "
          f"{result['hub']['live_streams']}/{result['streams']} hub streams live in {result['hub']['live_s']:.2f} s "
          f"over HTTP, {result['hub']['joins_in_process_s']:.2f} s subscribed in-process (no uvicorn)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        role, rest = sys.argv[1], sys.argv[2:]
        if role == "_serve":
            serve(int(rest[0]), rest[1], float(rest[2]))
        elif role == "_write":
            write(rest[0], int(rest[1]), float(rest[2]), float(rest[3]))
        elif role == "_client":
            client_main(int(rest[0]), rest[1], [int(n) for n in rest[2].split(",") if n], float(rest[3]),
                        float(rest[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=2000, help="open event streams")
    parser.add_argument("--rate", type=float, default=5.0, help="events per second per stream")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window, after all streams are live")
    parser.add_argument("--sides", default="floor,hub", help="which sides to run (profiling one)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)


if __name__ == "__main__":
    main()
