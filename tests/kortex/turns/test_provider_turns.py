"""Whole turns through the HTTP providers (against the fake server): events, usage and cost on
the turn and in the audit trail, failover and failures."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kortex.errors import ProviderUnavailable
from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from kortex.turns import chat
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

DEPLOYS = {"product": "checkout", "time_range": "last 2h"}


def harness_for(harness_factory: Any, fake: FakeLLM, turn: dict[str, Any] | None = None, **llm: Any) -> Harness:
    providers = {v: vendor_config(v, fake.url, max_retries=0) for v in ("anthropic", "openai", "ollama")}
    return harness_factory(llm={"providers": providers, **llm}, turn=turn or {})  # type: ignore[no-any-return]


def _audit(h: Harness, tenant: str, turn_id: str) -> list[dict[str, Any]]:
    with h.k.db.connect() as conn:
        return audit.list_for_turn(conn, tenant, turn_id)


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def test_a_turn_through_anthropic_streams_stores_usage_and_prices_it(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-sonnet-4-6", {"steps": [
        {"text": ["Checking ", "deploys."], "usage": {"input_tokens": 1000, "output_tokens": 100},
         "tool_calls": [{"id": "toolu_dep", "name": "get_recent_deploys", "arguments": DEPLOYS, "fragments": 4}]},
        {"text": ["v2.14.0 ", "broke it [toolu_dep]."], "usage": {"input_tokens": 3000, "output_tokens": 200}}]})
    h = harness_for(harness_factory, fake)
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, "why is checkout slow?", model="anthropic:claude-sonnet-4-6")
    assert turn.status == "done" and turn.model_used == "anthropic:claude-sonnet-4-6"
    events = _events(h, turn.id)
    assert [e["type"] for e in events] == ["turn", "text", "text", "tool_call", "tool_result", "turn", "text", "text",
                                           "done"]
    assert events[0]["model"] == "anthropic:claude-sonnet-4-6"
    text = "".join(e["delta"] for e in events if e["type"] == "text")
    assert text == "Checking deploys.v2.14.0 broke it [toolu_dep]."
    assert events[3]["arguments"] == DEPLOYS and events[4]["content"]["deploys"][0]["version"] == "v2.14.0"
    # Sonnet: $3 in / $15 out per million tokens
    cost = (4000 * 3 + 300 * 15) / 1e6
    assert (turn.input_tokens, turn.output_tokens) == (4000, 300) and turn.cost_usd == pytest.approx(cost)
    assert events[-1]["usage"]["cost_usd"] == pytest.approx(cost)
    calls = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert [(r["input_tokens"], r["output_tokens"], r["ok"]) for r in calls] == [(1000, 100, True), (3000, 200, True)]
    assert sum(r["cost_usd"] for r in calls) == pytest.approx(cost)
    assert calls[0]["payload"]["tool_calls"] == ["get_recent_deploys"] and calls[0]["subject"] == turn.model_used
    sent = fake.requests[-1].body["messages"][-1]["content"][0]
    assert sent["type"] == "tool_result" and sent["tool_use_id"] == "toolu_dep" and "v2.14.0" in sent["content"]
    assert "test-key" not in json.dumps(calls, default=str)


def test_failover_before_the_first_token_and_back_on_the_next_step(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [
        {"faults": [{"status": 529, "message": "Overloaded"}], "text": ["unused"]},
        {"text": ["Anthropic is back: ", "v2.14.0."]}]})
    fake.add("gpt-5", {"steps": [{"text": ["Looking."], "tool_calls": [
        {"id": "call_dep", "name": "get_recent_deploys", "arguments": DEPLOYS}]}]})
    h = harness_for(harness_factory, fake, default_provider="anthropic", fallback_providers=["openai"])
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, "why?")
    assert turn.status == "done"
    events = _events(h, turn.id)
    warning = next(e for e in events if e["type"] == "error")
    assert warning["code"] == "provider_failover" and "openai:gpt-5" in warning["message"]
    assert [e["type"] for e in events] == ["turn", "error", "text", "tool_call", "tool_result", "turn", "text",
                                           "text", "done"]
    rows = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert [(r["subject"], r["ok"]) for r in rows] == [
        ("anthropic:claude-opus-4-6", False), ("openai:gpt-5", True), ("anthropic:claude-opus-4-6", True)]
    assert rows[0]["payload"]["status"] == 529 and rows[0]["payload"]["error_code"] == "provider_overloaded"
    # the second step went back to Anthropic with OpenAI's call in the history, in Anthropic's shape
    last = fake.requests[-1]
    assert last.path == "/v1/messages" and last.body["messages"][-1]["content"][0]["tool_use_id"] == "call_dep"


def test_a_failure_after_text_ends_the_turn_once_without_repeating_text(harness_factory, fake: FakeLLM) -> None:
    fake.add("gpt-5", {"steps": [{"text": ["The deploy ", "at 14:31 ", "changed"], "disconnect_after": 2}]})
    fake.add("claude-opus-4-6", {"steps": [{"text": ["must not be asked"]}]})
    h = harness_for(harness_factory, fake, default_provider="openai", fallback_providers=["anthropic"])
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "failed" and turn.error["code"] == "stream_interrupted"
    events = _events(h, turn.id)
    assert [e["type"] for e in events] == ["turn", "text", "text", "error", "done"]
    assert "".join(e["delta"] for e in events if e["type"] == "text") == "The deploy at 14:31 "
    assert events[3]["retryable"] and events[4]["status"] == "failed"
    assert all(r.path == "/v1/chat/completions" for r in fake.requests)
    [row] = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert not row["ok"] and row["payload"]["error_code"] == "stream_interrupted"


def test_an_answer_cut_at_max_tokens_is_kept_and_flagged(harness_factory, fake: FakeLLM) -> None:
    fake.add("gpt-5", {"steps": [{"text": ["The deploy ", "at 14:31 ", "changed"], "stop_reason": "max_tokens"}]})
    h = harness_for(harness_factory, fake, default_provider="openai")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "done"
    events = _events(h, turn.id)
    # The cut answer is flagged twice: cut at the limit, and quoting a time no tool result holds.
    assert [e["type"] for e in events] == ["turn", "text", "text", "text", "error", "error", "done"]
    notice = events[-3]
    assert notice["code"] == "max_tokens" and not notice["fatal"] and "openai:gpt-5" in notice["message"]
    assert events[-2]["code"] == "ungrounded_answer" and not events[-2]["fatal"]
    assert events[-1]["status"] == "done" and events[-1]["grounding"]["uncited_numbers"] == ["14", "31"]


def test_a_retried_call_is_announced_and_counted_in_its_audit_row(harness_factory, fake: FakeLLM) -> None:
    fake.add("gpt-5", {"steps": [{"faults": [{"status": 503, "message": "busy"}], "text": ["A deploy changed."]}]})
    providers = {"openai": vendor_config("openai", fake.url, max_retries=2, retry_base=0.01)}
    h = harness_factory(llm={"providers": providers, "default_provider": "openai"})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "done"
    events = _events(h, turn.id)
    assert [e["type"] for e in events] == ["turn", "error", "text", "done"]
    assert events[1]["code"] == "provider_retry" and not events[1]["fatal"] and "HTTP 503" in events[1]["message"]
    [row] = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert row["ok"] and row["payload"]["retries"] == 1


def test_warnings_are_not_fatal_but_failures_are(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": 529, "message": "Overloaded"}], "text": ["x"]}]})
    fake.add("gpt-5", {"steps": [{"text": ["The deploy ", "changed"], "disconnect_after": 1}]})
    h = harness_for(harness_factory, fake, default_provider="anthropic", fallback_providers=["openai"])
    turn = h.ask(h.tenant("acme"), "why?")
    errors = [e for e in _events(h, turn.id) if e["type"] == "error"]
    assert [(e["code"], e["fatal"]) for e in errors] == [("provider_failover", False), ("stream_interrupted", True)]


def test_invalid_tool_json_is_answered_with_a_tool_error_the_model_sees(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [
        {"tool_calls": [{"id": "toolu_bad", "name": "get_logs", "arguments_raw": '{"product": "check'}]},
        {"text": ["Sorry, retrying is pointless."]}]})
    h = harness_for(harness_factory, fake, default_provider="anthropic")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "logs?")
    assert turn.status == "done"
    result = next(e for e in _events(h, turn.id) if e["type"] == "tool_result")
    assert result["is_error"] and result["error_code"] == "invalid_json"
    block = fake.requests[-1].body["messages"][-1]["content"][0]
    assert block["tool_use_id"] == "toolu_bad" and block["is_error"] is True and "invalid_json" in block["content"]


def test_a_step_that_stalls_past_its_time_limit_fails_and_is_audited(harness_factory, fake: FakeLLM) -> None:
    fake.add("llama3.2", {"steps": [{"text": ["slow"], "delay_ms": 3000}]})
    h = harness_for(harness_factory, fake, turn={"step_time_limit": 0.3}, default_provider="ollama")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "anything?")
    assert turn.status == "failed" and turn.error["code"] == "step_timeout"
    [row] = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert row["subject"] == "ollama:llama3.2" and row["payload"]["error_code"] == "step_timeout"


def test_frugal_mode_bills_the_escalated_attempt_too(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-haiku-4-6", {"steps": [{"text": ["trunc"], "stop_reason": "max_tokens",
                                             "usage": {"input_tokens": 1000, "output_tokens": 1000}}]})
    fake.add("claude-opus-4-6", {"steps": [{"text": ["Complete answer."],
                                            "usage": {"input_tokens": 1000, "output_tokens": 100}}]})
    h = harness_for(harness_factory, fake, default_provider="anthropic", mode="frugal")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "done" and turn.model_used == "anthropic:claude-opus-4-6"
    texts = [e["delta"] for e in _events(h, turn.id) if e["type"] == "text"]
    assert texts == ["Complete answer."]
    assert turn.cost_usd == pytest.approx((1000 * 1 + 1000 * 5 + 1000 * 15 + 100 * 75) / 1e6)
    messages = h.messages(tenant, turn.session_id)
    assert messages[-1].content == "Complete answer."


def test_local_only_refuses_a_cloud_model_before_a_turn_exists(harness_factory, fake: FakeLLM) -> None:
    h = harness_for(harness_factory, fake, mode="local-only")
    tenant = h.tenant("acme")
    with pytest.raises(ProviderUnavailable) as caught:
        chat.create_session(h.k, tenant, "s", "anthropic:claude-sonnet-4-6")
    assert caught.value.code == "local_only"
    fake.add("llama3.2", {"steps": [{"text": ["Local answer."]}]})
    assert h.ask(tenant, "why?", model="ollama").model_used == "ollama:llama3.2"


def test_a_step_timing_out_mid_answer_still_bills_the_prompt(harness_factory, fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": [f"w{i} " for i in range(100)], "delay_ms": 50,
                                            "usage": {"input_tokens": 20_000, "output_tokens": 500}}]})
    h = harness_for(harness_factory, fake, turn={"step_time_limit": 0.4}, default_provider="anthropic")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "failed" and turn.error["code"] == "step_timeout"
    assert turn.input_tokens == 20_000 and turn.cost_usd >= 20_000 * 15 / 1e6  # Opus input, from message_start
    [row] = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert row["input_tokens"] == 20_000 and not row["ok"] and row["payload"]["error_code"] == "step_timeout"


def test_what_the_vendor_said_stays_out_of_the_turns_error(harness_factory, fake: FakeLLM) -> None:
    said = "Incorrect API key provided: sk-proj-abcd****wxyz (org org-SECRETORG)"
    fake.add("gpt-5", {"steps": [{"faults": [{"status": 401, "message": said}]}]})
    h = harness_for(harness_factory, fake, default_provider="openai")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "why?")
    assert turn.status == "failed" and turn.error["code"] == "provider_auth"
    assert turn.error["message"] == "openai:gpt-5: the provider rejected the API key (HTTP 401)"
    assert "SECRETORG" not in json.dumps(_events(h, turn.id)) and "wxyz" not in json.dumps(turn.error)


def test_a_step_cut_by_the_turns_deadline_says_so(harness_factory, fake: FakeLLM) -> None:
    # the step could stream for 60 s, but the turn has 0.3 s left: the deadline ended it
    fake.add("llama3.2", {"steps": [{"text": ["slow"], "delay_ms": 3000}]})
    h = harness_for(harness_factory, fake, turn={"deadline": 0.3}, default_provider="ollama")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "anything?")
    assert turn.status == "failed" and turn.error["code"] == "deadline_exceeded"
    assert turn.error["message"].endswith("the turn did not finish before its deadline")
    [row] = [r for r in _audit(h, tenant, turn.id) if r["kind"] == "llm_call"]
    assert row["payload"]["error_code"] == "deadline_exceeded"


def test_a_server_that_reports_no_usage_is_billed_an_estimate_the_audit_row_calls_so(harness_factory,
                                                                                     fake: FakeLLM) -> None:
    # A compatible server that ignores include_usage: costed at nothing, the turn would pass
    # every budget; its tokens are counted from characters instead, and the audit row says so.
    fake.add("gpt-5", {"steps": [{"text": ["The pool ", "ran dry at 14:31."], "usage_omitted": True}]})
    fake.add("gpt-4o", {"steps": [{"text": ["Reported."], "usage": {"input_tokens": 900, "output_tokens": 3}}]})
    h = harness_for(harness_factory, fake, default_provider="openai")
    tenant = h.tenant("acme")
    guessed = h.ask(tenant, "why is checkout slow?")
    reported = h.ask(tenant, "why is checkout slow?", model="openai:gpt-4o")
    assert guessed.status == reported.status == "done"
    assert guessed.output_tokens == -(-len("The pool ran dry at 14:31.") // 4) and guessed.input_tokens > 100
    assert guessed.cost_usd > 0
    [row] = [r for r in _audit(h, tenant, guessed.id) if r["kind"] == "llm_call"]
    assert row["payload"]["usage_estimated"] is True and row["cost_usd"] == pytest.approx(guessed.cost_usd)
    [row] = [r for r in _audit(h, tenant, reported.id) if r["kind"] == "llm_call"]
    assert "usage_estimated" not in row["payload"] and (row["input_tokens"], row["output_tokens"]) == (900, 3)
