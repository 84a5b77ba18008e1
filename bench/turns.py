"""Turn benchmark: Kortex against a bare Celery baseline, measured in the same run.

    ./dev bench [--turns 300] [--samples 100] [--concurrency 2]

Kortex side: a turn with the scripted provider and one tool call (get_recent_deploys over the
embedded store): step task -> tool task -> step task, through PostgreSQL and Redis.
Baseline: one bare Celery task writing the same number of chunks to a Redis Stream.

Figures: latency from enqueue to the first streamed event (and to the first text), p50/p99;
throughput in turns per second with every turn enqueued at once. Both run on workers with the
same pool and concurrency. Needs PostgreSQL and Redis (the test services); leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kortex.aio import LoopThread  # noqa: E402
from kortex.config import Settings  # noqa: E402
from kortex.container import Kortex  # noqa: E402
from kortex.storage import tenants  # noqa: E402
from kortex.storage.migrate import upgrade  # noqa: E402
from kortex.storage.schema import turns as turns_table  # noqa: E402
from kortex.telemetry import scenarios  # noqa: E402
from kortex.timeparse import utcnow  # noqa: E402
from kortex.turns import chat  # noqa: E402
from workers.app import make_celery  # noqa: E402
from workers.dispatch import dispatch  # noqa: E402

PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    name = f"kortex_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def worker(argv: list[str], env: dict[str, str], ready_marker: str = " ready.") -> Iterator[None]:
    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while ready_marker not in Path(log.name).read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(Path(log.name).read_text(errors="replace")[-3000:])
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        Path(log.name).unlink(missing_ok=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def read_until(r: redis.Redis, key: str, stop_type: str | None, timeout: float = 30) -> list[tuple[float, str]]:
    """(arrival time, type) of entries until one of ``stop_type`` (or the first, if None)."""
    out: list[tuple[float, str]] = []
    last = "0-0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = r.xread({key: last}, count=100, block=1000)
        now = time.perf_counter()
        for _key, entries in reply or []:
            for eid, fields in entries:
                last = eid
                out.append((now, fields.get("t", "")))
                if stop_type is None or fields.get("t") == stop_type:
                    return out
    raise TimeoutError(f"no {stop_type or 'entry'} on {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=300, help="turns (and bare tasks) for throughput")
    parser.add_argument("--samples", type=int, default=100, help="sequential runs for latency")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes on each side")
    parser.add_argument("--pool", default="prefork")
    args = parser.parse_args()

    prefix = f"kxbench-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    with throwaway_database() as pg_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
        env.update({
            "KORTEX_DATABASE_URL": pg_url, "KORTEX_REDIS_URL": REDIS_URL, "KORTEX_REDIS_PREFIX": prefix,
            "KORTEX_TESTING__ENABLE_TEST_PROVIDERS": "true", "PYTHONPATH": str(ROOT),
            "KORTEX_LLM__BUDGET__MAX_CONCURRENT_TURNS_PER_TENANT": "1000000",
            "BENCH_REDIS_URL": REDIS_URL, "BENCH_PREFIX": prefix,
        })
        common = ["-P", args.pool, "-c", str(args.concurrency), "-l", "INFO", "--without-mingle", "--without-gossip"]
        ours_argv = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", "turns,tools",
                     "-n", f"ours-{prefix}@%h", *common]
        bare_argv = [sys.executable, "-m", "celery", "-A", "bench.bare_app", "worker", "-Q", "bare",
                     "-n", f"bare-{prefix}@%h", *common]
        settings = Settings(database_url=pg_url, redis_url=REDIS_URL, redis_prefix=prefix,
                            testing={"enable_test_providers": True},
                            llm={"budget": {"max_concurrent_turns_per_tenant": 1_000_000}})
        loop = LoopThread("bench")
        k = Kortex.create(settings)
        celery_app = make_celery(settings)
        os.environ.update(BENCH_REDIS_URL=REDIS_URL, BENCH_PREFIX=prefix)  # read when bare_app loads
        from bench.bare_app import app as bare_app

        try:
            with worker(ours_argv, env), worker(bare_argv, env):
                results = run(args, loop, k, celery_app, bare_app, r, prefix)
        finally:
            loop.run(k.aclose())
            loop.stop()
            keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                r.delete(*keys)
    report(args, results)


def run(args: argparse.Namespace, loop: LoopThread, k: Kortex, celery_app: Any, bare_app: Any,
        r: redis.Redis, prefix: str) -> dict[str, Any]:
    async def setup() -> str:
        async with k.db.begin() as conn:
            tenant = await tenants.create_tenant(conn, "bench")
            await scenarios.seed(conn, tenant.id, scenarios.get_scenario("checkout-deploy-regression"), now=utcnow())
        return tenant.id

    tenant_id = loop.run(setup())

    async def new_turn() -> tuple[Any, float]:
        started = time.perf_counter()
        session = await chat.create_session(k, tenant_id, "bench", "scripted:one_tool")
        posted = await chat.post_message(k, tenant_id, session.id, "Why is checkout slow?")
        return posted, time.perf_counter() - started

    def ours_once() -> tuple[float, float, float, int]:
        posted, post_s = loop.run(new_turn())
        key = k.events.key(posted.turn.id)
        t0 = time.perf_counter()
        dispatch(celery_app, posted.handoff)
        entries = read_until(r, key, "done")
        first = entries[0][0] - t0
        first_text = next(t for t, kind in entries if kind == "text") - t0
        return first, first_text, post_s, len(entries)

    counter = f"{prefix}:bare-count"

    def bare_send(chunks: int) -> str:
        key = f"{prefix}:bare:{uuid.uuid4().hex}"
        bare_app.send_task("bench.bare.write", kwargs={"key": key, "chunks": chunks, "counter": counter},
                           queue="bare")
        return key

    def bare_once(chunks: int) -> float:
        t0 = time.perf_counter()
        key = bare_send(chunks)
        return read_until(r, key, None)[0][0] - t0

    # warm up both sides (process pools, connection pools, prepared statements)
    chunk_counts = [ours_once()[3] for _ in range(20)]
    chunks = max(set(chunk_counts), key=chunk_counts.count)
    for _ in range(20):
        bare_once(chunks)

    ours_lat, ours_text, post_cost, bare_lat = [], [], [], []
    for _ in range(args.samples):
        first, first_text, post_s, _n = ours_once()
        ours_lat.append(first)
        ours_text.append(first_text)
        post_cost.append(post_s)
        bare_lat.append(bare_once(chunks))

    # throughput: everything enqueued at once
    async def many(n: int) -> list[Any]:
        return [(await new_turn())[0] for _ in range(n)]

    posted = loop.run(many(args.turns))
    ids = [p.turn.id for p in posted]

    async def done_count() -> int:
        async with k.db.connect() as conn:
            return int(await conn.scalar(select(func.count()).select_from(turns_table).where(
                turns_table.c.id.in_(ids), turns_table.c.status == "done")) or 0)

    t0 = time.perf_counter()
    for p in posted:
        dispatch(celery_app, p.handoff)
    while loop.run(done_count()) < len(ids):
        time.sleep(0.02)
    ours_tp = len(ids) / (time.perf_counter() - t0)

    r.delete(counter)
    t0 = time.perf_counter()
    for _ in range(args.turns):
        bare_send(chunks)
    while int(r.get(counter) or 0) < args.turns:
        time.sleep(0.01)
    bare_tp = args.turns / (time.perf_counter() - t0)
    return {"chunks": chunks, "ours_lat": ours_lat, "ours_text": ours_text, "bare_lat": bare_lat,
            "post": post_cost, "ours_tp": ours_tp, "bare_tp": bare_tp}


def report(args: argparse.Namespace, res: dict[str, Any]) -> None:
    ms = lambda v: f"{v * 1000:7.2f} ms"  # noqa: E731
    bl50, bl99 = pct(res["bare_lat"], 0.5), pct(res["bare_lat"], 0.99)
    ol50, ol99 = pct(res["ours_lat"], 0.5), pct(res["ours_lat"], 0.99)
    ot50, ot99 = pct(res["ours_text"], 0.5), pct(res["ours_text"], 0.99)
    print(f"\nKortex turn benchmark · {args.pool} x{args.concurrency} per side · {args.samples} latency samples · "
          f"{args.turns} turns for throughput · {res['chunks']} stream entries per turn\n")
    print(f"{'':34}{'p50':>11}{'p99':>11}{'p50 ratio':>12}")
    print(f"{'bare: enqueue -> first chunk':34}{ms(bl50):>11}{ms(bl99):>11}{'1.00x':>12}")
    print(f"{'kortex: enqueue -> first event':34}{ms(ol50):>11}{ms(ol99):>11}{ol50 / bl50:>11.2f}x")
    print(f"{'kortex: enqueue -> first text':34}{ms(ot50):>11}{ms(ot99):>11}{ot50 / bl50:>11.2f}x")
    print(f"{'kortex: POST (session+turn rows)':34}{ms(statistics.median(res['post'])):>11}")
    print(f"\n{'throughput':34}{'turns/s':>11}{'ratio':>11}")
    print(f"{'bare':34}{res['bare_tp']:>11.1f}{'1.00':>11}")
    print(f"{'kortex (3 tasks, 1 tool call)':34}{res['ours_tp']:>11.1f}{res['ours_tp'] / res['bare_tp']:>11.2f}")
    print(json.dumps({"first_event_p50_ratio": round(ol50 / bl50, 2), "throughput_ratio":
                      round(res["ours_tp"] / res["bare_tp"], 3)}))


if __name__ == "__main__":
    main()
