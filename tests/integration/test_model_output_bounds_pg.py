"""The bounds on one answer's tool calls on PostgreSQL and Redis, through each vendor's wire
format from the fake LLM server (kortex/turns/consume.py, kortex/llm/convert.py): arguments
nested past ``MAX_DEPTH`` are one ``invalid_json`` call and the turn ends done; calls past
``max_tool_calls_per_step`` are stored, published and re-sent with their id and name only; one
call's arguments past ``MAX_ARGUMENT_BYTES`` fail the answer and nothing of it is stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from kortex.testing.scratch import throwaway_prefix
from tests.conftest import Harness, make_settings
from tests.integration.conftest import REDIS_URL
from tests.kortex.llm.conftest import vendor_config

pytestmark = pytest.mark.integration

MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "ollama": "llama3.2"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


@pytest.fixture(scope="module")
def h(pg_url: str, fake: FakeLLM, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    providers = {v: vendor_config(v, fake.url, max_retries=0) for v in MODELS}
    with throwaway_prefix(REDIS_URL) as prefix:
        harness = Harness(make_settings(tmp_path_factory.mktemp("model-bounds"), pg_url, redis_url=REDIS_URL,
                                        redis_prefix=prefix, llm={"providers": providers, "max_tool_calls_per_step": 2},
                                        tools={"allowed": ["debug_echo"]}))
        yield harness
        harness.close()


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("vendor", list(MODELS))
def test_deep_and_refused_calls_end_the_turn_done_on_postgresql(h: Harness, fake: FakeLLM, vendor: str) -> None:
    model = MODELS[vendor]
    fake.add(model, {"steps": [
        {"text": ["Reading."], "tool_calls": [
            {"id": "c_deep", "name": "debug_echo", "arguments": _nested(300)},
            {"id": "c_ok", "name": "debug_echo", "arguments": {"text": "fine"}},
            {"id": "c_over", "name": "debug_echo", "arguments": {"text": "r" * 5000}}]},
        {"text": ["Done."]}]})
    tenant = h.tenant(f"bounds-{vendor}-{uuid.uuid4().hex[:6]}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{model}")
    assert turn.status == "done", turn.error

    events = [json.loads(e.data) for e in h.events(turn.id)]
    calls = [e for e in events if e["type"] == "tool_call"]
    results = {e["call_id"]: e for e in events if e["type"] == "tool_result"}
    assert [c["arguments"] for c in calls] == [{}, {"text": "fine"}, {}]
    deep, ok, over = (c["call_id"] for c in calls)
    assert (results[deep]["error_code"], results[ok]["error_code"], results[over]["error_code"]) == (
        "invalid_json", None, "too_many_calls")
    [stored] = [m for m in h.messages(tenant, turn.session_id) if m.role == "assistant" and m.tool_calls]
    assert [c["arguments"] for c in stored.tool_calls] == [{}, {"text": "fine"}, {}]
    assert "r" * 5000 not in json.dumps(fake.requests[-1].body)  # not re-sent either
    with h.k.db.connect() as conn:
        rows = [r for r in audit.list_for_turn(conn, tenant, turn.id) if r["kind"] == "tool_call"]
    assert sorted(r["payload"].get("error_code") or "" for r in rows) == ["", "invalid_json", "too_many_calls"]


@pytest.mark.parametrize("vendor", list(MODELS))
def test_one_call_past_the_per_call_bound_fails_the_answer_on_postgresql(h: Harness, fake: FakeLLM,
                                                                        vendor: str) -> None:
    model = MODELS[vendor]
    fake.add(model, {"steps": [
        {"text": ["Reading."], "tool_calls": [{"id": "c_big", "name": "debug_echo", "arguments": {"text": "q" * 300_000}}]},
        {"text": ["Done."]}]})
    tenant = h.tenant(f"big-{vendor}-{uuid.uuid4().hex[:6]}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{model}")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid"
    assert not [json.loads(e.data) for e in h.events(turn.id) if json.loads(e.data)["type"] == "tool_call"]
    assert [m.role for m in h.messages(tenant, turn.session_id)] == ["user"]
