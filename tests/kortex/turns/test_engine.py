"""The step engine: bounded in flight, round robin across tenants, backpressure, and steps
handed back when the process stops."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

import kortex.turns.step as step_module
from kortex.errors import KortexError, StorageError
from kortex.turns import chat
from kortex.turns.engine import EngineBusy, StepEngine, _Job
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


def test_a_tenant_alone_may_use_every_slot(harness_factory) -> None:
    """The share is a reservation for other tenants: with nobody else waiting, one tenant's
    steps fill every slot (a lone tenant lost a quarter of its streaming capacity)."""
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
    assert peak == 4 and all(isinstance(o, Handoff) for o in rec.outcomes)


def test_while_another_tenant_waits_a_tenant_holds_no_more_than_its_share(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 4, "max_inflight_per_tenant": 2, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a, b = h.tenant("a"), h.tenant("b")
    flood, others = _post(h, a, "scripted:slow_text", 6), _post(h, b, "scripted:slow_text", 6)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 12
    peak_a = 0
    with engine._cv:  # both tenants' steps wait before the first slot is given
        for s in flood + others:
            engine._enqueue_locked(_Job(s, rec))
    engine.k.loop.loop.call_soon_threadsafe(engine._start)
    engine._started = True
    engine.k.loop.loop.call_soon_threadsafe(engine._pump)
    while not rec.done.is_set():
        with engine._cv:
            if engine._waiting.get(b):  # B still has steps waiting for a place
                peak_a = max(peak_a, engine._busy.get(a, 0))
        time.sleep(0.005)
    engine.close(0)
    assert peak_a == 2 and all(isinstance(o, Handoff) for o in rec.outcomes)


def _until(condition: Any, seconds: float = 5.0, every: float = 0.01) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(every)


def _governed(harness_factory: Any) -> Any:
    """Room for 10 steps, a governor whose limit starts at its floor of 2 and whose lag target
    no loop misses."""
    return harness_factory(turn={"max_inflight_steps": 10, "min_inflight_steps": 2, "loop_lag_target_ms": 10_000,
                                 "text_flush_ms": 0},
                           llm={"budget": {"max_concurrent_turns_per_tenant": 50}})


def test_at_the_governors_limit_the_flood_waits_and_a_newcomer_is_taken(harness_factory) -> None:
    """A light tenant (B) and a heavy one (A, 16 steps at once to B's one): the governor's limit (here
    held at 2) keeps A's further steps waiting, but B, holding nothing, is below its fair share
    of the limit and starts at once."""
    h = _governed(harness_factory)
    a, b = h.tenant("a"), h.tenant("b")
    flood = _post(h, a, "scripted:slow_text", 16)
    earlier, newcomer = _post(h, b, "scripted:slow_text", 2)
    engine = StepEngine(h.k)
    assert engine.governor is not None
    engine.governor.window = 10**9  # no adjustment during the test: the limit stays where it starts
    rec = _Recorder()
    rec.expected = 17
    try:
        engine.run(earlier, 30)
        assert engine.limit == 10  # alone, B had the whole bound
        with engine._cv:  # A's flood arrives at once
            for s in flood:
                engine._enqueue_locked(_Job(s, rec))
        assert engine.limit == 2  # 16 steps held to 1: unequal, the governor holds the flood
        engine.k.loop.loop.call_soon_threadsafe(engine._pump)
        _until(lambda: engine.inflight >= 2)
        time.sleep(0.2)
        assert (engine.inflight, engine.waiting) == (2, 14)
        engine.submit(newcomer, rec)
        _until(lambda: engine.inflight >= 3)  # B went past the limit, ahead of A's waiting steps
        assert engine.waiting == 14 and engine._busy == {a: 2, b: 1}
    finally:
        engine.close(0)


def test_once_the_light_tenant_has_gone_quiet_the_steps_held_back_start_at_once(harness_factory) -> None:
    """The governor held A's flood for B's sake; when B's last peak leaves the mix's horizon, A's
    waiting steps start within a look at the mix, not when one of A's long steps ends."""
    h = _governed(harness_factory)
    a, b = h.tenant("a"), h.tenant("b")
    flood = _post(h, a, "scripted:long_text", 16)  # each step streams for 4 s
    (light,) = _post(h, b, "scripted:long_text", 1)
    engine = StepEngine(h.k)
    assert engine.governor is not None and engine._mix is not None
    engine.governor.window = 10**9  # the limit stays at its floor of 2 while the mix is unequal
    engine._mix.horizon = 0.6  # what the mix remembers: a minute by default
    rec = _Recorder()
    rec.expected = 17
    try:
        engine.submit(light, rec)
        _until(lambda: engine.inflight >= 1)
        with engine._cv:
            for s in flood:
                engine._enqueue_locked(_Job(s, rec))
        assert engine.limit == 2
        engine.k.loop.loop.call_soon_threadsafe(engine._pump)
        _until(lambda: engine.inflight >= 2)
        time.sleep(0.2)
        assert (engine.inflight, engine.waiting) == (2, 15)  # B's step and one of A's; A's share is 1
        # B's peak leaves the horizon: the tenants are no longer unequal, and the flood starts
        # (well before A's first step ends, 4 s after it began). With nobody else waiting, A
        # takes every slot of the hard bound that B's step leaves.
        _until(lambda: engine.limit == 10 and engine._busy.get(a) == 9, seconds=2.5)
        assert (engine.inflight, engine.waiting) == (10, 7)
    finally:
        engine.close(0)


@pytest.mark.parametrize("other_tenant_before", [False, True])
def test_tenants_alone_or_alike_are_not_held_back_by_the_governor(harness_factory, other_tenant_before) -> None:
    """Alone, or beside a tenant that held a step too (5 to 1: not a light tenant to protect),
    a tenant's steps all start at once, past the governor's floor of 2."""
    h = _governed(harness_factory)
    a, b = h.tenant("a"), h.tenant("b")
    flood = _post(h, a, "scripted:slow_text", 5)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 5
    try:
        if other_tenant_before:
            engine.run(_post(h, b, "scripted:text_only", 1)[0], 30)
        for s in flood:
            engine.submit(s, rec)
        assert engine.limit == 10
        _until(lambda: engine.inflight >= 5)
        assert rec.done.wait(60)
    finally:
        engine.close(0)
    assert all(isinstance(o, Handoff) for o in rec.outcomes)


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


def test_a_worker_slot_is_never_held_by_a_step_without_room(harness_factory) -> None:
    """The Celery task submits without blocking: past the waiting room, or past its tenant's
    share of it, the step is refused at once (the task offers it again later), while another
    tenant's step still gets in to wait for its fair pick."""
    h = harness_factory(turn={"max_inflight_steps": 1, "max_waiting_steps": 4, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a, b = h.tenant("a"), h.tenant("b")
    flood = _post(h, a, "scripted:slow_text", 5)
    (other,) = _post(h, b, "scripted:text_only", 1)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 5
    try:
        engine.submit(flood[0], rec, block=False)
        deadline = time.monotonic() + 5
        while engine.inflight < 1:  # the first one is streaming; the rest wait
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for s in flood[1:4]:
            engine.submit(s, rec, block=False)  # a's share of a room of 4 is 3
        with pytest.raises(EngineBusy):
            engine.submit(flood[4], rec, block=False)
        engine.submit(other, rec, block=False)  # b still gets a place
        with pytest.raises(EngineBusy):
            engine.submit(flood[4], rec, block=False)  # and now the room is full
        assert rec.done.wait(60)
    finally:
        engine.close(0)
    assert all(isinstance(o, Handoff) for o in rec.outcomes)


def test_a_step_whose_closing_writes_fail_stops_holding_its_lease(harness_factory, monkeypatch) -> None:
    """The database refuses the write that fails the turn: the step ends with that error, the
    engine no longer renews its lease (so it lapses and the watchdog runs the step again) and
    does not retry a step it already claimed."""
    h = harness_factory(turn={"text_flush_ms": 0})
    a = h.tenant("a")
    (s,) = _post(h, a, "scripted:fail", 1)
    calls = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        raise StorageError("the database went away")

    monkeypatch.setattr(step_module, "_fail", refuse)
    engine = StepEngine(h.k)
    try:
        with pytest.raises(StorageError):
            engine.run(s, timeout=30)
        assert engine._holds == {} and engine.inflight == 0 and not engine._retrying
        assert 1 <= len(calls) <= 2  # the failure path tries once more, then gives up
    finally:
        engine.close(0)
    assert chat.get_turn(h.k, a, s.turn_id).status == "running"  # left to its lease and the watchdog


def test_stopping_gives_unfinished_steps_back_at_once(harness_factory) -> None:
    h = harness_factory(turn={"max_inflight_steps": 1, "text_flush_ms": 0},
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a = h.tenant("a")
    running, waiting = _post(h, a, "scripted:stall", 2)  # the first stalls in its model call
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 2
    engine.submit(running, rec)
    engine.submit(waiting, rec)
    deadline = time.monotonic() + 5
    while not any(e.type == "turn" for e in h.events(running.turn_id)):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    left = engine.close(grace=0.2)
    # The waiting one never started; the running one was claimed, then released. Both come
    # back to the caller, which puts them on the queue; another worker runs them now.
    assert left == [waiting, running]
    assert chat.get_turn(h.k, a, running.turn_id).status == "queued"
    assert rec.done.wait(10)  # nobody is left waiting on a step the engine will not run
    assert all(isinstance(o, KortexError) and o.code == "shutting_down" for o in rec.outcomes)
    with pytest.raises(KortexError, match="stopping"):
        engine.submit(waiting, rec)


def test_a_claim_whose_reads_fail_is_undone_and_the_step_runs_again(harness_factory, monkeypatch) -> None:
    """The claim commits on its own; the history read after it fails once, with the driver's
    own error (translated to StorageError only when the connection block exits). The claim is
    undone (queued again, its attempt too), so the engine's retry claims the step as if the
    claim had rolled back, and the turn ends normally instead of waiting out a lease that
    nobody holds."""
    h = harness_factory(turn={"text_flush_ms": 0})
    a = h.tenant("a")
    (s,) = _post(h, a, "scripted:text_only", 1)
    real = step_module.chats.load_history
    failures: list[str] = []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(chat.get_turn(h.k, a, s.turn_id).status)  # claimed by then
            raise OperationalError("SELECT", {}, Exception("the database went away"))
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module.chats, "load_history", flaky)
    engine = StepEngine(h.k)
    try:
        engine.run(s, timeout=30)
    finally:
        engine.close(0)
    turn = chat.get_turn(h.k, a, s.turn_id)
    assert failures == ["running"]
    assert turn.status == "done" and turn.attempt == 1  # the undone claim left no attempt behind


def test_a_step_without_room_is_kept_touched_offered_again_and_handed_back_at_close(harness_factory) -> None:
    """The Celery task defers what ``submit`` refused: the engine keeps it (touched like a
    waiting step, so the watchdog never takes it for lost), starts it once there is room, and
    hands it back with the waiting ones if the process stops first."""
    from sqlalchemy import select

    from kortex.storage.schema import turns as turns_table

    h = harness_factory(turn={"max_inflight_steps": 1, "max_waiting_steps": 1, "text_flush_ms": 0,
                              "step_lease": 0.9},  # the renewer touches every 0.3 s
                        llm={"budget": {"max_concurrent_turns_per_tenant": 50}})
    a = h.tenant("a")
    steps = _post(h, a, "scripted:slow_text", 4)
    engine = StepEngine(h.k)
    rec = _Recorder()
    rec.expected = 3

    def touched(turn_id: str) -> Any:
        with h.k.db.connect() as conn:
            return conn.scalar(select(turns_table.c.updated_at).where(turns_table.c.id == turn_id))

    try:
        engine.submit(steps[0], rec, block=False)
        _until(lambda: engine.inflight == 1)
        engine.submit(steps[1], rec, block=False)  # the one waiting place
        with pytest.raises(EngineBusy):
            engine.submit(steps[2], rec, block=False)
        engine.defer(steps[2], rec, 0.05)
        assert engine.deferred == 1
        before = touched(steps[2].turn_id)
        _until(lambda: touched(steps[2].turn_id) != before, seconds=3)  # held, not lost
        assert rec.done.wait(30)  # all three ran, the deferred one once there was room
        assert engine.deferred == 0 and all(isinstance(o, Handoff) for o in rec.outcomes)
        # Full again, and the process stops before the deferred step finds room: it is handed back.
        engine.submit(steps[3], rec, block=False)
        _until(lambda: engine.inflight == 1)
        again = _post(h, a, "scripted:slow_text", 2)
        engine.submit(again[0], rec, block=False)
        engine.defer(again[1], rec, 60)
    finally:
        left = engine.close(0)
    assert again[1] in left and again[0] in left
