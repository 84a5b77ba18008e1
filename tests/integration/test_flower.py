"""Ops teams watch the workers in Flower: it must see our workers, queues and named tasks,
with task events off until Flower asks for them, and every task of a finished turn as
finished: a step task ends within a millisecond on the threads pool, and its events must
still reach Flower (workers/pool.py, ``EventDispatcher``)."""

from __future__ import annotations

import ast
import functools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from kortex.storage.schema import tool_invocations, turns
from kortex.testing.scratch import throwaway_prefix
from kortex.turns import chat
from kortex.turns.handoff import StepDispatch
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL, Service, _free_port, service_env
from tests.integration.redisproc import kortex_command
from workers.app import make_celery
from workers.dispatch import send_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

STEP, TOOL = "kortex.turn.step", "kortex.tool.run"


@pytest.fixture
def prefix() -> Iterator[str]:
    """Not the session's: the stack below must be the only one taking these turns' messages."""
    with throwaway_prefix(REDIS_URL, "kxflower") as name:
        yield name


def _tasks(base: str) -> dict[str, dict[str, Any]]:
    return httpx.get(f"{base}/api/tasks?limit=1000", timeout=5).json()  # type: ignore[no-any-return]


def _ids(task: dict[str, Any]) -> dict[str, Any]:
    try:  # kwargsrepr: a dict of ids (workers/dispatch.py)
        return dict(ast.literal_eval(task.get("kwargs") or "{}"))
    except (ValueError, SyntaxError):
        return {}


def test_flower_shows_workers_queues_and_every_task_of_a_turn_as_finished(pg_url: str, prefix: str,
                                                                          tmp_path: Path) -> None:
    # The workers as the README and the compose file run them: turns on the threads pool (where
    # step tasks end in microseconds), tools on prefork.
    env = service_env(pg_url, prefix, FLOWER_UNAUTHENTICATED_API="1")
    port = _free_port()
    services = [
        Service("turns worker", kortex_command("worker", "--queues", "turns", "--concurrency", "4"), env,
                tmp_path / "turns.log"),
        Service("tools worker", kortex_command("worker", "--queues", "tools", "--pool", "prefork",
                                               "--concurrency", "2"), env, tmp_path / "tools.log"),
        Service("flower", [sys.executable, "-m", "celery", "-A", "workers.app", "flower", f"--port={port}",
                           "--address=127.0.0.1"], env, tmp_path / "flower.log"),
    ]
    flower = services[-1]
    base = f"http://127.0.0.1:{port}"
    h = Harness(make_settings(tmp_path, pg_url, redis_url=REDIS_URL, redis_prefix=prefix))
    app = make_celery(h.settings)
    tenant = h.tenant("flower")

    def start() -> str:
        session = chat.create_session(h.k, tenant, "flower", "scripted:two_tools")
        posted = chat.post_message(h.k, tenant, session.id, "for flower")
        send_step(app, StepDispatch(tenant, posted.turn.id, 0))
        return posted.turn.id

    def finished(turn_ids: list[str]) -> bool:
        with h.k.db.connect() as conn:
            statuses = conn.scalars(select(turns.c.status).where(turns.c.id.in_(turn_ids))).all()
        return len(statuses) == len(turn_ids) and all(s in ("done", "failed", "cancelled") for s in statuses)

    try:
        def workers_listed() -> bool:
            try:
                return len(httpx.get(f"{base}/api/workers?refresh=1", timeout=5).json()) >= 2
            except (httpx.HTTPError, ValueError):
                return False

        flower.wait_for(workers_listed, timeout=60)
        queues = {q["name"] for w in httpx.get(f"{base}/api/workers", timeout=5).json().values()
                  for q in w.get("active_queues") or []}
        assert {"turns", "tools"} <= queues

        # Task events are off until Flower switches them on: wait until a turn's tasks show.
        deadline = time.monotonic() + 30
        while not any(t.get("name") == STEP for t in _tasks(base).values()):
            assert time.monotonic() < deadline, "Flower saw no step task"
            flower.wait_for(functools.partial(finished, [start()]), timeout=30)
            time.sleep(0.5)

        ours = [start() for _ in range(8)]
        flower.wait_for(lambda: finished(ours), timeout=60)
        with h.k.db.connect() as conn:
            calls = dict(conn.execute(select(tool_invocations.c.id, tool_invocations.c.turn_id)
                                      .where(tool_invocations.c.turn_id.in_(ours))).all())
        assert len(calls) == 2 * len(ours)  # two steps and two tool calls a turn (scripted:two_tools)
        states: dict[tuple[str, str], list[str]] = {}
        deadline = time.monotonic() + 10  # the worker flushes its events within a loop's turn
        while True:
            states = {(t, name): [] for t in ours for name in (STEP, TOOL)}
            for task in _tasks(base).values():
                ids = _ids(task)
                turn_id = ids.get("turn_id") or calls.get(ids.get("invocation_id"))
                if turn_id in ours:
                    states[turn_id, task["name"]].append(task.get("state"))
            if all(v == ["SUCCESS", "SUCCESS"] for v in states.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert {k: v for k, v in states.items() if v != ["SUCCESS", "SUCCESS"]} == {}
    finally:
        h.close()
        for service in reversed(services):
            service.stop()
