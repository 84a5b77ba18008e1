"""A turns worker paused past its lease or killed mid-step: the step runs again elsewhere, the
paused attempt cannot write once its successor has begun, and a client sees one answer.

Each test runs its own stack (a throwaway database, a private Redis prefix, turns workers as
the README starts them) so pausing and killing workers touches nothing else."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kortex.storage import audit
from kortex.turns import chat, watchdog
from kortex_cli.attempts import AttemptFilter
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL, Service, service_env
from tests.integration.redisproc import kortex_command, private_database
from workers.app import make_celery
from workers.dispatch import dispatch

LEASE = 1.5
ANSWER = "".join(f"tok{i:02d} " for i in range(1, 21))  # tests/scripts/long_text.json: 20 pieces, 200 ms apart


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prefix = f"kxfault-{uuid.uuid4().hex[:8]}"
    services: list[Service] = []
    # A database of its own: the watchdog sweeps system-wide, and nobody else's turns belong here.
    with private_database(PG_ADMIN) as url:
        # requeue_after is long: only the lapsed lease hands the step on, as after a real pause.
        turn = {"step_lease": LEASE, "requeue_after": 600, "text_flush_ms": 0}
        h = Harness(make_settings(tmp_path, url, redis_url=REDIS_URL, redis_prefix=prefix, turn=turn))
        env = service_env(url, prefix, KORTEX_TURN__STEP_LEASE=str(LEASE), KORTEX_TURN__REQUEUE_AFTER="600")

        def start(label: str, **extra: str) -> Service:
            service = Service(label, kortex_command("worker", "--queues", "turns"), {**env, **extra},
                              tmp_path / f"{label}.log")
            services.append(service)
            service.wait_for(lambda: " ready." in service.output())
            return service

        try:
            yield {"h": h, "app": make_celery(h.settings), "start": start, "url": url, "prefix": prefix,
                   "tmp": tmp_path}
        finally:
            for service in services:
                if service.proc.poll() is None:
                    os.killpg(service.proc.pid, signal.SIGCONT)
                service.stop()
            for key in h.k.redis.scan_iter(f"{prefix}:*"):
                h.k.redis.delete(key)
            h.close()


def _post(stack: dict[str, Any], name: str = "faults") -> tuple[str, str]:
    h = stack["h"]
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, name, "scripted:long_text")
    posted = chat.post_message(h.k, tenant, session.id, "go")
    dispatch(stack["app"], posted.handoff)
    return tenant, posted.turn.id


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _bodies(h: Harness, turn_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, json.loads(e.data)) for e in h.events(turn_id)]


def _client_text(events: list[tuple[str, dict[str, Any]]]) -> str:
    """The answer as a client assembles it: superseded attempts dropped, a re-run step's text
    started afresh."""
    attempts = AttemptFilter()
    text: dict[int, str] = {}
    for event, body in events:
        if not attempts.accept(event, body):
            continue
        if attempts.rerun_step is not None:
            text[attempts.rerun_step] = ""
        if event == "text":
            text[body["step"]] = text.get(body["step"], "") + body["delta"]
    return "".join(text[s] for s in sorted(text))


def _hand_on_lapsed(stack: dict[str, Any], turn_id: str) -> None:
    """What beat does every few seconds: the step whose lease lapsed goes back on the queue."""
    h = stack["h"]
    time.sleep(LEASE + 0.5)
    report = watchdog.sweep(h.k)
    assert [s.turn_id for s in report.handoff.steps] == [turn_id]
    dispatch(stack["app"], report.handoff)


def test_a_paused_worker_cannot_write_after_its_step_was_handed_on(stack: dict[str, Any]) -> None:
    h = stack["h"]
    first = stack["start"]("worker-a")
    tenant, turn_id = _post(stack)
    _wait(lambda: sum(t == "text" for t, _ in _bodies(h, turn_id)) >= 3, 20, "the step never streamed")
    os.killpg(first.proc.pid, signal.SIGSTOP)  # a long GC pause, a stalled VM: it stops renewing
    _hand_on_lapsed(stack, turn_id)
    stack["start"]("worker-b")
    _wait(lambda: chat.get_turn(h.k, tenant, turn_id).status == "done", 30, "the re-run step never finished")
    os.killpg(first.proc.pid, signal.SIGCONT)  # it wakes mid-stream, sure it still has the step
    _wait(lambda: any(r["payload"].get("error_code") == "cancelled" for r in _llm_rows(h, turn_id)), 15,
          "the woken attempt never stopped")
    events = _bodies(h, turn_id)
    attempts = [body["attempt"] for _, body in events]
    second = attempts.index(max(attempts))
    assert max(attempts) > min(attempts) and all(a == max(attempts) for a in attempts[second:])  # fenced
    assert [body["seq"] for _, body in events] == list(range(1, len(events) + 1))
    assert events[-1][0] == "done" and events[-1][1]["status"] == "done"
    assert _client_text(events) == ANSWER  # one answer, no "tok05 tok05"
    assert first.proc.poll() is None  # the woken worker carries on
    rows = _llm_rows(h, turn_id)
    assert [r["ok"] for r in rows].count(True) == 1
    assert [r["payload"].get("error_code") for r in rows if not r["ok"]].count("worker_lost") == 1


def test_a_killed_worker_s_step_runs_again_and_the_client_sees_one_answer(stack: dict[str, Any]) -> None:
    h = stack["h"]
    first = stack["start"]("worker-a")
    tenant, turn_id = _post(stack)
    _wait(lambda: sum(t == "text" for t, _ in _bodies(h, turn_id)) >= 3, 20, "the step never streamed")
    os.killpg(first.proc.pid, signal.SIGKILL)
    _hand_on_lapsed(stack, turn_id)
    stack["start"]("worker-b")
    _wait(lambda: chat.get_turn(h.k, tenant, turn_id).status == "done", 30, "the re-run step never finished")
    events = _bodies(h, turn_id)
    assert [t for t, _ in events].count("turn") == 2 and events[-1][0] == "done"
    assert _client_text(events) == ANSWER
    assert chat.get_turn(h.k, tenant, turn_id).attempt == 2
    lost = [r for r in _llm_rows(h, turn_id) if not r["ok"]]
    assert [r["payload"]["error_code"] for r in lost] == ["worker_lost"]  # the killed call has its row


def _llm_rows(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    with h.k.db.connect() as conn:
        return [r for r in audit.list_for_turn(conn, h.tenant("acme"), turn_id) if r["kind"] == "llm_call"]


def test_a_killed_worker_s_waiting_step_is_recovered_though_its_message_is_gone(stack: dict[str, Any]) -> None:
    """Step messages are taken without an ack: a step that was only waiting in the killed
    process's engine has no message left anywhere. Its queued turn stops being touched, and
    the watchdog hands it on; the client sees one answer for each turn."""
    h = stack["h"]
    first = stack["start"]("worker-a", KORTEX_TURN__MAX_INFLIGHT_STEPS="1")
    tenant, streaming = _post(stack, "first")
    _wait(lambda: sum(t == "text" for t, _ in _bodies(h, streaming)) >= 2, 20, "the step never streamed")
    _, waiting = _post(stack, "second")
    time.sleep(1.0)  # taken off the queue into the engine's waiting room
    assert chat.get_turn(h.k, tenant, waiting).status == "queued" and not _bodies(h, waiting)
    assert h.k.redis.llen(f"{stack['prefix']}:celery:turns") == 0  # no message left for it
    os.killpg(first.proc.pid, signal.SIGKILL)
    time.sleep(LEASE + 1.5)
    # The beat of this deployment, with a short requeue_after: an untouched queued turn is lost.
    sweeper = Harness(make_settings(stack["tmp"] / "beat", stack["url"], redis_url=REDIS_URL,
                                    redis_prefix=stack["prefix"], turn={"step_lease": LEASE, "requeue_after": 1}))
    try:
        report = watchdog.sweep(sweeper.k)
    finally:
        sweeper.close()
    assert sorted(s.turn_id for s in report.handoff.steps) == sorted([streaming, waiting])
    dispatch(stack["app"], report.handoff)
    stack["start"]("worker-b")
    for turn_id in (streaming, waiting):
        _wait(lambda t=turn_id: chat.get_turn(h.k, tenant, t).status == "done", 30, "a turn never finished")
        assert _client_text(_bodies(h, turn_id)) == ANSWER
