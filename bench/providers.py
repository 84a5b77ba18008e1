"""Provider streaming benchmark: each adapter against the fake LLM server in another process.

    .venv/bin/python bench/providers.py [--chunks 300,10] [--streams 400] [--concurrency 1,200]
                                        [--transports httpx,aiohttp] [--delay-ms 0]

For every answer length, vendor adapter (Anthropic SSE, OpenAI SSE, Ollama NDJSON), HTTP
transport (httpx's own pool, or aiohttp underneath httpx: ``llm.http_transport``) and
concurrency, it streams answers through ``Provider.stream`` (the code a step runs), with
``concurrency`` streams open at once on one event loop, and prints:

- chunks/s: text chunks delivered to the caller per second of wall time;
- CPU/chunk: this process's CPU time (user + system, all threads) per chunk. The server runs
  in its own process, so its CPU is not counted.

Long answers (300 chunks) measure the per-chunk cost; short ones (10 chunks) add the
per-request cost, where httpx's connection pool slows down with many concurrent requests
(encode/httpx#3215). ``--delay-ms`` paces the server (a model emits ~50-100 tokens/s, i.e.
10-20 ms per chunk); at 0 the server writes as fast as it can and several events share one
TCP read. The machine has two cores and the server process can saturate one, so chunks/s at
high concurrency is partly the server's ceiling; CPU/chunk is the client's own cost either
way. Bounded: a fixed number of streams per row; the default run takes about two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
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
from kortex.messages import UserMessage  # noqa: E402

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
    config = {"anthropic": {"api_key": "bench", "base_url": url},
              "openai": {"api_key": "bench", "base_url": url + "/v1"},
              "ollama": {"endpoint": url, "model": "llama3.2"}}[vendor]
    settings = Settings(llm={"http_transport": transport})
    return FACTORIES[vendor](vendor, ProviderSettings(**config, max_retries=0, max_connections=1000), settings)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_one(vendor: str, url: str, transport: str, streams: int, concurrency: int) -> dict[str, float]:
    p = provider(vendor, url, transport)
    request = CompletionRequest(model=MODELS[vendor], system="bench",
                                messages=(UserMessage(content="stream, please"),))
    chunks = 0
    failures = 0
    queue = iter(range(streams))

    async def worker() -> None:
        nonlocal chunks, failures
        for _ in queue:
            try:
                async for chunk in p.stream(request):
                    if isinstance(chunk, TextChunk):
                        chunks += 1
            except Exception:  # counted, not hidden: a benchmark with failures is not a result
                failures += 1
    # warm up: the first connections and imports are not what we measure
    async for _ in p.stream(request):
        pass
    chunks = 0
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    await p.aclose()
    return {"chunks": chunks, "wall": wall, "cpu": cpu, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="300,10", help="text chunks per answer (comma-separated runs)")
    parser.add_argument("--streams", type=int, default=400, help="answers per row of 300-chunk answers "
                        "(shorter answers get more, so a row still streams a fair number of chunks)")
    parser.add_argument("--concurrency", default="1,200")
    parser.add_argument("--transports", default="httpx,aiohttp")
    parser.add_argument("--vendors", default="anthropic,openai,ollama")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="server pause before each chunk")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()

    words = ["The ", "pool ", "ran ", "dry ", "after ", "deploy ", "v2.14.0 ", "at ", "14:31. "]
    results: list[dict[str, Any]] = []
    for length in (int(c) for c in args.chunks.split(",")):
        script = {"loop": True, "steps": [{"text": [words[i % len(words)] for i in range(length)],
                                           "delay_ms": args.delay_ms,
                                           "usage": {"input_tokens": 100, "output_tokens": length}}]}
        per_row = max(args.streams, args.streams * 300 // length // 6)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "bench.json").write_text(json.dumps(script))
            server, url = start_server(Path(tmp))
            try:
                print(f"\nfake server pid {server.pid}: {length} chunks per answer, "
                      f"server delay {args.delay_ms:g} ms/chunk")
                print(f"{'adapter':<10} {'transport':<8} {'open':>5} {'answers':>7} {'chunks/s':>10} "
                      f"{'CPU µs/chunk':>13} {'wall s':>7} {'failed':>6}")
                for vendor in args.vendors.split(","):
                    for concurrency in (int(c) for c in args.concurrency.split(",")):
                        for transport in args.transports.split(","):
                            streams = per_row if concurrency > 1 else max(20, per_row // 10)
                            r = asyncio.run(run_one(vendor, url, transport, streams, concurrency))
                            row = {"vendor": vendor, "transport": transport, "chunks_per_answer": length,
                                   "concurrency": concurrency, "answers": streams,
                                   "chunks_per_s": r["chunks"] / r["wall"],
                                   "cpu_us_per_chunk": 1e6 * r["cpu"] / max(1, r["chunks"]),
                                   "wall_s": r["wall"], "failures": r["failures"]}
                            results.append(row)
                            print(f"{vendor:<10} {transport:<8} {concurrency:>5} {streams:>7} "
                                  f"{row['chunks_per_s']:>10,.0f} {row['cpu_us_per_chunk']:>13.1f} "
                                  f"{row['wall_s']:>7.2f} {row['failures']:>6}", flush=True)
            finally:
                server.terminate()
                server.wait(10)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
