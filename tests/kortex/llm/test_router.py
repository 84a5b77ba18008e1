"""Modes and failover: which providers answer a step, and what happens when one fails."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import pytest

from kortex.config import Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm import http
from kortex.llm.base import CompletionRequest, DoneChunk, TextChunk, ToolSchema, WarningChunk
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import FRUGAL_HINT, NEED_MORE_CONTEXT, RoutedStream, plan
from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import vendor_config


def registry(url: str | None = None, *, providers: tuple[str, ...] = ("anthropic", "openai", "ollama"),
             **llm: Any) -> ProviderRegistry:
    configured = {v: vendor_config(v, url, max_retries=0) for v in providers} if url else {}
    return ProviderRegistry(Settings(llm={"providers": configured, **llm}), BUILTIN_PROVIDERS)


def run(reg: ProviderRegistry, spec: str | None) -> tuple[list[Any], RoutedStream]:
    routed = RoutedStream(plan(reg, spec), CompletionRequest(system="sys", messages=(UserMessage(content="q"),)),
                          reg.settings.llm)
    got: list[Any] = []

    async def go() -> None:
        try:
            async with aclosing(routed.stream()) as chunks:
                async for chunk in chunks:
                    got.append(chunk)
        finally:
            await reg.aclose()

    try:
        asyncio.run(go())
    except ProviderError as exc:
        got.append(exc)
    return got, routed


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(seconds: float) -> None:
        return None
    monkeypatch.setattr(http, "sleep", instant)


def test_the_default_is_the_offline_analyst_and_a_missing_key_is_skipped_not_fatal() -> None:
    [only] = plan(registry(), None)
    assert only.spec == "offline:analyst"
    chain = plan(registry(default_provider="anthropic", fallback_providers=["openai", "offline"]), None)
    assert [c.spec for c in chain] == ["offline:analyst"]  # no keys: both cloud providers skipped
    with pytest.raises(ProviderUnavailable, match="ANTHROPIC_API_KEY"):
        plan(registry(), "anthropic:claude-sonnet-4-6")  # asked for by name: say why not
    with pytest.raises(ProviderUnavailable, match="no provider can answer.*anthropic: no API key.*openai"):
        plan(registry(default_provider="anthropic", fallback_providers=["openai"]), None)
    with pytest.raises(ProviderUnavailable, match="koder-ai is reserved"):
        plan(registry(), "koder-ai")


def test_fallbacks_answer_with_their_configured_model_and_an_explicit_model_is_pinned(fake: FakeLLM) -> None:
    reg = registry(fake.url, default_provider="anthropic", fallback_providers=["openai", "ollama"])
    assert [c.spec for c in plan(reg, None)] == ["anthropic:claude-opus-4-6", "openai:gpt-5", "ollama:llama3.2"]
    assert [c.spec for c in plan(reg, "openai:gpt-4o")] == ["openai:gpt-4o", "ollama:llama3.2"]
    assert plan(reg, "claude-haiku-4-6")[0].spec == "anthropic:claude-haiku-4-6"  # a bare model id


def test_failover_before_the_first_token(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": 503, "message": "down for maintenance"}]}]})
    fake.add("gpt-5", {"steps": [{"text": ["from ", "openai"], "usage": {"input_tokens": 10, "output_tokens": 4}}]})
    got, routed = run(registry(fake.url, default_provider="anthropic", fallback_providers=["openai"]), None)
    warning, *rest = got
    assert isinstance(warning, WarningChunk) and warning.code == "provider_failover"
    assert "anthropic:claude-opus-4-6" in warning.message and "openai:gpt-5" in warning.message
    assert [c.text for c in rest if isinstance(c, TextChunk)] == ["from ", "openai"]
    assert isinstance(rest[-1], DoneChunk)
    failed, answered = routed.attempts
    assert failed.error is not None and failed.error.status == 503 and failed.usage.output_tokens == 0
    assert routed.answered is answered and answered.spec == "openai:gpt-5" and answered.cost_usd > 0


def test_no_failover_once_text_was_streamed(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": ["The deploy ", "at 14:31"], "disconnect_after": 1}]})
    fake.add("gpt-5", {"steps": [{"text": ["never asked"]}]})
    got, routed = run(registry(fake.url, default_provider="anthropic", fallback_providers=["openai"]), None)
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["The deploy "]
    assert isinstance(got[-1], ProviderError) and got[-1].code == "stream_interrupted"
    assert [r.path for r in fake.requests] == ["/v1/messages"]  # openai was never called
    assert len(routed.attempts) == 1 and routed.answered is None


@pytest.mark.parametrize("status", [501, 505, 520, 524])
def test_any_server_error_fails_over_also_one_not_worth_retrying(fake: FakeLLM, status: int) -> None:
    # 501/505 are not retried (the same server will say the same), but another provider may answer.
    fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": status, "message": "<html>error</html>"}]}]})
    fake.add("gpt-5", {"steps": [{"text": ["from openai"]}]})
    got, routed = run(registry(fake.url, default_provider="anthropic", fallback_providers=["openai"]), None)
    assert isinstance(got[0], WarningChunk) and got[0].code == "provider_failover"
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["from openai"] and isinstance(got[-1], DoneChunk)
    failed, answered = routed.attempts
    assert failed.error is not None and failed.error.status == status and routed.answered is answered


def test_a_non_retryable_failure_does_not_fail_over(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": 400, "message": "prompt is too long"}]}]})
    got, _ = run(registry(fake.url, default_provider="anthropic", fallback_providers=["openai"]), None)
    assert isinstance(got[-1], ProviderError) and "prompt is too long" in got[-1].detail
    assert len(fake.requests) == 1


def test_a_400_that_refuses_the_model_fails_over_and_one_about_the_request_does_not(fake: FakeLLM) -> None:
    # An embedding model asked to chat: another model may well answer. A prompt too long would be
    # refused by the next one too (test_a_non_retryable_failure_does_not_fail_over).
    fake.add("claude-opus-4-6", {"steps": [{"faults": [{"status": 400, "message": "model does not support chat"}]}]})
    fake.add("gpt-5", {"steps": [{"text": ["from openai"]}]})
    got, routed = run(registry(fake.url, default_provider="anthropic", fallback_providers=["openai"]), None)
    assert isinstance(got[0], WarningChunk) and got[0].code == "provider_failover"
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["from openai"]
    assert [a.spec for a in routed.attempts] == ["anthropic:claude-opus-4-6", "openai:gpt-5"]


def test_a_spent_quota_fails_over_at_once(fake: FakeLLM) -> None:
    # Not retried (the account says the same until someone pays) and not the end of the step:
    # another provider's account may well have credit.
    fake.add("gpt-5", {"steps": [{"faults": [{"status": 429, "kind": "insufficient_quota",
                                              "message": "You exceeded your current quota"}]}]})
    fake.add("claude-opus-4-6", {"steps": [{"text": ["from anthropic"]}]})
    got, routed = run(registry(fake.url, default_provider="openai", fallback_providers=["anthropic"]), None)
    assert isinstance(got[0], WarningChunk) and got[0].code == "provider_failover"
    assert "no quota or credit" in got[0].message
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["from anthropic"]
    assert [r.path for r in fake.requests] == ["/v1/chat/completions", "/v1/messages"]
    assert routed.attempts[0].error is not None and routed.attempts[0].error.code == "provider_quota"


def test_local_only_refuses_cloud_providers_and_forces_the_local_one(fake: FakeLLM) -> None:
    for settings in ({"mode": "local-only"}, {"privacy": {"local_only": True}}):
        reg = registry(fake.url, default_provider="anthropic", fallback_providers=["openai"], **settings)
        with pytest.raises(ProviderUnavailable, match="local-only") as caught:
            plan(reg, "anthropic:claude-sonnet-4-6")
        assert caught.value.code == "local_only"
        with pytest.raises(ProviderUnavailable, match="local-only"):
            reg.resolve("openai:gpt-4o")  # what posting a message checks, before anything is queued
        assert [c.spec for c in plan(reg, None)] == ["ollama:llama3.2"]
        assert plan(reg, "offline")[0].provider.name == "offline"  # rules in this process: nothing leaves
        statuses = {s.name: s for s in reg.status()}
        assert not statuses["anthropic"].available and "local-only" in (statuses["anthropic"].reason or "")


def test_frugal_tries_the_fast_model_and_keeps_its_good_answer(fake: FakeLLM) -> None:
    fake.add("claude-haiku-4-6", {"steps": [{"text": ["Quick ", "answer."]}]})
    got, routed = run(registry(fake.url, default_provider="anthropic", mode="frugal"), None)
    assert [c.text for c in got if isinstance(c, TextChunk)] == ["Quick answer."]  # held, then released whole
    assert [a.spec for a in routed.attempts] == ["anthropic:claude-haiku-4-6"]
    assert fake.requests[-1].body["system"] == "sys" + FRUGAL_HINT
    assert plan(registry(fake.url, mode="frugal"), "anthropic:claude-opus-4-6")[0].fast is None  # pinned


@pytest.mark.parametrize("fast_step", [
    {"text": ["A partial ", "answer"], "stop_reason": "max_tokens"},
    {"text": [NEED_MORE_CONTEXT]},
    {"faults": [{"status": 400, "message": "prompt is too long"}]},
])
def test_frugal_escalates_to_the_full_model_without_showing_the_fast_attempt(fake: FakeLLM, fast_step: dict) -> None:
    fake.add("gpt-4o-mini", {"steps": [{**fast_step, "usage": {"input_tokens": 100, "output_tokens": 50}}]})
    fake.add("gpt-5", {"steps": [{"text": ["The full ", "answer."]}]})
    got, routed = run(registry(fake.url, default_provider="openai", mode="frugal"), None)
    warning = next(c for c in got if isinstance(c, WarningChunk))
    assert warning.code == "frugal_escalation" and "openai:gpt-5 answers instead" in warning.message
    assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "The full answer."
    fast, full = routed.attempts
    assert fast.fast and not full.fast and routed.answered is full
    assert fake.requests[-1].body["messages"][0]["content"] == "sys"  # no frugal hint for the full model
    if "faults" not in fast_step:
        assert fast.cost_usd > 0  # the escalated call was billed and is counted


def test_a_fast_model_that_runs_past_the_answer_cap_is_cut_off_and_the_full_model_answers(fake: FakeLLM) -> None:
    fake.add("gpt-4o-mini", {"steps": [{"text": ["x" * 600] * 4}]})  # 2,400 characters, held back
    fake.add("gpt-5", {"steps": [{"text": ["The full ", "answer."]}]})
    got, routed = run(registry(fake.url, default_provider="openai", mode="frugal", max_answer_chars=1000), None)
    warning = next(c for c in got if isinstance(c, WarningChunk))
    assert warning.code == "frugal_escalation" and "openai:gpt-5 answers instead" in warning.message
    assert "".join(c.text for c in got if isinstance(c, TextChunk)) == "The full answer."
    fast, full = routed.attempts
    assert fast.fast and fast.error is not None and fast.error.code == "stream_invalid" and routed.answered is full


def test_a_configured_default_model_is_not_pinned_so_frugal_still_applies(fake: FakeLLM) -> None:
    reg = registry(fake.url, default_model="anthropic:claude-opus-4-6", mode="frugal")
    [head, *_] = plan(reg, None)
    assert head.spec == "anthropic:claude-opus-4-6" and head.fast is not None and head.fast.id == "claude-haiku-4-6"
    assert plan(reg, "anthropic:claude-opus-4-6")[0].fast is None  # named by the caller: pinned
    assert plan(reg, "anthropic")[0].fast is not None  # a provider named, not a model


@pytest.mark.parametrize("default_model", ["claude-opus-4-6", "anthropic:claude-opus-4-6"])
def test_local_only_skips_a_configured_cloud_default_for_the_local_provider(fake: FakeLLM, default_model: str) -> None:
    reg = registry(fake.url, default_provider="anthropic", default_model=default_model, mode="local-only")
    assert [c.spec for c in plan(reg, None)] == ["ollama:llama3.2"]
    assert reg.resolve(None).spec == "ollama:llama3.2"
    with pytest.raises(ProviderUnavailable, match="local-only"):
        plan(reg, "anthropic:claude-opus-4-6")  # named by the caller: refused, not rerouted


def test_a_failed_call_keeps_what_it_was_billed(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": ["The deploy "], "usage": {"input_tokens": 5000,
                                                                               "output_tokens": 2},
                                            "stream_error": {"type": "api_error", "message": "Internal"}}]})
    got, routed = run(registry(fake.url, default_provider="anthropic"), None)
    assert isinstance(got[-1], ProviderError)
    [attempt] = routed.attempts
    assert attempt.error is not None and attempt.usage.input_tokens == 5000
    assert attempt.cost_usd == pytest.approx(5000 * 15 / 1e6, rel=0.01)


def test_a_cancelled_call_keeps_what_it_was_billed(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": [f"w{i} " for i in range(100)], "delay_ms": 20,
                                            "usage": {"input_tokens": 7000, "output_tokens": 50}}]})
    reg = registry(fake.url, default_provider="anthropic")
    routed = RoutedStream(plan(reg, None), CompletionRequest(messages=(UserMessage(content="q"),)), reg.settings.llm)
    seen: list[Any] = []

    async def consume() -> None:
        async with aclosing(routed.stream()) as chunks:
            async for chunk in chunks:
                seen.append(chunk)

    async def go() -> None:
        try:
            task = asyncio.ensure_future(consume())
            while len(seen) < 2:
                await asyncio.sleep(0.005)
            task.cancel()  # what a step timeout does
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await reg.aclose()

    asyncio.run(go())
    [attempt] = routed.attempts
    assert attempt.error is not None and attempt.error.code == "cancelled"
    assert attempt.usage.input_tokens == 7000 and attempt.cost_usd > 0


def test_the_pseudo_tools_warning_is_said_once_per_step(fake: FakeLLM) -> None:
    fake.add("tiny", {"native_tools": False, "steps": [{"faults": [{"status": 500}], "text": [NEED_MORE_CONTEXT]}]})
    fake.add("small", {"native_tools": False, "steps": [{"text": ["answer"]}]})
    settings = Settings(llm={"mode": "frugal", "default_provider": "ollama", "providers": {
        "ollama": vendor_config("ollama", fake.url, model="small", fast_model="tiny")}})
    reg = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    request = CompletionRequest(messages=(UserMessage(content="q"),), tools=(ToolSchema(
        name="get_logs", description="d", input_schema={"type": "object"}),))
    routed = RoutedStream(plan(reg, None), request, reg.settings.llm)

    async def go() -> list[Any]:
        try:
            return [c async for c in routed.stream()]
        finally:
            await reg.aclose()

    got = asyncio.run(go())
    codes = [c.code for c in got if isinstance(c, WarningChunk)]
    assert codes.count("pseudo_tools") == 1 and "frugal_escalation" in codes  # retried, then escalated
    assert [a.spec for a in routed.attempts] == ["ollama:tiny", "ollama:small"]


SECRET = "api_key=sk-live-abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize(("provider", "scrubbed"), [("anthropic", True), ("ollama", False)])
def test_redact_secrets_scrubs_what_goes_to_cloud_providers(fake: FakeLLM, provider: str, scrubbed: bool) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": ["ok"]}], "loop": True})
    fake.add("llama3.2", {"steps": [{"text": ["ok"]}], "loop": True})
    reg = registry(fake.url, default_provider=provider)
    history = (UserMessage(content=f"my config says {SECRET}"),
               AssistantMessage(content="Checking.", tool_calls=(ToolCall(id="c1", name="get_logs", arguments={
                   "query": f"grep {SECRET}"}),)),
               ToolMessage(result=ToolResult(call_id="c1", name="get_logs", content={"lines": [SECRET]})))
    routed = RoutedStream(plan(reg, None), CompletionRequest(messages=history), reg.settings.llm)

    async def go() -> None:
        try:
            async for _ in routed.stream():
                pass
        finally:
            await reg.aclose()

    asyncio.run(go())
    sent = str(fake.requests[-1].body)
    assert ("sk-live-abcdefghij" not in sent) is scrubbed
    assert ("[REDACTED]" in sent) is scrubbed
    assert "my config says" in sent and "get_logs" in sent
