"""Batch post-mortems beside chat (issue 12): tenant A's job of N incidents on the batch queue
(`kortex worker --queues batch`, started by the stack like every queue), the fake model
scripted to investigate once and submit a document; meanwhile tenant B's trivial chat turns,
one at a time. Figures: items/s of the job, and B's client POST -> first event p50/p99 idle
and while the batch runs (goal: p99 with the batch <= 1.5x without)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.client import KortexClient, TurnTiming, session
from bench.fairness import WARMUP, _b_turns, _first
from bench.report import Report, Row
from bench.stack import BenchEnv, pct, progress

MODEL = "anthropic:bench-postmortem"
JOB_LIMIT = 600.0
# B's idle turns are this many times ``samples``: the goal compares p99s, and the p99 of twenty
# idle turns is about their slowest, which said 9.6 and 29.2 ms in two runs of the same code
# (the goal "met" in the second only for that) while the p99 of ~560 turns during the batch said
# 29.4-29.9. Two hundred idle turns said 10.2-11.2 ms over six runs.
IDLE_FACTOR = 10


def script() -> dict[str, Any]:
    """Investigate (one tool call), submit a document citing it, say so."""
    document = {
        "title": "Post-mortem (bench)", "incident_id": "bench", "product": "checkout", "severity": "error",
        "summary": "A benchmark document.", "detection": "An alert.", "resolution": "A rollback.",
        "impact": {"who": "checkout users", "magnitude": "a few errors", "citations": ["toolu_pm_1"]},
        "timeline": [{"at": "2026-11-01T10:00:00Z", "event": "opened", "citations": ["toolu_pm_1"]}],
        "root_cause": {"statement": "a deploy", "citations": ["toolu_pm_1"]},
        "action_items": [{"action": "add a canary", "owner_role": "checkout on-call", "priority": "P2",
                          "due_in_days": 14}],
    }
    return {"steps": [
        {"text": ["Reading ", "the incident."], "tool_calls": [
            {"id": "toolu_pm_1", "name": "get_incident_history", "arguments": {"query": "incident"}}]},
        {"text": ["Submitting."], "tool_calls": [{"id": "toolu_pm_2", "name": "submit_postmortem",
                                                   "arguments": document, "fragments": 6}]},
        {"text": ["Submitted."]},
    ]}


def _incidents(n: int) -> list[dict[str, Any]]:
    start = datetime.now(UTC) - timedelta(days=20)
    return [{"ref": f"BENCH-{i:04d}", "product": "checkout", "title": f"checkout incident {i}", "severity": "error",
             "opened_at": (start + timedelta(minutes=30 * i)).isoformat(),
             "closed_at": (start + timedelta(minutes=30 * i + 20)).isoformat()} for i in range(n)]


async def _measure(url: str, key_a: str, key_b: str, items: int, samples: int) -> dict[str, Any]:
    async with session() as http:
        headers_a = {"Authorization": f"Bearer {key_a}"}
        for offset in range(0, items, 500):
            async with http.post(f"{url}/v1/ingest/incidents", headers=headers_a,
                                 json={"items": _incidents(items)[offset:offset + 500]}) as r:
                if r.status >= 300:
                    raise RuntimeError(f"ingest: HTTP {r.status}: {await r.text()}")
        b = KortexClient(http, url, key_b)
        for sid in await b.create_sessions("anthropic:bench-trivial", WARMUP):  # a warm stack (bench/fairness.py)
            await b.turn(sid, "warm up")
        idle = await _b_turns(b, await b.create_sessions("anthropic:bench-trivial", samples * IDLE_FACTOR), None)
        b_sessions = await b.create_sessions("anthropic:bench-trivial", samples)
        started = time.perf_counter()
        async with http.post(f"{url}/v1/postmortems", headers=headers_a,
                             json={"filter": {"since": "30d"}, "model": MODEL}) as r:
            job = await r.json()
            if r.status != 202:
                raise RuntimeError(f"post-mortems: HTTP {r.status}: {job}")
        progress(f"batch: a job of {job['items']} post-mortems; B sends one chat turn at a time")
        stop = asyncio.Event()

        async def watch() -> dict[str, Any]:
            while time.perf_counter() - started < JOB_LIMIT:
                async with http.get(f"{url}{job['status_url']}", headers=headers_a) as r:
                    status: dict[str, Any] = await r.json()
                if status["finished_at"]:
                    break
                await asyncio.sleep(0.25)
            stop.set()
            status["elapsed_s"] = time.perf_counter() - started
            return status

        watcher = asyncio.ensure_future(watch())
        during: list[TurnTiming] = []
        while not stop.is_set():  # B keeps sampling for as long as the batch runs
            during += await _b_turns(b, b_sessions[:1], stop)
            b_sessions = b_sessions[1:] or await b.create_sessions("anthropic:bench-trivial", samples)
        status = await watcher
    return {"idle": idle, "during": during, "status": status}


def run(env: BenchEnv, report: Report, items: int, samples: int) -> None:
    with contextlib.ExitStack() as local:
        stack = env.kortex(local, {"batch-a": False, "chat-b": False})
        meter = stack.meter()
        before = meter.snapshot()
        got = asyncio.run(_measure(stack.url, stack.keys["batch-a"], stack.keys["chat-b"], items, samples))
        cpu = meter.delta(before, meter.snapshot())
    idle, during, status = got["idle"], got["during"], got["status"]
    counts = status["counts"]
    figures = {
        "items": status["items"], "done": counts["done"], "failed": counts["failed"],
        "elapsed_s": status["elapsed_s"], "items_per_s": counts["done"] / status["elapsed_s"],
        "idle_p50_s": pct(_first(idle, "first_event", 60.0), 0.5), "idle_p99_s": pct(_first(idle, "first_event", 60.0), 0.99),
        "batch_p50_s": pct(_first(during, "first_event", 60.0), 0.5),
        "batch_p99_s": pct(_first(during, "first_event", 60.0), 0.99),
        "b_idle_turns": len(idle), "b_batch_turns": len(during), "cpu_s": cpu,
    }
    report.raw["batch"] = figures
    report.add(
        Row("batch", f"{status['items']} post-mortems (scripted model)", figures["items_per_s"], None, "items/s", "",
            f"{counts['done']} done, {counts['failed']} failed in {status['elapsed_s']:.1f} s"),
        Row("batch", "chat first event p50 (batch/idle)", _ms(figures["batch_p50_s"]), _ms(figures["idle_p50_s"]), "ms"),
        Row("batch", "chat first event p99 (batch/idle)", _ms(figures["batch_p99_s"]), _ms(figures["idle_p99_s"]), "ms",
            "<= 1.5x", f"B: {len(idle)} turns idle, {len(during)} during the batch"),
    )
    report.note("batch", "CPU s by process during the part: " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
