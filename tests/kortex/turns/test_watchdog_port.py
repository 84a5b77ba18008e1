"""The sweep asks its queue port before re-enqueueing: a backlog means the work is waiting, an
unreadable broker means wait for the next sweep, an unknown depth means re-enqueue (a duplicate
is harmless, a lost turn is not). The loop sweeps only while it leads."""

from __future__ import annotations

import threading

from kortex.turns import chat, watchdog
from kortex.turns.handoff import Handoff
from kortex.turns.ports import Work
from tests.conftest import Harness


class FakeQueue:
    def __init__(self, depth: int | None | Exception) -> None:
        self.depth = depth
        self.sent: list[Handoff] = []

    def dispatch(self, handoff: Handoff) -> None:
        self.sent.append(handoff)

    def backlog(self, work: Work) -> int | None:
        if isinstance(self.depth, Exception):
            raise self.depth
        return self.depth


def _lost_turn(h: Harness) -> str:
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "t", "scripted:text_only")
    return chat.post_message(h.k, tenant, session.id, "never enqueued").turn.id


def test_a_backlog_holds_back_re_enqueueing_and_an_empty_queue_does_not(harness_factory) -> None:
    h = harness_factory(turn={"requeue_after": 0})
    turn_id = _lost_turn(h)
    assert watchdog.sweep(h.k, FakeQueue(3)).requeued_steps == 0
    assert watchdog.sweep(h.k, FakeQueue(ConnectionError("broker down"))).requeued_steps == 0
    report = watchdog.sweep(h.k, FakeQueue(0))
    assert [s.turn_id for s in report.handoff.steps] == [turn_id]


def test_an_unknown_depth_re_enqueues(harness_factory) -> None:
    h = harness_factory(turn={"requeue_after": 0})
    turn_id = _lost_turn(h)
    assert [s.turn_id for s in watchdog.sweep(h.k, FakeQueue(None)).handoff.steps] == [turn_id]


class Follower:
    def __init__(self, stop: threading.Event, leads_after: int) -> None:
        self.stop, self.asked, self.leads_after, self.released = stop, 0, leads_after, False

    def ensure(self) -> bool:
        self.asked += 1
        if self.asked > self.leads_after + 1:
            self.stop.set()
        return self.asked > self.leads_after

    def release(self) -> None:
        self.released = True


def test_the_loop_sweeps_only_while_it_leads_and_releases_at_the_end(harness_factory) -> None:
    h = harness_factory(turn={"requeue_after": 0})
    _lost_turn(h)
    stop = threading.Event()
    leader = Follower(stop, leads_after=2)
    queue = FakeQueue(0)
    watchdog.run_watchdog(h.k, queue, leader, every=0, stop=stop)
    assert leader.asked == 4 and leader.released
    assert len(queue.sent) == 2  # the two sweeps it led: the first re-enqueued the lost turn
    assert len(queue.sent[0].steps) == 1


class Unreachable(Follower):
    def ensure(self) -> bool:
        self.asked += 1
        if self.asked > 3:
            self.stop.set()
        if self.asked == 2:
            raise ConnectionError("the database went away")
        return self.asked > self.leads_after


def test_the_heartbeat_beats_for_leader_and_standby_but_not_when_the_database_is_out(harness_factory) -> None:
    h = harness_factory()
    stop = threading.Event()
    beats: list[int] = []
    leader = Unreachable(stop, leads_after=2)  # 1: standby, 2: outage, 3 and 4: leads
    watchdog.run_watchdog(h.k, FakeQueue(0), leader, every=0, stop=stop, alive=lambda: beats.append(leader.asked))
    assert beats == [1, 3, 4]


def test_a_watchdog_with_nothing_to_do_writes_no_info_line(harness_factory, caplog) -> None:
    import logging
    h = harness_factory()
    stop = threading.Event()
    leader = Follower(stop, leads_after=0)  # leads from the first interval; three sweeps, all idle
    with caplog.at_level(logging.INFO):
        watchdog.run_watchdog(h.k, FakeQueue(0), leader, every=0, stop=stop)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_a_failing_proposal_sweep_does_not_hold_back_the_re_enqueued_steps(harness_factory, monkeypatch) -> None:
    from kortex.errors import StorageError

    h = harness_factory(turn={"requeue_after": 0})
    turn_id = _lost_turn(h)

    def broken(now):  # type: ignore[no-untyped-def]
        raise StorageError("the proposals table is locked")

    monkeypatch.setattr(h.k.proposals, "expire_due", broken)
    report = watchdog.sweep(h.k, FakeQueue(0))
    assert [s.turn_id for s in report.handoff.steps] == [turn_id] and report.expired_proposals == 0
