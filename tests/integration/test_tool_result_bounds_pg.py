"""Tool results that could not be stored, on PostgreSQL, Redis and a real Celery worker with its
watchdog: a result nested past ``MAX_RESULT_DEPTH`` (an /admin/info envelope stored before ingest
bounded its depth) ends its call within seconds as ``result_too_large``, where the tool task used
to raise, leaving the call ``running`` until the watchdog answered it with a timeout; and
get_traces over a chain of 200 spans answers with a page it can return (tests/kortex/tools/
test_result_bounds.py has the details on the default stack)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from kortex.nesting import MAX_DEPTH, deeper_than
from kortex.telemetry import ingest
from kortex.testing.scratch import throwaway_prefix
from kortex.timeparse import utcnow
from kortex.tools.pipeline import MAX_RESULT_DEPTH
from kortex.turns import chat
from kortex.turns.handoff import StepDispatch
from tests.conftest import Harness, make_settings
from tests.integration.conftest import PG_ADMIN, REDIS_URL, Service, service_env
from tests.integration.redisproc import kortex_command, private_database
from workers.app import make_celery
from workers.dispatch import send_step

pytestmark = pytest.mark.integration

TOOLS = ["get_admin_info", "get_traces"]
SCRIPTS = {
    "deep_info": {"id": "c_info", "name": "get_admin_info", "arguments": {"product": "checkout"}},
    "long_chain": {"id": "c_trace", "name": "get_traces", "arguments": {"request_id": "chain01"}},
}


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """A database and key prefix of their own (the watchdog sweeps its whole database), a worker
    serving both queues and the watchdog, as deployed; the test's own container beside them."""
    tmp = tmp_path_factory.mktemp("result-bounds")
    scripts = tmp / "scripts"
    scripts.mkdir()
    for name, call in SCRIPTS.items():
        (scripts / f"{name}.json").write_text(json.dumps({"steps": [
            {"text": ["Looking."], "tool_calls": [call]}, {"text": ["Done."]}]}))
    with private_database(PG_ADMIN) as pg_url, throwaway_prefix(REDIS_URL, "kxbounds") as prefix:
        env = service_env(pg_url, prefix, KORTEX_TOOLS__ALLOWED=json.dumps(TOOLS),
                          KORTEX_TESTING__SCRIPTS_DIR=str(scripts))
        harness = Harness(make_settings(tmp, pg_url, redis_url=REDIS_URL, redis_prefix=prefix,
                                        tools={"allowed": TOOLS}, testing={"scripts_dir": scripts}))
        worker = Service("worker", kortex_command("worker", "--queues", "turns,tools", "--pool", "threads",
                                                  "--loglevel", "INFO"), env, tmp / "worker.log")
        beat = Service("watchdog", kortex_command("beat"), env, tmp / "beat.log")
        try:
            worker.wait_for(lambda: " ready." in worker.output())
            beat.wait_for(lambda: "took the lead" in beat.output())
            yield harness
        finally:
            harness.close()
            beat.stop()
            worker.stop()


def _tool_result(h: Harness, tenant: str, model: str, timeout: float = 20) -> tuple[dict[str, Any], float, str]:
    """Post a question to the worker; the call's tool_result as a client reads it, the seconds
    from the post to it, and the turn's ending status."""
    session = chat.create_session(h.k, tenant, "bounds", model)
    posted = chat.post_message(h.k, tenant, session.id, "why?")
    started = time.monotonic()
    send_step(make_celery(h.settings), StepDispatch(tenant, posted.turn.id, 0))
    result: dict[str, Any] | None = None
    took = 0.0
    deadline = started + timeout
    while time.monotonic() < deadline:
        events = [json.loads(e.data) for e in h.events(posted.turn.id)]
        if result is None:
            found = [e for e in events if e["type"] == "tool_result"]
            if found:
                result, took = found[0], time.monotonic() - started
        done = [e for e in events if e["type"] == "done"]
        if done:
            assert result is not None
            return result, took, done[0]["status"]
        time.sleep(0.05)
    raise AssertionError(f"no tool_result and done within {timeout} s (tool_result: {result})")


def test_a_result_nested_too_deep_ends_its_call_at_once_on_the_worker(h: Harness) -> None:
    tenant = h.tenant(f"deep-{uuid.uuid4().hex[:6]}")
    [row] = ingest.validate_batch("products", [{"product": "checkout", "info": {"version": "1.2"},
                                                "updated_at": utcnow().isoformat()}], now=utcnow())
    with h.k.db.begin() as conn:  # as stored before ingest bounded the depth
        ingest.write(conn, tenant, "products", [{**row, "info": {"version": "1.2", "config": _nested(300)}}])

    result, took, status = _tool_result(h, tenant, "scripted:deep_info")
    assert result["is_error"] and result["error_code"] == "result_too_large", result
    assert f"nests deeper than {MAX_RESULT_DEPTH} levels" in result["content"]["message"]
    assert took < 5 and status == "done"


def test_get_traces_over_a_chain_of_200_spans_answers_at_once_on_the_worker(h: Harness) -> None:
    tenant = h.tenant(f"chain-{uuid.uuid4().hex[:6]}")
    start = utcnow() - timedelta(minutes=10)
    items = [{"trace_id": "chain01", "span_id": f"s{i:04d}", "parent_span_id": f"s{i - 1:04d}" if i else None,
              "service": "api", "operation": f"op {i}", "start": (start + timedelta(milliseconds=i)).isoformat(),
              "duration_us": 1000, "status": "ok", "tags": _nested(MAX_DEPTH)} for i in range(200)]
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "spans", ingest.validate_batch("spans", items, now=utcnow()))

    result, took, status = _tool_result(h, tenant, "scripted:long_chain")
    assert not result["is_error"], result
    content = result["content"]
    assert not deeper_than(content, MAX_RESULT_DEPTH)
    assert content["root"]["span_id"] == "s0000" and all(f["too_deep"] for f in content["fragments"])
    assert content["next_cursor"] and took < 5 and status == "done"
