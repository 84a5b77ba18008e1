"""The step engine: bounded in flight, round robin across tenants, backpressure, and steps
handed back when the process stops."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import kortex.turns.step as step_module
from kortex.errors import KortexError
from kortex.turns import chat
from kortex.turns.engine import StepEngine, _Job
from kortex.turns.handoff import Handoff, StepDispatch


class _Recorder:
    def __init__(self) -> None:
        self.outcomes: list[Any] = []
        self.done = threading.Event()
        self.expected = 0

    def __call__(self, outcome: Any) -> None:
        self.outcomes.append(outcome)
        if len(self.outcomes) >= self.expected:
            self.done.set()


def _post(h: Any, tenant: str, model: str, n: int) -> list[StepDispatch]:
    steps = []
    for i in range(n):
        session = chat.create_session(h.k, tenant, f"s{i}", model)
        steps.extend(chat.post_message(h.k, tenant, session.id, "go").handoff.steps)
    return steps


def test_steps_start_round_robin_across_tenants_whatever_order_they_came_in(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 1, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a, b = h.tenant("a"), h.tenant("b")
    flood = _post(h, a, "scripted:text_only", 6)
    late = _post(h, b, "scripted:text_only", 2)
    engine = StepEngine(h.k)
    started: list[str] = []  # the order in which steps are claimed
    real = step_module._claim

    def spy(k: Any, tenant_id: str, turn_id: str, step: int) -> Any:
        started.append(tenant_id)
        return real(k, tenant_id, turn_id, step)

    step_module._claim = spy
    try:
        rec = _Recorder()
        rec.expected = 8
        with engine._cv:  # everything arrives before the first slot frees: A's six, then B's two
            for s in flood + late:
                engine._enqueue_locked(_Job(s, rec))
        engine.k.loop.loop.call_soon_threadsafe(engine._pump)
        assert rec.done.wait(30)
    finally:
        step_module._claim = real
        engine.close(0)
    assert all(isinstance(o, Handoff) for o in rec.outcomes)
    # One slot: A's first, then B, A, B, and A's rest, not B after all of A.
    assert started[:4] == [a, b, a, b] and started[4:] == [a] * 4


def test_a_tenant_never_holds_more_than_its_share_of_slots(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 4, "max_inflight_per_tenant": 2, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a = h.tenant("a")
    steps = _post(h, a, "scripted:slow_text", 5)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = len(steps)
    peak = 0
    for s in steps:
        engine.submit(s, rec)
    while not rec.done.is_set():
        peak = max(peak, engine.inflight)
        time.sleep(0.005)
    engine.close(0)
    assert peak == 2 and all(isinstance(o, Handoff) for o in rec.outcomes)


def test_submit_blocks_while_the_process_holds_its_limit_of_waiting_steps(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 1, "max_waiting_steps": 1, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a = h.tenant("a")
    steps = _post(h, a, "scripted:slow_text", 3)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 3
    engine.submit(steps[0], rec)  # runs
    time.sleep(0.2)
    engine.submit(steps[1], rec)  # waits in the process
    third = threading.Thread(target=engine.submit, args=(steps[2], rec))
    third.start()
    time.sleep(0.2)
    assert third.is_alive()  # the Celery thread holding the third message is held back
    assert rec.done.wait(30)
    third.join(5)
    engine.close(0)
    assert not third.is_alive() and len(rec.outcomes) == 3


def test_stopping_gives_unfinished_steps_back_at_once(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 1, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a = h.tenant("a")
    running, waiting = _post(h, a, "scripted:stall", 2)  # the first stalls in its model call
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 1
    engine.submit(running, rec)
    engine.submit(waiting, rec)
    deadline = time.monotonic() + 5
    while not any(e.type == "turn" for e in h.events(running.turn_id)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    left = engine.close(grace=0.2)
    assert left == [waiting]  # never started: the caller puts it back on the queue
    assert rec.done.wait(10)
    (outcome,) = rec.outcomes
    assert outcome.steps == (running,)  # claimed, then released: another worker runs it now
    assert chat.get_turn(h.k, a, running.turn_id).status == "queued"
    with pytest.raises(KortexError, match="stopping"):
        engine.submit(waiting, rec)
