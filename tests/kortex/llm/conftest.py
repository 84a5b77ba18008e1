"""Fixtures for provider tests: the fake LLM server, and adapters pointed at it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from kortex.config import ProviderSettings, Settings
from kortex.llm import anthropic, http, ollama, openai
from kortex.llm.base import CompletionRequest, Provider, ToolSchema
from kortex.messages import UserMessage
from kortex.testing.fakellm import FakeLLM

VENDORS = ("anthropic", "openai", "ollama")
TRANSPORTS = ("httpx", "aiohttp")
TOOLS = (ToolSchema(name="get_logs", description="Read logs", input_schema={
    "type": "object", "properties": {"product": {"type": "string"}, "time_range": {"type": "string"}},
    "required": ["product"]}),)
FAST_RETRY = {"retry_base": 0.001, "retry_max_wait": 5, "retry_budget": 5}


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Adapter tests that take it run on both HTTP transports (llm.http_transport)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Backoff waits the adapters asked for (not slept: the tests stay fast)."""
    asked: list[float] = []

    async def record(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(http, "sleep", record)
    return asked


@pytest.fixture(autouse=True)
def _no_vendor_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's real keys must never reach a test (or a vendor)."""
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def vendor_config(vendor: str, url: str, **extra: Any) -> dict[str, Any]:
    """``[llm.providers.<vendor>]`` pointing at the fake server at ``url``."""
    base: dict[str, Any] = {"anthropic": {"api_key": "test-key", "base_url": url},
                            "openai": {"api_key": "test-key", "base_url": url + "/v1"},
                            "ollama": {"endpoint": url, "model": "llama3.2"}}[vendor]
    return {**base, **FAST_RETRY, **extra}




def make_provider(vendor: str, url: str, *, transport: str | None = None, **extra: Any) -> Provider:
    """An adapter on ``transport`` (``llm.http_transport``), by default the configuration's default."""
    factory = {"anthropic": anthropic.create, "openai": openai.create, "ollama": ollama.create}[vendor]
    settings = Settings(llm={"http_transport": transport} if transport else {})
    return factory(vendor, ProviderSettings(**vendor_config(vendor, url, **extra)), settings)


def model_of(vendor: str) -> str:
    return {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "ollama": "llama3.2"}[vendor]


def request(vendor: str, *messages: Any, tools: tuple[ToolSchema, ...] = TOOLS, **extra: Any) -> CompletionRequest:
    return CompletionRequest(model=model_of(vendor), system="You investigate.",
                             messages=messages or (UserMessage(content="why is checkout slow?"),), tools=tools,
                             **extra)


def collect(provider: Provider, req: CompletionRequest) -> list[Any]:
    async def run() -> list[Any]:
        try:
            return [chunk async for chunk in provider.stream(req)]
        finally:
            await provider.aclose()
    return asyncio.run(run())
