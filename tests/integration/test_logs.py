"""A real worker with KORTEX_LOG_FORMAT=json: one JSON object a line, and the records written
inside a turn's task carry the task's id and the turn's and tenant's."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.conftest import Harness
from tests.integration.sse import read_events


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _records(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))  # every log line is JSON: a broken one fails here
    return out


def test_a_turn_s_task_records_are_json_with_its_ids(api_url: str, pg: Harness, worker: Any) -> None:
    tenant = pg.tenant("logs")
    pg.seed(tenant)
    key = pg.api_key(tenant)
    sid = httpx.post(f"{api_url}/v1/sessions", json={"model": "scripted:two_tools"}, headers=auth(key)).json()["id"]
    posted = httpx.post(f"{api_url}/v1/sessions/{sid}/messages", json={"content": "why?"}, headers=auth(key)).json()
    assert read_events(api_url + posted["events_url"], key)[-1].event == "done"
    deadline = time.monotonic() + 10
    mine: list[dict[str, Any]] = []
    while not mine and time.monotonic() < deadline:
        mine = [r for r in _records(worker.output()) if r.get("turn_id") == posted["turn_id"]]
        time.sleep(0.2)
    assert mine, "no record of the turn's tasks carries its id"
    assert all(r["tenant_id"] == tenant and r["task_id"] and r["level"] and r["logger"] for r in mine)
    assert any("kortex.turn.step" in r["message"] for r in mine)
    assert {"ts", "level", "logger", "message"} <= set(_records(worker.output())[0])
