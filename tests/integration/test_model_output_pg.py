"""What a model writes that PostgreSQL cannot store as it is (a NUL character in its text or in
tool-call arguments; NaN, an infinity or a number past a double in the arguments) no longer
fails the turn on PostgreSQL: NULs are replaced by U+FFFD, the numbers make that one call
``invalid_json`` for the model to correct, and the call is billed and audited as any other.
Through each vendor's wire format, from the fake LLM server."""

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
        harness = Harness(make_settings(tmp_path_factory.mktemp("model-output"), pg_url, redis_url=REDIS_URL,
                                        redis_prefix=prefix, llm={"providers": providers},
                                        tools={"allowed": ["get_logs"]}))
        yield harness
        harness.close()


def _bad_calls(vendor: str) -> list[dict[str, Any]]:
    if vendor == "ollama":
        # Ollama sends arguments as an object, parsed with the whole line: json reads NaN and
        # Infinity there (the fake writes them so), and consume is where they are caught.
        return [{"id": "c_nan", "name": "get_logs", "arguments": {"product": "checkout", "limit": float("nan")}},
                {"id": "c_inf", "name": "get_logs", "arguments": {"product": "checkout", "limit": float("inf")}}]
    return [{"id": "c_nan", "name": "get_logs", "arguments_raw": '{"product": "checkout", "limit": NaN}'},
            {"id": "c_inf", "name": "get_logs", "arguments_raw": '{"product": "checkout", "limit": 1e400}'}]


@pytest.mark.parametrize("vendor", list(MODELS))
def test_nul_and_non_finite_numbers_from_the_model_end_the_turn_done_on_postgresql(
        h: Harness, fake: FakeLLM, vendor: str) -> None:
    model = MODELS[vendor]
    fake.add(model, {"steps": [
        {"text": ["Hello \u0000 ", "world."], "usage": {"input_tokens": 100, "output_tokens": 10},
         "tool_calls": [{"id": "c_nul", "name": "get_logs", "arguments": {"product": "check\u0000out"}},
                        *_bad_calls(vendor)]},
        {"text": ["Done\u0000."], "usage": {"input_tokens": 200, "output_tokens": 5}}]})
    tenant = h.tenant(f"nul-{vendor}-{uuid.uuid4().hex[:6]}")
    turn = h.ask(tenant, "logs?", model=f"{vendor}:{model}")
    assert turn.status == "done", turn.error

    events = [json.loads(e.data) for e in h.events(turn.id)]
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "Hello \ufffd world.Done\ufffd."
    calls = {e["call_id"]: e for e in events if e["type"] == "tool_call"}
    results = {e["call_id"]: e for e in events if e["type"] == "tool_result"}
    assert len(calls) == len(results) == 3
    nul = next(c for c in calls.values() if c["arguments"].get("product") == "check\ufffdout")
    assert results[nul["call_id"]]["error_code"] != "invalid_json"
    bad = [r for r in results.values() if r["error_code"] == "invalid_json"]
    assert len(bad) == 2 and all(r["is_error"] for r in bad)

    stored = h.messages(tenant, turn.session_id)
    assert [m.content for m in stored if m.role == "assistant"] == ["Hello \ufffd world.", "Done\ufffd."]
    with h.k.db.connect() as conn:
        rows = audit.list_for_turn(conn, tenant, turn.id)
    llm = [r for r in rows if r["kind"] == "llm_call"]
    assert [(r["ok"], r["input_tokens"], r["output_tokens"]) for r in llm] == [(True, 100, 10), (True, 200, 5)]
    assert (turn.input_tokens, turn.output_tokens) == (300, 15)  # billed


@pytest.mark.parametrize("vendor", list(MODELS))
def test_a_lone_surrogate_from_the_model_is_replaced_and_the_turn_ends_done_on_postgresql(
        h: Harness, fake: FakeLLM, vendor: str) -> None:
    """A vendor's JSON may escape half of a surrogate pair ("\\ud800"), which Python decodes as
    it is: no UTF-8 database can store it, and Redis could not take the text either."""
    model = MODELS[vendor]
    fake.add(model, {"steps": [
        {"text": ["Hi \ud800 ", "there."], "usage": {"input_tokens": 10, "output_tokens": 3},
         "tool_calls": [{"id": "c_sur", "name": "get_logs", "arguments": {"product": "check\udfffout"}}]},
        {"text": ["Done\udc80."], "usage": {"input_tokens": 20, "output_tokens": 2}}]})
    tenant = h.tenant(f"sur-{vendor}-{uuid.uuid4().hex[:6]}")
    turn = h.ask(tenant, "logs?", model=f"{vendor}:{model}")
    assert turn.status == "done", turn.error

    events = [json.loads(e.data) for e in h.events(turn.id)]
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "Hi \ufffd there.Done\ufffd."
    calls = [e for e in events if e["type"] == "tool_call"]
    assert [c["arguments"] for c in calls] == [{"product": "check\ufffdout"}]
    stored = h.messages(tenant, turn.session_id)
    assert [m.content for m in stored if m.role == "assistant"] == ["Hi \ufffd there.", "Done\ufffd."]
