"""Workers survive a Redis restart mid-task: a private redis-server (broker and stream store)
is killed with SIGKILL while a step or a tool call runs, restarted on the same port, and the
worker process must still be alive and finish the turn."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from kortex.storage.schema import turns
from kortex.testing.fakellm import FakeLLM
from kortex.turns import chat
from kortex.turns.handoff import StepDispatch
from kortex_cli.attempts import AttemptFilter
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, Service, provider_env, service_env
from tests.integration.redisproc import RedisServer, kortex_command, private_database
from workers.app import make_celery
from workers.dispatch import send_step

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """Not the session's database: its watchdog would sweep this module's turns too."""
    with private_database(PG_ADMIN) as url:
        yield url


@pytest.fixture
def harness(pg_url: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Harness]:
    settings = make_settings(tmp_path, pg_url, redis_url=redis_server.url, redis_prefix="kxrestart")
    h = Harness(settings)
    yield h
    h.close()


def _env(pg_url: str, redis_server: RedisServer, fake_llm: FakeLLM) -> dict[str, str]:
    return service_env(pg_url, "kxrestart", KORTEX_REDIS_URL=redis_server.url, **provider_env(fake_llm.url),
                       KORTEX_LLM__TOOLS__DEBUG_SLEEP__TIMEOUT="10",  # the 2.5 s sleep outlasts the blip
                       KORTEX_TURN__REQUEUE_AFTER="2")


class Stack:
    """A worker as the README runs it, and the watchdog process beside it."""

    def __init__(self, env: dict[str, str], tmp_path: Path, pool: str, queues: str = "turns,tools") -> None:
        argv = kortex_command("worker", "--queues", queues, "--pool", pool, "--loglevel", "INFO")
        self.worker = Service(f"worker ({pool})", argv, env, tmp_path / f"worker-{pool}.log")
        self.beat = Service("watchdog", kortex_command("beat"), env, tmp_path / "beat.log")
        self.worker.wait_for(lambda: " ready." in self.worker.output())
        self.beat.wait_for(lambda: "took the lead" in self.beat.output())

    def stop(self) -> None:
        self.beat.stop()
        self.worker.stop()


def _start_turn(h: Harness, model: str) -> str:
    tenant_id = h.tenant("restart")
    session = chat.create_session(h.k, tenant_id, "restart", model)
    posted = chat.post_message(h.k, tenant_id, session.id, "go")
    send_step(make_celery(h.settings), StepDispatch(tenant_id, posted.turn.id, 0))
    return posted.turn.id


def _wait(predicate, what: str, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # Redis may be down for a moment: ask again
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _kinds(h: Harness, turn_id: str) -> list[str]:
    return [e.type for e in h.events(turn_id)]


def _client_text(events: list[tuple[str, dict]]) -> str:
    seen, by_step = AttemptFilter(), dict[int, str]()
    for kind, data in events:
        if not seen.accept(kind, data):
            continue
        if seen.rerun_step is not None:
            by_step[seen.rerun_step] = ""  # the step starts over
        if kind == "text":
            by_step[data["step"]] = by_step.get(data["step"], "") + data["delta"]
    return "".join(by_step[step] for step in sorted(by_step))


def _status(h: Harness, turn_id: str) -> str:
    with h.k.db.connect() as conn:
        return str(conn.scalar(select(turns.c.status).where(turns.c.id == turn_id)))


def _finished(h: Harness, turn_id: str) -> None:
    """The turn ended, and its ``done`` is in the stream: it is appended just after the commit
    that ended the turn, so a read right after the status changed could miss it."""
    _wait(lambda: _status(h, turn_id) in ("done", "failed"), "the turn to finish")
    _wait(lambda: "done" in _kinds(h, turn_id), "the done event")


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_worker_survives_a_redis_restart_while_a_tool_runs(pg_url, fake_llm, redis_server, harness, tmp_path,
                                                           pool) -> None:
    stack = Stack(_env(pg_url, redis_server, fake_llm), tmp_path, pool)
    worker = stack.worker
    try:
        turn_id = _start_turn(harness, "scripted:slow_tool")
        # The tool sleeps 2.5 s: kill Redis once its call has been published (the tool task is
        # delivered or running). A message whose restore fails while Redis is down is stranded
        # until the visibility timeout; the watchdog re-enqueues that lost hand-off.
        _wait(lambda: "tool_call" in _kinds(harness, turn_id), "the tool call")
        redis_server.kill()
        redis_server.start()
        _finished(harness, turn_id)
        assert worker.proc.poll() is None, worker.output()[-4000:]
        assert "Unrecoverable error" not in worker.output()
        assert stack.beat.proc.poll() is None, stack.beat.output()[-4000:]
        events = harness.events(turn_id)
        kinds = [e.type for e in events]
        assert kinds == ["turn", "text", "tool_call", "tool_result", "turn", "text", "done"], kinds
        done = json.loads(events[-1].data)
        assert done["status"] == "done"
        result = json.loads(events[3].data)
        assert result["call_id"] == "call_slow" and not result.get("is_error")
    finally:
        stack.stop()


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_worker_survives_a_redis_restart_while_a_step_streams(pg_url, fake_llm, redis_server, harness, tmp_path,
                                                              pool) -> None:
    stack = Stack(_env(pg_url, redis_server, fake_llm), tmp_path, pool)
    worker = stack.worker
    try:
        turn_id = _start_turn(harness, "scripted:slow_text")  # six pieces, 150 ms apart
        _wait(lambda: "text" in _kinds(harness, turn_id), "the first text")
        redis_server.kill()
        redis_server.start()
        _finished(harness, turn_id)
        assert worker.proc.poll() is None, worker.output()[-4000:]
        assert "Unrecoverable error" not in worker.output()
        events = [(e.type, json.loads(e.data)) for e in harness.events(turn_id)]
        assert events[0][0] == "turn" and events[-1][0] == "done", events
        assert events[-1][1]["status"] == "done" and _status(harness, turn_id) == "done"
        # What a client reads across the restart: the whole answer once, nothing lost or doubled
        # (events of a step's superseded attempt dropped, as the CLI does), and no gap in seq.
        assert _client_text(events) == "one two three four five six"
        assert [data["seq"] for _, data in events] == list(range(1, len(events) + 1))
    finally:
        stack.stop()


def test_the_broker_channel_pool_holds_every_pool_thread(redis_server, tmp_path) -> None:
    """Every pool thread acks through the consumer channel's Redis pool. Sized below the
    worker's concurrency it raises ("Couldn't ack ... MaxConnectionsError"); a worker raises it."""
    from types import SimpleNamespace

    from redis.exceptions import ConnectionError as RedisConnectionError

    from workers import app as app_module

    settings = make_settings(tmp_path, "sqlite://", redis_url=redis_server.url, redis_prefix="kxpool",
                             pools={"broker_max_connections": 16})
    concurrency = 64

    def hold_all(app) -> None:  # type: ignore[no-untyped-def]
        with app.connection_for_read() as conn:
            pool = conn.default_channel.pool
            held = []
            try:
                for _ in range(concurrency):  # every thread acking at the same moment
                    held.append(pool.get_connection())
            finally:
                for c in held:
                    pool.release(c)

    unsized = make_celery(settings)
    with pytest.raises(RedisConnectionError, match="Too many connections"):
        hold_all(unsized)

    sized = make_celery(settings)
    app_module._size_broker_pool(SimpleNamespace(concurrency=concurrency, app=sized))  # what worker_init does
    hold_all(sized)
