"""Fairness: tenant B's trivial turns, one at a time, first while the stack is idle and then
while tenant A floods it with paced turns (A's concurrent-turn limit raised to cover them).
B's idle figure is taken on a warm stack (after ``WARMUP`` turns), before the flood and again
once A's turns are over, the two sets together.

B's figure is client POST -> first SSE event (and first text), p50 over its turns; the goal
(issue 9) is B's p50 during the flood <= 1.5x idle. During the flood B samples two ways at once:

- steady (the goal's row): a new B turn every ``STEADY_EVERY`` seconds, each in a session of
  its own and not waiting for the one before, from 2 s into the flood until it ends (at most
  ``steady`` turns), so the samples spread evenly over the flood's waves of claims, parks
  and answers;
- sequential (earlier stops' instrument, kept to compare): one B turn at a time. Its 20
  samples, about 0.1 s each, all fall in the flood's first seconds: over ten runs of the same
  code it said 49-401 ms where the steady samples said 0.9-6.8 s.

A B turn that waits past ``B_TURN_LIMIT`` (or the flood's own limit, if shorter) counts at that
limit (a lower bound), so a starved tenant shows as a large ratio, not as no figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from bench.client import Batch, KortexClient, TurnTiming, send_at_once, session
from bench.report import Report, Row
from bench.scripts import QUESTION
from bench.stack import BenchEnv, pct, progress

B_TURN_LIMIT = 60.0
STEADY_EVERY = 0.25  # seconds between two steady B turns during the flood
# B's turns before its idle samples. A new stack's first turns are slower: after three warm-up
# turns, B's first three idle samples took 10-11 ms and most after the tenth 5-7 ms (psycopg
# prepares a statement after five uses on a connection; the processes' paths warm up). The idle
# p50 swung 6.7-9.6 ms between runs of the same code; with these warm-up turns and the samples
# after the flood, 7.2-8.0 ms over three runs.
WARMUP = 20


async def _b_turn(client: KortexClient, sid: str, timing: TurnTiming, limit: float) -> TurnTiming:
    """One B turn, written into ``timing``; one that waits past ``limit`` says so."""
    try:
        await asyncio.wait_for(client.turn(sid, "Anything wrong?", timing=timing), limit)
    except TimeoutError:
        timing.error = f"no done within {limit:.0f} s"
    return timing


async def _b_turns(client: KortexClient, sessions: list[str], stop: asyncio.Event | None,
                   limit: float = B_TURN_LIMIT) -> list[TurnTiming]:
    out: list[TurnTiming] = []
    for sid in sessions:
        if stop is not None and stop.is_set():
            break
        out.append(await _b_turn(client, sid, TurnTiming(), limit))
    return out


async def _b_steady(client: KortexClient, sessions: list[str], stop: asyncio.Event, limit: float
                   ) -> list[TurnTiming]:
    """One B turn every STEADY_EVERY seconds until ``stop`` or the sessions run out; each is
    timed from its own POST, none waits for another."""
    timings: list[TurnTiming] = []
    tasks: list[asyncio.Future[TurnTiming]] = []
    for sid in sessions:
        if stop.is_set():
            break
        timing = TurnTiming()
        timings.append(timing)
        tasks.append(asyncio.ensure_future(_b_turn(client, sid, timing, limit)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STEADY_EVERY)
    if tasks:
        await asyncio.wait(tasks)
    return timings


def _first(timings: list[TurnTiming], attr: str, limit: float) -> list[float]:
    return [getattr(t, attr) if getattr(t, attr) is not None else limit for t in timings]


async def _measure(url: str, key_a: str, key_b: str, flood: int, samples: int, budget: float, steady: int
                   ) -> dict[str, Any]:
    async with session() as http:
        a = KortexClient(http, url, key_a)
        b = KortexClient(http, url, key_b)
        for sid in await b.create_sessions("anthropic:bench-trivial", WARMUP):
            await b.turn(sid, "warm up")
        idle = await _b_turns(b, await b.create_sessions("anthropic:bench-trivial", samples), None)
        after_sessions = await b.create_sessions("anthropic:bench-trivial", samples)
        a_sessions = await a.create_sessions("anthropic:bench-paced", flood)
        b_sessions = await b.create_sessions("anthropic:bench-trivial", samples)
        steady_sessions = await b.create_sessions("anthropic:bench-trivial", steady)
        stop = asyncio.Event()
        started = time.perf_counter()
        flood_task = asyncio.ensure_future(send_at_once(a, a_sessions, QUESTION, budget))
        flood_task.add_done_callback(lambda _t: stop.set())
        await asyncio.sleep(min(2.0, budget / 10))  # A's POSTs are in: B arrives behind a backlog
        progress(f"fairness: A floods {flood} paced turns (limit {budget:.0f} s); B sends one turn every "
                 f"{STEADY_EVERY:g} s, and one at a time")
        during, spread = await asyncio.gather(_b_turns(b, b_sessions, stop, min(B_TURN_LIMIT, budget)),
                                              _b_steady(b, steady_sessions, stop, min(B_TURN_LIMIT, budget)))
        b_span = time.perf_counter() - started
        a_batch: Batch = await flood_task
        # Idle again once A's turns are over (not if the flood was cut short: they still run):
        # the same stack, as warm as the flood found it.
        after = [] if a_batch.timed_out else await _b_turns(b, after_sessions, None)
    return {"idle": [*idle, *after], "idle_before": idle, "idle_after": after, "during": during, "steady": spread,
            "a": a_batch, "b_span_s": b_span}


def run(env: BenchEnv, report: Report, flood: int, samples: int, min_budget: float = 60.0, steady: int = 120) -> None:
    with contextlib.ExitStack() as local:
        stack = env.kortex(local, {"flood-a": True, "trivial-b": False})
        key_a, key_b = stack.keys["flood-a"], stack.keys["trivial-b"]
        budget = max(min_budget, 0.3 * flood)  # the flood's own limit; B's turns stop when it ends
        got = asyncio.run(_measure(stack.url, key_a, key_b, flood, samples, budget, steady))
    idle, during, spread, a_batch = got["idle"], got["during"], got["steady"], got["a"]
    cap = min(B_TURN_LIMIT, budget)
    figures = {
        "idle_first_event_p50_s": pct(_first(idle, "first_event", B_TURN_LIMIT), 0.5),
        "idle_before_first_event_p50_s": pct(_first(got["idle_before"], "first_event", B_TURN_LIMIT), 0.5),
        "idle_after_first_event_p50_s": pct(_first(got["idle_after"], "first_event", B_TURN_LIMIT), 0.5),
        "flood_first_event_p50_s": pct(_first(during, "first_event", cap), 0.5),
        "steady_first_event_p50_s": pct(_first(spread, "first_event", cap), 0.5),
        "steady_first_event_p90_s": pct(_first(spread, "first_event", cap), 0.9),
        "steady_first_text_p50_s": pct(_first(spread, "first_text", cap), 0.5),
        # where B's wait is: the POST's answer, the stream's opening, then the first event
        "idle_posted_p50_s": pct(_first(idle, "posted", B_TURN_LIMIT), 0.5),
        "idle_opened_p50_s": pct(_first(idle, "opened", B_TURN_LIMIT), 0.5),
        "steady_posted_p50_s": pct(_first(spread, "posted", cap), 0.5),
        "steady_opened_p50_s": pct(_first(spread, "opened", cap), 0.5),
        "b_steady_turns": len(spread), "b_steady_errors": sum(1 for t in spread if t.error),
        "idle_first_text_p50_s": pct(_first(idle, "first_text", B_TURN_LIMIT), 0.5),
        "flood_first_text_p50_s": pct(_first(during, "first_text", cap), 0.5),
        "b_idle_turns": len(idle), "b_flood_turns": len(during),
        "b_flood_timeouts": sum(1 for t in during if t.error),
        "a_turns": flood, "a_finished": len(a_batch.finished), "a_wall_s": a_batch.wall,
    }
    report.raw["fairness"] = figures
    note = f"B: {len(during)} turns one at a time" + (f", {figures['b_flood_timeouts']} failed or cut at {cap:.0f} s"
                                                      if figures["b_flood_timeouts"] else "")
    steady_note = f"B: {len(spread)} turns, one every {STEADY_EVERY:g} s" + (
        f", {figures['b_steady_errors']} failed or cut at {cap:.0f} s" if figures["b_steady_errors"] else "")
    report.add(
        Row("fairness", "B first event p50 (flood/idle)", _ms(figures["steady_first_event_p50_s"]),
            _ms(figures["idle_first_event_p50_s"]), "ms", "<= 1.5x", steady_note),
        Row("fairness", "B first event p90 (flood/idle)", _ms(figures["steady_first_event_p90_s"]),
            _ms(figures["idle_first_event_p50_s"]), "ms", note="against idle p50"),
        Row("fairness", "B first text p50 (flood/idle)", _ms(figures["steady_first_text_p50_s"]),
            _ms(figures["idle_first_text_p50_s"]), "ms"),
        Row("fairness", "sequential B first event p50", _ms(figures["flood_first_event_p50_s"]),
            _ms(figures["idle_first_event_p50_s"]), "ms", note=note),
    )
    a_took = f", the last after {a_batch.wall:.1f} s" if a_batch.wall is not None else ""
    report.note("fairness", f"A flooded {flood} paced turns at once ({figures['a_finished']} finished within the "
                            f"flood's limit{a_took}); B sent {samples} trivial turns idle one at a time, then during the flood "
                            f"{len(spread)} one every {STEADY_EVERY:g} s and {len(during)} one at a time, then "
                            f"{len(got['idle_after'])} idle again")
    report.note("fairness", "B idle first event p50 before / after the flood: {} / {} ms".format(
        *("-" if w is None else f"{w:.1f}" for w in (_ms(figures["idle_before_first_event_p50_s"]),
                                                     _ms(figures["idle_after_first_event_p50_s"])))))
    waits = [_ms(figures[k]) for k in ("idle_posted_p50_s", "steady_posted_p50_s", "idle_opened_p50_s",
                                       "steady_opened_p50_s", "idle_first_event_p50_s", "steady_first_event_p50_s")]
    report.note("fairness", "B p50 idle / during the flood (steady): POST answered {} / {} ms, stream open {} / {} ms, "
                            "first event {} / {} ms".format(*("-" if w is None else f"{w:.1f}" for w in waits)))
    errors = a_batch.errors()
    if errors:
        report.note("fairness", f"A errors: {'; '.join(errors[:3])}")
    b_errors = sorted({str(t.error) for t in [*during, *spread] if t.error})
    if b_errors:
        report.note("fairness", f"B errors: {'; '.join(b_errors[:3])}")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
