"""Zero-latency model, one tool call: what Kortex itself costs a turn, beside a bare baseline.

Kortex: the fake LLM answers at once (12 text pieces, a tool call, 120 pieces), so a turn
is POST -> step task -> tool task -> step task -> done, through PostgreSQL and Redis.
Bare (``bench/bare_app.py``): a FastAPI endpoint enqueues one Celery task that XADDs as many
entries as Kortex's client received for a turn, streamed back by a bare SSE endpoint.

- latency: sequential turns, each clock started *before* the client's POST, stopped at the
  first SSE event (p50/p99; first text too, for Kortex);
- throughput: N turns posted at once, turns/s = N / (clock start -> last ``done``), and CPU
  per turn of each side's processes.
Goals (issue 9): first-event p50 <= 2x the bare one, throughput >= 50% of the bare one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
from typing import Any

import httpx

from bench.client import Batch, KortexClient, TurnTiming, posts_at_once, send_at_once, session
from bench.report import Report, Row
from bench.scripts import QUESTION
from bench.stack import PYTHON, REDIS_URL, ROOT, BenchEnv, CpuMeter, delete_keys, free_port, pct, progress, start

MODEL = "anthropic:bench-zero"
WARMUP = 5


def _figures(sequential: list[TurnTiming], batch: Batch, cpu: dict[str, float], procs: tuple[str, ...]
             ) -> dict[str, Any]:
    firsts = [t.first_event for t in sequential if t.first_event is not None]
    texts = [t.first_text for t in sequential if t.first_text is not None]
    posted = [t.posted for t in sequential if t.posted is not None]
    opened = [t.opened for t in sequential if t.opened is not None]
    finished = len(batch.finished)
    span = batch.wall or max((t.done for t in batch.finished if t.done is not None), default=None)
    per_turn = max(1, finished)
    return {
        "samples": len(firsts),
        "first_event_p50_s": pct(firsts, 0.5), "first_event_p99_s": pct(firsts, 0.99),
        "first_text_p50_s": pct(texts, 0.5), "first_text_p99_s": pct(texts, 0.99),
        # Where the wait before the first event is: the POST's answer, then the stream's headers.
        "posted_p50_s": pct(posted, 0.5), "opened_p50_s": pct(opened, 0.5),
        "events_per_turn": int(statistics.median([t.events for t in sequential if t.ok] or [0])),
        "throughput_n": len(batch.timings), "throughput_finished": finished,
        "turns_per_s": finished / span if span else None,
        "cpu_ms_per_turn": sum(v for k, v in cpu.items() if k in procs) * 1000 / per_turn,
        "cpu_ms_by_process": {k: v * 1000 / per_turn for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
        "errors": (batch.errors() + [t.error for t in sequential if t.error])[:5],
    }


async def _kortex(url: str, key: str, meter: CpuMeter, samples: int, n: int, timeout: float
                  ) -> tuple[list[TurnTiming], Batch, dict[str, float]]:
    async with session() as http:
        client = KortexClient(http, url, key)
        sessions = await client.create_sessions(MODEL, WARMUP + samples)
        progress(f"kortex: {samples} sequential zero-latency turns, then {n} at once")
        sequential = [await client.turn(sid, QUESTION) for sid in sessions]  # the clock starts before each POST
        many = await client.create_sessions(MODEL, n)
        before = meter.snapshot()
        batch = await send_at_once(client, many, QUESTION, timeout)
        return sequential[WARMUP:], batch, CpuMeter.delta(before, meter.snapshot())


def run_kortex(env: BenchEnv, samples: int, n: int) -> dict[str, Any]:
    with contextlib.ExitStack() as local:
        stack = env.kortex(local, {"latency": True})
        key = stack.keys["latency"]
        sequential, batch, cpu = asyncio.run(_kortex(stack.url, key, stack.meter(), samples, n,
                                                     timeout=max(120.0, n * 1.0)))
        return _figures(sequential, batch, cpu, tuple(stack.procs))


async def _bare(url: str, meter: CpuMeter, samples: int, n: int, chunks: int, timeout: float
                ) -> tuple[list[TurnTiming], Batch, dict[str, float]]:
    async with session() as http:
        client = KortexClient(http, url, "bare")  # the bare endpoints ignore the key
        body = {"chunks": chunks}
        progress(f"bare: {samples} sequential turns, then {n} at once")
        sequential = [await client.turn_at("/bare/turns", body) for _ in range(WARMUP + samples)]
        before = meter.snapshot()
        batch = await posts_at_once(client, [("/bare/turns", body)] * n, timeout)
        return sequential[WARMUP:], batch, CpuMeter.delta(before, meter.snapshot())


def run_bare(env: BenchEnv, samples: int, n: int, chunks: int) -> dict[str, Any]:
    with contextlib.ExitStack() as local:
        prefix = env.new_prefix()
        local.callback(delete_keys, prefix)
        penv = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_REDIS_URL": REDIS_URL, "BENCH_PREFIX": prefix}
        worker = start(local, "bare-worker", [PYTHON, "-m", "celery", "-A", "bench.bare_app", "worker", "-Q", "bare",
                                              "-l", "INFO", "-n", f"bare-{prefix}@%h"], penv, env.logdir)
        port = free_port()
        api = start(local, "bare-api", [PYTHON, "-m", "uvicorn", "bench.bare_app:api", "--host", "127.0.0.1",
                                        "--port", str(port)], penv, env.logdir)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        worker.wait_for(lambda: " ready." in worker.output())
        api.wait_for(healthy)
        meter = CpuMeter({"bare api": [api.pid], "bare worker": [worker.pid]})
        sequential, batch, cpu = asyncio.run(_bare(url, meter, samples, n, chunks, timeout=max(120.0, n * 1.0)))
        return _figures(sequential, batch, cpu, ("bare api", "bare worker"))


def run(env: BenchEnv, report: Report, samples: int, n: int) -> None:
    ours = run_kortex(env, samples, n)
    report.raw["latency_kortex"] = ours
    chunks = max(1, ours["events_per_turn"] - 1)  # the bare task's entries plus its done: as many as Kortex's
    bare: dict[str, Any] = {"cpu_ms_by_process": {}, "errors": ["cut short by the part's limit"]}
    try:
        bare = run_bare(env, samples, n, chunks)
    finally:  # Kortex's figures are shown even when the part's limit stops the baseline
        report.raw["latency_bare"] = bare
        _rows(report, samples, n, chunks, ours, bare)


def _rows(report: Report, samples: int, n: int, chunks: int, ours: dict[str, Any], bare: dict[str, Any]) -> None:
    cut = "" if ours["throughput_finished"] == n else f"{ours['throughput_finished']}/{n} done"
    report.add(
        Row("latency", "POST->first event p50", _ms(ours["first_event_p50_s"]), _ms(bare.get("first_event_p50_s")), "ms",
            "<= 2x"),
        Row("latency", "POST->first event p99", _ms(ours["first_event_p99_s"]), _ms(bare.get("first_event_p99_s")), "ms"),
        Row("latency", "POST->first text p50", _ms(ours["first_text_p50_s"]), _ms(bare.get("first_event_p50_s")), "ms",
            note="bare: first chunk"),
        Row("latency", f"throughput, {n} at once", ours["turns_per_s"], bare.get("turns_per_s"), "turns/s", ">= 0.5x",
            cut),
        Row("latency", "CPU per turn", ours["cpu_ms_per_turn"], bare.get("cpu_ms_per_turn"), "ms"),
    )
    report.note("latency", f"{samples} sequential turns per side; bare task writes {chunks} chunks + done "
                           f"(Kortex's client got {ours['events_per_turn']} events a turn)")
    for side, res in (("kortex", ours), ("bare", bare)):
        if res.get("posted_p50_s") is not None:
            report.note("latency", f"{side}: POST answered p50 {_ms(res['posted_p50_s']):.2f} ms, stream open p50 "
                                   f"{_ms(res['opened_p50_s']):.2f} ms, first event p50 "
                                   f"{_ms(res['first_event_p50_s']):.2f} ms")
        report.note("latency", f"{side} CPU ms/turn: "
                               + ", ".join(f"{k} {v:.1f}" for k, v in res["cpu_ms_by_process"].items()))
        if res["errors"]:
            report.note("latency", f"{side} errors: {'; '.join(map(str, res['errors']))}")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
