"""Reading a model's answer (kortex/turns/consume.py) through a real adapter and the fake LLM
server: an answer longer than ``llm.max_answer_chars`` is cut off and fails its step, and none of
it is stored."""

from __future__ import annotations

import json
from typing import Any

from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

CAP = 1_000  # the least llm.max_answer_chars allows


def _harness(harness_factory: Any, fake: FakeLLM, **turn: Any) -> Harness:
    return harness_factory(  # type: ignore[no-any-return]
        llm={"default_provider": "openai", "max_answer_chars": CAP,
             "providers": {"openai": vendor_config("openai", fake.url, max_retries=0)}},
        turn=turn)


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def test_an_answer_past_the_cap_fails_the_turn_and_none_of_it_is_stored(harness_factory, fake: FakeLLM) -> None:
    fake.add("gpt-5", {"steps": [{"text": ["x" * 400] * 30}]})  # 12,000 characters
    h = _harness(harness_factory, fake)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid"
    assert "llm.max_answer_chars" in turn.error["message"]
    assert [m.role for m in h.messages(tenant, turn.session_id)] == ["user"]  # no assistant message
    events = _events(h, turn.id)
    shown = "".join(e["delta"] for e in events if e["type"] == "text")
    assert 0 < len(shown) <= CAP
    error, done = events[-2:]
    assert (error["type"], error["code"], error["retryable"]) == ("error", "stream_invalid", False)
    assert done["type"] == "done" and done["status"] == "failed" and done["error"] == "stream_invalid"
    with h.k.db.connect() as conn:
        [row] = [r for r in audit.list_for_turn(conn, tenant, turn.id) if r["kind"] == "llm_call"]
    assert not row["ok"] and row["payload"]["error_code"] == "stream_invalid"  # billed and audited all the same
    # The vendor's usage comes in its last chunk, never sent: the text it did send is billed.
    assert turn.output_tokens >= len(shown) // 4 > 0


def test_a_stream_that_runs_on_is_cut_off_at_the_cap_not_at_the_step_time_limit(
        harness_factory, fake: FakeLLM) -> None:
    # A thousand pieces, 50 ms apart: the stream would run for 50 s, past the step's time limit.
    fake.add("gpt-5", {"steps": [{"text": ["x" * 400] * 1000, "tokens_per_s": 20}]})
    h = _harness(harness_factory, fake, step_time_limit=10)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid"  # not step_timeout
    assert fake.stats.streams_completed == 0


def test_an_answer_of_exactly_the_cap_is_kept(harness_factory, fake: FakeLLM) -> None:
    fake.add("gpt-5", {"steps": [{"text": ["x" * 400, "y" * 400, "z" * 200]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "done"
    assert [len(m.content) for m in h.messages(tenant, turn.session_id) if m.role == "assistant"] == [CAP]


def test_calls_are_made_storable_whatever_provider_built_them() -> None:
    from kortex.messages import ToolCall
    from kortex.turns.consume import unique_calls

    nul, nan, deep = unique_calls([
        ToolCall(id="c\u0000", name="get\u0000logs", arguments={"k\u0000": ["a\u0000", {"b": "\u0000"}], "n": 1.5}),
        ToolCall(id="c2", name="get_logs", arguments={"x": [float("-inf")]}),
        ToolCall(id="c3", name="get_logs", arguments={"x": {"y": float("nan")}})], set())
    assert "\u0000" not in nul.id and nul.name == "get\ufffdlogs"
    assert nul.arguments == {"k\ufffd": ["a\ufffd", {"b": "\ufffd"}], "n": 1.5} and nul.arguments_error is None
    assert (nan.arguments, nan.arguments_error) == ({}, "invalid_json")
    assert (deep.arguments, deep.arguments_error) == ({}, "invalid_json")
