"""Ops teams watch the workers in Flower: it must see our workers, queues and named tasks,
with task events off until Flower asks for them."""

from __future__ import annotations

import sys
import time

import httpx
import pytest

from tests.integration.conftest import Service, _free_port, service_env
from tests.integration.test_turns import start_turn, wait_done

pytestmark = pytest.mark.integration


def test_flower_shows_workers_queues_and_named_tasks(api_url, pg, worker, pg_url, redis_prefix, tmp_path) -> None:
    tenant_id = pg.tenant("flower")
    key = pg.api_key(tenant_id)
    port = _free_port()
    env = service_env(pg_url, redis_prefix, FLOWER_UNAUTHENTICATED_API="1")
    flower = Service("flower", [sys.executable, "-m", "celery", "-A", "workers.app", "flower", f"--port={port}",
                                "--address=127.0.0.1"], env, tmp_path / "flower.log")
    base = f"http://127.0.0.1:{port}"
    try:
        def workers_listed() -> bool:
            try:
                return bool(httpx.get(f"{base}/api/workers?refresh=1", timeout=5).json())
            except (httpx.HTTPError, ValueError):
                return False

        flower.wait_for(workers_listed, timeout=60)
        queues = {q["name"] for w in httpx.get(f"{base}/api/workers", timeout=5).json().values()
                  for q in w.get("active_queues") or []}
        assert {"turns", "tools"} <= queues
        deadline = time.monotonic() + 30
        names: set[str] = set()
        while time.monotonic() < deadline and not {"kortex.turn.step", "kortex.tool.run"} <= names:
            turn = start_turn(api_url, key, "for flower", model="scripted:two_tools")
            wait_done(api_url, key, turn["turn_id"])
            time.sleep(1)
            tasks = httpx.get(f"{base}/api/tasks?limit=50", timeout=5).json()
            names = {t["name"] for t in tasks.values() if t.get("state") == "SUCCESS"}
        assert {"kortex.turn.step", "kortex.tool.run"} <= names
    finally:
        flower.stop()
