"""Kortex benchmarks (issue 9), every figure beside its baseline measured in the same run.

    ./dev bench [--only paced,latency,fairness,sse] [--turns 100,1000] [--quick] [--json FILE]

Parts:
  paced     N turns at once through the real stack (API under uvicorn, `kortex worker --queues
            turns`, `kortex worker --queues tools`, `kortex beat`; no tuning flags), the fake
            LLM paced like a real model, beside an asyncio floor (one loop, aiohttp +
            redis.asyncio) doing the same turns: completion, first-text p50/p99, CPU per turn.
  latency   a zero-latency model and one tool call: client POST -> first event p50/p99
            (sequential turns, clock started before the POST) and turns/s (all at once),
            beside a bare FastAPI endpoint + bare Celery task + bare SSE endpoint.
  fairness  tenant B's trivial turns idle (one at a time) and while tenant A floods paced turns
            (one every 0.25 s through the flood, and one at a time as earlier stops measured).
  sse       bench/sse.py's fan-out figures (2,000 streams x 5 events/s vs a raw ASGI floor), if present.
  routing   what choosing each step's model (model "auto") costs beside a pinned model (issue 13);
            in this process, no services.
  batch     a job of post-mortems on the batch queue (scripted model): items/s, and another
            tenant's chat first-event p50/p99 idle vs while the batch runs (issue 12).

Needs PostgreSQL and Redis (the test services: KORTEX_TEST_PG_URL, KORTEX_TEST_REDIS_URL).
KORTEX_BENCH_PYSPY=<folder> profiles every Kortex process with py-spy from the moment it is ready
(speedscope files; KORTEX_BENCH_PYSPY_PROCS=api,turns worker narrows it).
KORTEX_BENCH_SET_<NAME>=value runs Kortex's processes with KORTEX_<NAME>=value, to measure a
setting beside its default (KORTEX_BENCH_SET_TURN__LOOP_LAG_TARGET_MS=20, say).
Everything it starts (processes, a throwaway database, Redis keys under a private prefix) is
removed on exit, Ctrl-C included. Each part has a hard time limit (--part-timeout) and
reports what finished before it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/__main__.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import batch, fairness, latency, paced, routing  # noqa: E402
from bench.report import Report, Row  # noqa: E402
from bench.scripts import all_scripts  # noqa: E402
from bench.stack import BenchEnv, Cleanup, Limits, bench_env, overrides, raise_nofile  # noqa: E402

PARTS = ("paced", "latency", "fairness", "sse", "batch", "routing")


class PartTimeout(BaseException):
    """A part ran past its hard limit. A BaseException, so no ``except Exception`` inside a
    part swallows it; the part's own cleanup unwinds as for Ctrl-C."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise PartTimeout(f"{seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated ({', '.join(PARTS)})")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run of a minute or two: small sizes everywhere (explicit flags still win)")
    parser.add_argument("--turns", help="paced: N turns at once, comma-separated (default 100,1000; quick 20)")
    parser.add_argument("--timeout", type=float,
                        help="paced: seconds each side may take (default: floor 300 s, Kortex max(60 s, 4x floor); "
                             "quick: max(30 s, 4x floor))")
    parser.add_argument("--paced-tenants", type=int, default=1,
                        help="paced: deal Kortex's N turns over this many tenants (default 1)")
    parser.add_argument("--samples", type=int, help="latency: sequential turns per side (default 100; quick 10)")
    parser.add_argument("--throughput-turns", type=int,
                        help="latency: turns at once for throughput (default 300; quick 20)")
    parser.add_argument("--flood", type=int, help="fairness: tenant A's paced turns at once (default 500; quick 40)")
    parser.add_argument("--b-samples", type=int, help="fairness: tenant B's turns idle and again during the flood "
                                                       "(default 20; quick 5)")
    parser.add_argument("--b-steady", type=int, help="fairness: at most this many B turns sent at a steady rate "
                                                      "(one every 0.25 s) through the flood (default 120; quick 20)")
    parser.add_argument("--sse-streams", type=int, help="sse: open streams (default 2000; quick 200)")
    parser.add_argument("--sse-rate", type=float, default=5.0, help="sse: events per second per stream (default 5)")
    parser.add_argument("--sse-seconds", type=float, help="sse: measured window in seconds (default 10; quick 5)")
    parser.add_argument("--batch-items", type=int, help="batch: incidents in the job (default 200; quick 20)")
    parser.add_argument("--part-timeout", type=float, help="hard limit per part in seconds (default 1800; quick 240)")
    parser.add_argument("--json", type=Path, help="also write every figure (and the raw ones) to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' logs (path printed at the end)")
    args = parser.parse_args(argv)
    quick = args.quick
    if args.paced_tenants < 1:
        parser.error("--paced-tenants must be at least 1")
    args.only = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in args.only if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s): {', '.join(unknown)}")
    args.turns = sizes(args.turns) if args.turns else ([20] if quick else [100, 1000])
    args.samples = args.samples or (10 if quick else 100)
    args.throughput_turns = args.throughput_turns or (20 if quick else 300)
    args.flood = args.flood or (40 if quick else 500)
    args.b_samples = args.b_samples or (5 if quick else 20)
    args.b_steady = args.b_steady or (20 if quick else 120)
    args.sse_streams = args.sse_streams or (200 if quick else 2000)
    args.sse_seconds = args.sse_seconds or (5.0 if quick else 10.0)
    args.batch_items = args.batch_items or (20 if quick else 200)
    args.part_timeout = args.part_timeout or (240.0 if quick else 1800.0)
    return args


def run_sse(env: BenchEnv, report: Report, args: argparse.Namespace) -> None:
    """bench/sse.py is written separately; its ``run(args)`` takes ``streams``, ``rate`` and
    ``seconds`` and returns ``floor`` and ``hub`` figures."""
    try:
        module = importlib.import_module("bench.sse")
    except ImportError:
        report.note("sse", "not available")
        return
    result: dict[str, Any] = module.run(argparse.Namespace(
        streams=args.sse_streams, rate=args.sse_rate, seconds=args.sse_seconds, quick=args.quick))
    report.raw["sse"] = result
    hub, floor = result.get("hub") or {}, result.get("floor") or {}
    streams = result.get("streams", args.sse_streams)
    report.add(
        Row("sse", f"{streams} streams x {result.get('rate', args.sse_rate):g}/s delivered", hub.get("events_per_s"),
            floor.get("events_per_s"), "events/s", ">= 0.8x"),
        Row("sse", f"{streams} streams go live", hub.get("live_s"), floor.get("live_s"), "s", "<= 5",
            f"{hub.get('live_streams', '?')}/{streams} live"),
        Row("sse", "lag p99", hub.get("lag_p99_ms"), floor.get("lag_p99_ms"), "ms"),
    )


def main(argv: list[str] | None = None) -> Report:
    args = parse(argv)
    raise_nofile()
    report = Report()
    limits = Limits(concurrent_turns=max(1000, *args.turns, args.flood + 10))
    parts: dict[str, Callable[[BenchEnv], None]] = {
        "paced": lambda env: paced.run(env, report, args.turns, args.timeout, 30.0 if args.quick else 60.0,
                                       args.paced_tenants),
        "latency": lambda env: latency.run(env, report, args.samples, args.throughput_turns),
        "fairness": lambda env: fairness.run(env, report, args.flood, args.b_samples, 30.0 if args.quick else 60.0,
                                             args.b_steady),
        "sse": lambda env: run_sse(env, report, args),
        "batch": lambda env: batch.run(env, report, args.batch_items, args.b_samples),
        "routing": lambda env: routing.run(report, 300 if args.quick else 3000),
    }
    started = time.monotonic()
    settings = overrides()  # refused before anything starts if it names what the bench owns
    if settings:
        report.note("bench", "Kortex ran with " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())))
    print(f"Kortex bench: {', '.join(args.only)}" + (" (quick)" if args.quick else ""), flush=True)
    try:
        with Cleanup() as cleanup, bench_env(cleanup, all_scripts(), limits, keep_logs=args.keep_logs) as env:
            for name in args.only:
                print(f"-- {name} ...", flush=True)
                t0 = time.monotonic()
                try:
                    with time_limit(args.part_timeout):
                        parts[name](env)
                except PartTimeout as exc:
                    report.note(name, f"TIMED OUT after {exc}; figures above are what finished")
                except Exception as exc:  # one broken part must not hide the others' figures
                    report.note(name, f"FAILED: {exc.__class__.__name__}: {str(exc)[:500]}")
                    traceback.print_exc()
                print(f"   {name} took {time.monotonic() - t0:.0f} s", flush=True)
            if args.keep_logs:
                report.note("logs", str(env.logdir))
    except KeyboardInterrupt:
        report.note("bench", "interrupted; figures above are what finished")
    print()
    print(report.render())
    print(f"\n(total {time.monotonic() - started:.0f} s; limits for the load: "
          f"{limits.concurrent_turns} concurrent turns per tenant, unlimited turns/min and streams)")
    if args.json:
        args.json.write_text(json.dumps(report.as_json(), indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
