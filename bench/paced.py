"""Paced concurrency: N turns sent at once through the real stack, the fake LLM paced like a
real model, beside the asyncio floor (``bench/floor.py``) doing the same turns, the same N.

Figures per N: completion time (clock start -> last ``done`` at the client), first-text
p50/p99 (every turn's clock is the batch's, started before the first POST) and CPU per turn:
Kortex's processes summed (API, turns worker, tools worker, beat, with prefork children)
against the floor's one process; PostgreSQL (this run's backends) and Redis (shared, whole)
beside them. Goals (issue 9): completion <= 1.5x floor, first-text p99 <= 2x, CPU <= 1.5x.

Each side has a time limit: the floor ``--timeout`` (default 300 s), Kortex the larger of
60 s (30 s with ``--quick``) and 4x the floor's completion time (enough to judge a 1.5x
goal). A side cut short reports how many turns finished and the figures of those.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from typing import Any

import psycopg

from bench import floor
from bench.client import Batch, KortexClient, posts_at_once, session
from bench.report import Report, Row
from bench.scripts import QUESTION, all_scripts, model_time_s
from bench.stack import PYTHON, REDIS_URL, ROOT, BenchEnv, CpuMeter, delete_keys, pct, progress, start


#: The benchmark's own process, the client of either side (Kortex's SSE readers, the floor's
#: Redis readers): shown beside the figures, never counted in them. On two cores a client that
#: burns a core delays what it measures.
CLIENT = "client (bench)"


def summary(batch: Batch, cpu: dict[str, float], n: int, procs: tuple[str, ...]) -> dict[str, Any]:
    finished = batch.finished
    texts = [t.first_text for t in batch.timings if t.first_text is not None]
    posted = [t.posted for t in batch.timings if t.posted is not None]
    firsts = [t.first_event for t in batch.timings if t.first_event is not None]
    opened = [t.opened for t in batch.timings if t.opened is not None]
    # CPU is charged to the turns that finished (with none, there is no figure)
    per_turn = len(finished)
    own = sum(v for k, v in cpu.items() if k in procs)
    return {
        "n": n, "finished": len(finished), "timed_out": batch.timed_out,
        "completion_s": batch.wall,
        "last_done_s": max((t.done for t in finished if t.done is not None), default=None),
        "first_text_p50_s": pct(texts, 0.5), "first_text_p99_s": pct(texts, 0.99),
        # Where the wait before the first text is: the POST's answer, then the first event.
        "posted_p50_s": pct(posted, 0.5), "posted_p99_s": pct(posted, 0.99),
        "opened_p50_s": pct(opened, 0.5), "opened_p99_s": pct(opened, 0.99),
        "first_event_p50_s": pct(firsts, 0.5), "first_event_p99_s": pct(firsts, 0.99),
        "cpu_ms_per_turn": own * 1000 / per_turn if per_turn else None,
        "cpu_ms_by_process": {k: v * 1000 / per_turn for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])}
        if per_turn else {},
        "cpu_s_in_window": {k: round(v, 2) for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])},
        "errors": batch.errors()[:5],
    }


def run_floor(env: BenchEnv, n: int, timeout: float) -> dict[str, Any]:
    with contextlib.ExitStack() as local:
        prefix = env.new_prefix()
        local.callback(delete_keys, prefix)
        argv = [PYTHON, "-m", "bench.floor", "--fake", env.fake_url, "--redis", REDIS_URL, "--prefix", prefix,
                "--n", str(n)]
        proc = start(local, f"floor-{n}", argv, {**os.environ, "PYTHONPATH": str(ROOT)}, env.logdir,
                     stdin=subprocess.PIPE)
        proc.wait_for(lambda: "ready" in proc.output(), timeout=60)
        progress(f"floor: {n} paced turns at once")
        meter = CpuMeter({"floor": [proc.pid]})
        before, mine_before = meter.snapshot(), time.process_time()
        batch = asyncio.run(floor.measure(proc.proc.stdin, REDIS_URL, prefix, n, timeout))
        cpu = {**CpuMeter.delta(before, meter.snapshot()), CLIENT: time.process_time() - mine_before}
        assert proc.proc.stdin is not None
        proc.proc.stdin.close()  # the floor exits once its CPU has been read
        return summary(batch, cpu, n, ("floor",))


async def _kortex_batch(env: BenchEnv, url: str, keys: list[str], meter: CpuMeter, n: int, timeout: float
                        ) -> tuple[Batch, dict[str, float]]:
    """N turns at once, dealt round robin over the tenants of ``keys``."""
    async with session() as http:
        clients = [KortexClient(http, url, key) for key in keys]
        for sid in await clients[0].create_sessions("anthropic:bench-zero", 3):  # warm every process's paths
            await clients[0].turn(sid, QUESTION)
        mine = [await c.create_sessions("anthropic:bench-paced", len(range(i, n, len(clients))))
                for i, c in enumerate(clients)]
        dealt = [(clients[i % len(clients)], mine[i % len(clients)][i // len(clients)]) for i in range(n)]
        progress(f"kortex: {n} paced turns at once" + (f" over {len(keys)} tenants" if len(keys) > 1 else "")
                 + f" (limit {timeout:.0f} s)")
        before, mine_before = meter.snapshot(), time.process_time()
        batch = await posts_at_once([c for c, _ in dealt], [(c.message_path(sid), {"content": QUESTION})
                                                            for c, sid in dealt], timeout)
        return batch, {**CpuMeter.delta(before, meter.snapshot()), CLIENT: time.process_time() - mine_before}


def run_kortex(env: BenchEnv, n: int, timeout: float, tenants: int = 1) -> dict[str, Any]:
    with contextlib.ExitStack() as local:
        roles = [f"paced-{i}" if tenants > 1 else "paced" for i in range(tenants)]
        stack = env.kortex(local, {role: True for role in roles})
        keys = [stack.keys[role] for role in roles]
        batch, cpu = asyncio.run(_kortex_batch(env, stack.url, keys, stack.meter(), n, timeout))
        return {**summary(batch, cpu, n, tuple(stack.procs)), **server_waits(stack.env["KORTEX_DATABASE_URL"])}


def server_waits(database_url: str) -> dict[str, Any]:
    """Where a turn waited on the server before its first LLM call: from the turn's commit to
    the first call's start (its audit row's time less its latency), p50/p99."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM min(d.created_at - make_interval(secs => d.latency_ms / 1000.0))"
            " - t.created_at) FROM turns t JOIN decisions d ON d.turn_id = t.id"
            " WHERE d.kind = 'llm_call' AND t.profile = 'chat' GROUP BY t.id, t.created_at").fetchall()
    waits = [float(wait) for (wait,) in rows if wait is not None]
    return {"first_call_wait_p50_s": pct(waits, 0.5), "first_call_wait_p99_s": pct(waits, 0.99)}


def run(env: BenchEnv, report: Report, sizes: list[int], timeout: float | None, min_limit: float = 60.0,
        tenants: int = 1) -> None:
    report.note("paced", f"model time per turn alone {model_time_s(all_scripts()['bench-paced']):.1f} s "
                         "(300 ms to first token, 60 tokens/s in pieces of 4, 200 tokens x 2 steps, 1 tool call)")
    if tenants > 1:
        report.note("paced", f"Kortex's turns dealt round robin over {tenants} tenants (the floor has none)")
    for n in sizes:
        base = run_floor(env, n, timeout or 300.0)
        report.raw[f"paced_floor_{n}"] = base
        limit = timeout or max(min_limit, 4 * (base["completion_s"] or base["last_done_s"] or min_limit))
        ours: dict[str, Any] = {"finished": 0, "cpu_ms_by_process": {}, "errors": ["cut short by the part's limit"]}
        try:
            ours = run_kortex(env, n, limit, tenants)
        finally:  # the floor's figures are shown even when the part's limit stops Kortex's side
            report.raw[f"paced_kortex_{n}"] = ours
            _rows(report, n, base, ours, limit)


def _rows(report: Report, n: int, base: dict[str, Any], ours: dict[str, Any], limit: float) -> None:
    cut = "" if ours["finished"] == n else f"{ours['finished']}/{n} done in {limit:.0f} s"
    partial = "" if ours["finished"] == n else "over finished turns: an upper bound"
    report.add(
        Row("paced", f"N={n} completion", ours.get("completion_s"), base["completion_s"], "s", "<= 1.5x", cut),
        Row("paced", f"N={n} first text p50", ours.get("first_text_p50_s"), base["first_text_p50_s"], "s"),
        Row("paced", f"N={n} first text p99", ours.get("first_text_p99_s"), base["first_text_p99_s"], "s", "<= 2x"),
        Row("paced", f"N={n} CPU per turn", ours.get("cpu_ms_per_turn"), base["cpu_ms_per_turn"], "ms", "<= 1.5x",
            partial),
    )
    if ours.get("posted_p50_s") is not None:
        report.note("paced", f"N={n} kortex: POST answered p50 {ours['posted_p50_s']:.2f} s / p99 "
                             f"{ours['posted_p99_s']:.2f} s; stream open p50 {ours['opened_p50_s'] or 0:.2f} s / "
                             f"p99 {ours['opened_p99_s'] or 0:.2f} s; first event p50 {ours['first_event_p50_s'] or 0:.2f} s / "
                             f"p99 {ours['first_event_p99_s'] or 0:.2f} s; on the server, turn stored -> first LLM "
                             f"call p50 {ours.get('first_call_wait_p50_s') or 0:.2f} s / "
                             f"p99 {ours.get('first_call_wait_p99_s') or 0:.2f} s")
    by = ", ".join(f"{k} {v:.1f}" for k, v in ours["cpu_ms_by_process"].items())
    if by:
        report.note("paced", f"N={n} kortex CPU ms/turn: {by}")
    elif ours.get("cpu_s_in_window"):  # no turn to charge it to: what the stack burnt while it tried
        report.note("paced", f"N={n} kortex CPU s over the {limit:.0f} s window (no turn finished): "
                             + ", ".join(f"{k} {v:.1f}" for k, v in ours["cpu_s_in_window"].items()))
    report.note("paced", f"N={n} floor CPU ms/turn: "
                         + ", ".join(f"{k} {v:.1f}" for k, v in base["cpu_ms_by_process"].items()))
    for side, res in (("kortex", ours), ("floor", base)):
        if res["errors"]:
            report.note("paced", f"N={n} {side} errors: {'; '.join(res['errors'])}")
