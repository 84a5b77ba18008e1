"""Provider streaming benchmark: each adapter against the fake LLM server in another process.

    .venv/bin/python bench/providers.py [--chunks 300,10] [--streams 400] [--concurrency 1,200]
                                        [--transports httpx,aiohttp,floor] [--delay-ms 0]
                                        [--pieces-per-s 0] [--history-kb 0] [--repeat 1]

    # a model's pace, as the turns worker sees it (one TCP read per text piece):
    .venv/bin/python bench/providers.py --chunks 50 --pieces-per-s 50 --concurrency 100 \
                                        --streams 300 --transports aiohttp,floor --repeat 5

For every answer length, vendor adapter (Anthropic SSE, OpenAI SSE, Ollama NDJSON), HTTP
transport (``llm.http_transport``: httpx's own pool, or aiohttp) and concurrency, it streams
answers through ``Provider.stream`` (the code a step runs), with ``concurrency`` streams open
at once on one event loop, and prints:

- answers/s and chunks/s: answers completed and text chunks delivered to the caller per
  second of wall time;
- CPU ms/answer and CPU µs/chunk: this process's CPU time (``time.process_time``: user +
  system, all threads) per answer and per text chunk. The server runs in its own process, so
  its CPU is not counted.

The ``floor`` rows do the same requests with the least a client can do: one bare aiohttp
session, the body encoded with ``json.dumps``, the response read with ``iter_any``, lines cut
with ``bytes.split`` and every ``data:`` (NDJSON: every) line decoded with ``json.loads``: no
retries, no error translation, no typed chunks. What a provider spends above it is the price
of the adapter layers.

``--pieces-per-s`` paces the server like a real model (each text piece sent on its own
schedule, so every piece is a TCP read of its own, as in production); at 0 (and no
``--delay-ms``) the server writes as fast as it can and several events share one read, which
hides the per-read cost.

Long answers (300 chunks) measure the per-chunk cost; short ones (10 chunks) add the
per-request cost, where httpx's connection pool slows down with many concurrent requests
(encode/httpx#3215). ``--delay-ms`` paces the server (a model emits ~50-100 tokens/s, i.e.
10-20 ms per chunk); at 0 the server writes as fast as it can and several events share one
TCP read. The machine has two cores and the server process can saturate one, so chunks/s at
high concurrency is partly the server's ceiling; CPU/chunk is the client's own cost either
way. Bounded: a fixed number of streams per row; the default run takes about two minutes
(``--repeat`` times that: every row runs that many times and the median by CPU is shown).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kortex.config import ProviderSettings, Settings  # noqa: E402
from kortex.llm import anthropic, ollama, openai  # noqa: E402
from kortex.llm.base import CompletionRequest, Provider, TextChunk  # noqa: E402
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage  # noqa: E402

MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "ollama": "llama3.2"}
FACTORIES = {"anthropic": anthropic.create, "openai": openai.create, "ollama": ollama.create}


def start_server(scripts: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "kortex.testing.fakellm", "--scripts", str(scripts),
                             "--default", "bench"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"fake server did not start: {line!r}")
    return proc, line.removeprefix("listening on ")


def provider(vendor: str, url: str, transport: str) -> Provider:
    config: dict[str, Any] = {"anthropic": {"api_key": "bench", "base_url": url},
                              "openai": {"api_key": "bench", "base_url": url + "/v1"},
                              "ollama": {"endpoint": url, "model": "llama3.2"}}[vendor]
    settings = Settings.model_validate({"llm": {"http_transport": transport}})
    return FACTORIES[vendor](vendor, ProviderSettings.model_validate(
        {**config, "max_retries": 0, "max_connections": 1000}), settings)


#: KB of tool result the requests carry (--history-kb): a step after a tool call sends it all again
HISTORY_KB = 0


def bench_request(vendor: str) -> CompletionRequest:
    messages: tuple[Any, ...] = (UserMessage(content="stream, please"),)
    if HISTORY_KB:
        # log lines as a tool returns them, ~200 bytes each once encoded
        lines = [{"ts": f"2026-04-07T14:{i // 60 % 60:02d}:{i % 60:02d}Z", "level": "error", "service": "checkout",
                  "msg": f"pool exhausted: waited 5000 ms for a connection (request {i:06d}, naïve retry)"}
                 for i in range(HISTORY_KB * 1024 // 200)]
        call = ToolCall(id="call_bench_1", name="get_logs", arguments={"product": "checkout", "time_range": "1h"})
        messages += (AssistantMessage(content="Checking the logs.", tool_calls=(call,)),
                     ToolMessage(result=ToolResult(call_id=call.id, name="get_logs", content={"lines": lines})))
    return CompletionRequest(model=MODELS[vendor], system="bench", messages=messages)


class Floor:
    """The floor: the same request and the same body read by bare aiohttp, text events
    counted (``data:`` lines of SSE whose JSON holds text; every NDJSON line with content)."""

    def __init__(self, vendor: str, url: str) -> None:
        import aiohttp

        p: Any = provider(vendor, url, "httpx")  # only to build the same body and path
        request = bench_request(vendor)
        if vendor == "ollama":
            self.url, self.body = url + "/api/chat", p.body(request, MODELS[vendor], pseudo=False)
            self.headers = {"accept": "application/x-ndjson", "content-type": "application/json"}
        elif vendor == "anthropic":
            self.url, self.body = url + "/v1/messages", p.body(request)
            self.headers = {"x-api-key": "bench", "anthropic-version": "2023-06-01",
                            "accept": "text/event-stream", "content-type": "application/json"}
        else:
            self.url, self.body = url + "/v1/chat/completions", p.body(request)
            self.headers = {"authorization": "Bearer bench", "accept": "text/event-stream",
                            "content-type": "application/json"}
        self.sse = vendor != "ollama"
        self.vendor = vendor
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000))

    async def stream(self) -> int:
        texts = 0
        rest = b""
        async with self.session.post(self.url, data=json.dumps(self.body).encode(), headers=self.headers) as resp:
            async for data in resp.content.iter_any():
                lines = (rest + data).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if self.sse:
                        if not line.startswith(b"data:"):
                            continue
                        line = line[5:]
                        if line.strip() == b"[DONE]":
                            continue
                    elif not line:
                        continue
                    frame = json.loads(line)
                    if self.vendor == "anthropic":
                        texts += frame.get("type") == "content_block_delta"
                    elif self.vendor == "openai":
                        texts += any((c.get("delta") or {}).get("content") for c in frame.get("choices") or ())
                    else:
                        texts += bool((frame.get("message") or {}).get("content"))
        return texts

    async def aclose(self) -> None:
        await self.session.close()


async def run_one(vendor: str, url: str, transport: str, streams: int, concurrency: int) -> dict[str, float]:
    request = bench_request(vendor)
    floor = Floor(vendor, url) if transport == "floor" else None
    p = provider(vendor, url, transport) if floor is None else None

    async def one() -> int:
        if floor is not None:
            return await floor.stream()
        assert p is not None
        count = 0
        async for chunk in p.stream(request):
            if isinstance(chunk, TextChunk):
                count += 1
        return count

    chunks = failures = answers = 0
    queue = iter(range(streams))

    async def worker() -> None:
        nonlocal chunks, failures, answers
        for _ in queue:
            try:
                got = await one()  # not `chunks += await ...`: that reads chunks before the await
                chunks += got
                answers += 1
            except Exception:  # counted, not hidden: a benchmark with failures is not a result
                failures += 1
    # warm up: the first connections and imports are not what we measure
    await one()
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await (floor or p).aclose()  # type: ignore[union-attr]
    return {"chunks": chunks, "answers": answers, "wall": wall, "cpu": cpu, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="300,10", help="text chunks per answer (comma-separated runs)")
    parser.add_argument("--streams", type=int, default=400, help="answers per row of 300-chunk answers "
                        "(shorter answers get more, so a row still streams a fair number of chunks)")
    parser.add_argument("--concurrency", default="1,200")
    parser.add_argument("--transports", default="httpx,aiohttp,floor",
                        help="llm.http_transport values, and floor (bare aiohttp, see above)")
    parser.add_argument("--vendors", default="anthropic,openai,ollama")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="server pause before each chunk")
    parser.add_argument("--pieces-per-s", type=float, default=0.0,
                        help="pace the server like a model: text pieces per second of each stream (0: unpaced)")
    parser.add_argument("--history-kb", type=int, default=0,
                        help="a tool result of about this many KB in every request (the body grows with a turn)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every row this many times and keep the median CPU (shared machines are noisy)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    global HISTORY_KB
    HISTORY_KB = args.history_kb

    words = ["The ", "pool ", "ran ", "dry ", "after ", "deploy ", "v2.14.0 ", "at ", "14:31. "]
    results: list[dict[str, Any]] = []
    for length in (int(c) for c in args.chunks.split(",")):
        step: dict[str, Any] = {"text": [words[i % len(words)] for i in range(length)], "delay_ms": args.delay_ms,
                                "usage": {"input_tokens": 100, "output_tokens": length}}
        if args.pieces_per_s:
            step |= {"tokens_per_s": args.pieces_per_s, "piece_tokens": 1}
        script = {"loop": True, "steps": [step]}
        per_row = max(args.streams, args.streams * 300 // length // 6)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "bench.json").write_text(json.dumps(script))
            server, url = start_server(Path(tmp))
            try:
                pace = f"{args.pieces_per_s:g} pieces/s" if args.pieces_per_s else "unpaced"
                print(f"\nfake server pid {server.pid}: {length} chunks per answer, {pace}, "
                      f"server delay {args.delay_ms:g} ms/chunk, history {args.history_kb} KB")
                print(f"{'adapter':<10} {'transport':<8} {'open':>5} {'answers':>7} {'answers/s':>9} "
                      f"{'chunks/s':>9} {'CPU ms/answer':>13} {'CPU µs/chunk':>12} {'wall s':>7} {'failed':>6}")
                for vendor in args.vendors.split(","):
                    for concurrency in (int(c) for c in args.concurrency.split(",")):
                        for transport in args.transports.split(","):
                            streams = per_row if concurrency > 1 else max(20, per_row // 10)
                            runs = [asyncio.run(run_one(vendor, url, transport, streams, concurrency))
                                    for _ in range(max(1, args.repeat))]
                            r = sorted(runs, key=lambda x: x["cpu"] / max(1, x["answers"]))[len(runs) // 2]
                            row = {"vendor": vendor, "transport": transport, "chunks_per_answer": length,
                                   "pieces_per_s": args.pieces_per_s, "history_kb": args.history_kb,
                                   "concurrency": concurrency,
                                   "answers": streams, "answers_per_s": r["answers"] / r["wall"],
                                   "chunks_per_s": r["chunks"] / r["wall"],
                                   "cpu_ms_per_answer": 1e3 * r["cpu"] / max(1, r["answers"]),
                                   "cpu_us_per_chunk": 1e6 * r["cpu"] / max(1, r["chunks"]),
                                   "wall_s": r["wall"], "failures": r["failures"]}
                            results.append(row)
                            print(f"{vendor:<10} {transport:<8} {concurrency:>5} {streams:>7} "
                                  f"{row['answers_per_s']:>9,.1f} {row['chunks_per_s']:>9,.0f} "
                                  f"{row['cpu_ms_per_answer']:>13.2f} {row['cpu_us_per_chunk']:>12.1f} "
                                  f"{row['wall_s']:>7.2f} {row['failures']:>6}", flush=True)
            finally:
                server.terminate()
                server.wait(10)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
