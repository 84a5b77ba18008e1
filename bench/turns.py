"""Turn benchmark: Kortex against a bare Celery baseline, measured in the same run.

    ./dev bench [--script bench_turn] [--turns 300] [--samples 100] [--concurrency 2]

Kortex side: one turn of the scripted provider with one tool call (get_recent_deploys over the
embedded store): step task -> tool task -> step task, through PostgreSQL and Redis. The
default script streams a realistic answer: 12 text chunks before the tool call and 123 after.

Baseline: one bare Celery task writing the same number of chunks to a Redis Stream, one XADD
per chunk: every chunk the model streamed plus Kortex's structural events (turn, tool_call,
tool_result, done). It runs with the same broker settings, pool and concurrency.

Kortex is measured twice: as configured by default (text deltas coalesced over 25 ms, so a
fast stream costs a few Redis writes) and with coalescing off (one write per chunk, exactly
the baseline's writes). Figures: enqueue -> first event and -> first text (p50/p99, sequential
turns), throughput with every turn enqueued at once, and CPU per turn by process.
Needs PostgreSQL and Redis (the test services); leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
def worker(argv: list[str], env: dict[str, str]) -> Iterator[None]:
    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while " ready." not in Path(log.name).read_text(errors="replace"):
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
        reply = r.xread({key: last}, count=1000, block=1000)
        now = time.perf_counter()
        for _key, entries in reply or []:
            for eid, fields in entries:
                last = eid
                out.append((now, fields.get("t", "")))
                if stop_type is None or fields.get("t") == stop_type:
                    return out
    raise TimeoutError(f"no {stop_type or 'entry'} on {key}")


def cpu_snapshot() -> dict[str, tuple[str, int]]:
    """CPU ticks used so far by every process on the machine, with a label for each."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        label = ("worker" if ("workers.app" in cmd or "bare_app" in cmd)
                 else "bench client" if "turns.py" in cmd else comm)
        out[pid] = (label, int(fields[11]) + int(fields[12]))
    return out


def cpu_delta(before: dict[str, tuple[str, int]], n: int) -> dict[str, float]:
    """CPU milliseconds per turn (or task) by process kind, across the whole machine."""
    after = cpu_snapshot()
    tick = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for pid, (label, ticks) in after.items():
        used = ticks - before.get(pid, (label, 0))[1]
        if used > 0:
            totals[label] = totals.get(label, 0.0) + used * 1000 / tick / n
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


class Bench:
    def __init__(self, args: argparse.Namespace, pg_url: str, prefix: str) -> None:
        self.args = args
        self.prefix = prefix
        self.r = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
        self.env.update({
            "KORTEX_DATABASE_URL": pg_url, "KORTEX_REDIS_URL": REDIS_URL, "KORTEX_REDIS_PREFIX": prefix,
            "KORTEX_TESTING__ENABLE_TEST_PROVIDERS": "true", "PYTHONPATH": str(ROOT),
            "KORTEX_LLM__BUDGET__MAX_CONCURRENT_TURNS_PER_TENANT": "1000000",
            "BENCH_REDIS_URL": REDIS_URL, "BENCH_PREFIX": prefix,
        })
        settings = Settings(database_url=pg_url, redis_url=REDIS_URL, redis_prefix=prefix,
                            testing={"enable_test_providers": True},
                            llm={"budget": {"max_concurrent_turns_per_tenant": 1_000_000, "turns_per_minute": 1_000_000}})
        self.k = Kortex.create(settings)
        self.celery = make_celery(settings)
        os.environ.update(BENCH_REDIS_URL=REDIS_URL, BENCH_PREFIX=prefix)  # read when bare_app loads
        from bench.bare_app import app as bare_app

        self.bare = bare_app
        with self.k.db.begin() as conn:
            self.tenant_id = tenants.create_tenant(conn, "bench").id
            scenarios.seed(conn, self.tenant_id, scenarios.get_scenario("checkout-deploy-regression"), now=utcnow())

    def close(self) -> None:
        self.k.close()
        keys = list(self.r.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self.r.delete(*keys)

    def _argv(self, app: str, queues: str, name: str) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues, "-n", f"{name}-{self.prefix}@%h",
                "-P", self.args.pool, "-c", str(self.args.concurrency), "-l", "INFO", "--without-mingle",
                "--without-gossip"]

    # ---- Kortex ----

    def _new_turn(self) -> Any:
        session = chat.create_session(self.k, self.tenant_id, "bench", f"scripted:{self.args.script}")
        return chat.post_message(self.k, self.tenant_id, session.id, "Why is checkout slow?")

    def _ours_once(self) -> tuple[float, float, int]:
        posted = self._new_turn()
        t0 = time.perf_counter()
        dispatch(self.celery, posted.handoff)
        entries = read_until(self.r, self.k.events.key(posted.turn.id), "done")
        return entries[0][0] - t0, next(t for t, kind in entries if kind == "text") - t0, len(entries)

    def ours(self, flush_ms: int) -> dict[str, Any]:
        env = {**self.env, "KORTEX_TURN__TEXT_FLUSH_MS": str(flush_ms)}
        with worker(self._argv("workers.app", "turns,tools", f"k{flush_ms}"), env):
            entries = [self._ours_once()[2] for _ in range(20)]  # warm-up
            first, text = [], []
            for _ in range(self.args.samples):
                a, b, _n = self._ours_once()
                first.append(a)
                text.append(b)
            posted = [self._new_turn() for _ in range(self.args.turns)]
            ids = [p.turn.id for p in posted]
            cpu = cpu_snapshot()
            t0 = time.perf_counter()
            for p in posted:
                dispatch(self.celery, p.handoff)
            while self._done(ids) < len(ids):
                time.sleep(0.05)
            rate = len(ids) / (time.perf_counter() - t0)
            return {"first": first, "text": text, "rate": rate, "cpu": cpu_delta(cpu, len(ids)),
                    "entries": max(set(entries), key=entries.count)}

    def _done(self, ids: list[str]) -> int:
        with self.k.db.connect() as conn:
            return int(conn.scalar(select(func.count()).select_from(turns_table).where(
                turns_table.c.id.in_(ids), turns_table.c.status == "done")) or 0)

    # ---- baseline ----

    def bare_run(self, chunks: int) -> dict[str, Any]:
        counter = f"{self.prefix}:bare-count"

        def send() -> str:
            key = f"{self.prefix}:bare:{uuid.uuid4().hex}"
            self.bare.send_task("bench.bare.write", kwargs={"key": key, "chunks": chunks, "counter": counter},
                                queue="bare")
            return key

        def finished(n: int) -> None:
            while int(self.r.get(counter) or 0) < n:
                time.sleep(0.0005)

        with worker(self._argv("bench.bare_app", "bare", "bare"), self.env):
            first = []
            for i in range(20 + self.args.samples):
                t0 = time.perf_counter()
                key = send()
                if i >= 20:  # after the warm-up
                    first.append(read_until(self.r, key, None)[0][0] - t0)
                finished(i + 1)  # like the Kortex side, one task at a time: no queueing in the figure
            self.r.delete(counter)
            cpu = cpu_snapshot()
            t0 = time.perf_counter()
            for _ in range(self.args.turns):
                send()
            while int(self.r.get(counter) or 0) < self.args.turns:
                time.sleep(0.01)
            rate = self.args.turns / (time.perf_counter() - t0)
            return {"first": first, "rate": rate, "cpu": cpu_delta(cpu, self.args.turns)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default="bench_turn", help="scripted-provider script for the Kortex turns")
    parser.add_argument("--turns", type=int, default=300, help="turns (and bare tasks) for throughput")
    parser.add_argument("--samples", type=int, default=100, help="sequential runs for latency")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes on each side")
    parser.add_argument("--pool", default="prefork")
    args = parser.parse_args()
    prefix = f"kxbench-{uuid.uuid4().hex[:8]}"
    with throwaway_database() as pg_url:
        bench = Bench(args, pg_url, prefix)
        try:
            strict = bench.ours(flush_ms=0)        # one stream entry per chunk, as the baseline writes
            default = bench.ours(flush_ms=25)
            bare = bench.bare_run(strict["entries"])
        finally:
            bench.close()
    report(args, bare, default, strict)


def report(args: argparse.Namespace, bare: dict[str, Any], default: dict[str, Any], strict: dict[str, Any]) -> None:
    ms = lambda v: f"{v * 1000:.2f} ms"  # noqa: E731
    b50 = pct(bare["first"], 0.5)
    print(f"\nKortex turn benchmark · script {args.script} · {args.pool} x{args.concurrency} per side · "
          f"{args.samples} sequential turns for latency · {args.turns} for throughput")
    print(f"baseline writes {strict['entries']} chunks per task; Kortex writes {strict['entries']} stream entries "
          f"per turn with coalescing off, {default['entries']} with the default 25 ms coalescing\n")
    print(f"{'latency from enqueue':44}{'p50':>10}{'p99':>10}{'p50 / bare':>12}")
    print(f"{'bare task: first chunk':44}{ms(b50):>10}{ms(pct(bare['first'], 0.99)):>10}{'1.00x':>12}")
    for label, res in (("kortex default", default), ("kortex, coalescing off", strict)):
        for what, key in (("first event", "first"), ("first text", "text")):
            p50 = pct(res[key], 0.5)
            print(f"{label + ': ' + what:44}{ms(p50):>10}{ms(pct(res[key], 0.99)):>10}{p50 / b50:>11.2f}x")
    print(f"\n{'throughput':44}{'per s':>10}{'/ bare':>10}   cpu ms each (whole machine)")
    for label, res in (("bare task", bare), ("kortex turn, default", default), ("kortex turn, coalescing off", strict)):
        cpu = res["cpu"]
        parts = ", ".join(f"{k} {v:.1f}" for k, v in list(cpu.items())[:4])
        print(f"{label:44}{res['rate']:>10.1f}{res['rate'] / bare['rate']:>10.2f}   {sum(cpu.values()):.1f}: {parts}")
    print(json.dumps({
        "first_event_p50_ratio": round(pct(default["first"], 0.5) / b50, 2),
        "throughput_ratio_default": round(default["rate"] / bare["rate"], 3),
        "throughput_ratio_coalescing_off": round(strict["rate"] / bare["rate"], 3),
    }))


if __name__ == "__main__":
    main()
