"""What a provider's HTTP client takes from its environment and refuses to send, the same on
both transports (``llm.http_transport``): proxies from the environment as httpx reads them,
never credentials from ``~/.netrc``, no retry of a URL that cannot be requested, one client per
event loop; and the read timeout of a streamed body, which counts the server's silence, not the
caller's own pauses."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kortex.errors import ProviderError
from kortex.llm.base import TextChunk
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import collect, make_provider, request
from tests.kortex.llm.test_adapters import texts


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_a_proxy_from_the_environment_carries_the_request(transport: str, fake: FakeLLM,
                                                          no_proxy_env: pytest.MonkeyPatch) -> None:
    # The fake stands in for the proxy: it gets the absolute URL of a host that does not exist,
    # knows no such path and says 404. Without the proxy the name would not resolve.
    no_proxy_env.setenv("HTTP_PROXY", fake.url)
    no_proxy_env.setenv("http_proxy", fake.url)
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("anthropic", "http://llm.invalid", transport=transport), request("anthropic"))
    assert caught.value.code == "provider_not_found" and caught.value.status == 404
    assert fake.stats.requests == 1


def test_no_proxy_bypasses_the_proxy(transport: str, fake: FakeLLM, no_proxy_env: pytest.MonkeyPatch) -> None:
    with FakeLLM() as gone:
        dead_proxy = gone.url  # nothing listens there any more
    no_proxy_env.setenv("HTTP_PROXY", dead_proxy)
    no_proxy_env.setenv("NO_PROXY", "127.0.0.1,localhost")
    fake.add("claude-sonnet-4-6", {"steps": [{"text": ["direct"]}]})
    assert texts(collect(make_provider("anthropic", fake.url, transport=transport), request("anthropic"))) == ["direct"]


def test_netrc_credentials_are_never_sent(transport: str, fake: FakeLLM, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # aiohttp's trust_env would add them as basic auth; httpx never reads ~/.netrc.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password hunter2\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    fake.add("claude-sonnet-4-6", {"steps": [{"text": ["ok"]}]})
    assert texts(collect(make_provider("anthropic", fake.url, transport=transport), request("anthropic"))) == ["ok"]
    assert "authorization" not in fake.requests[-1].headers


def test_a_url_that_cannot_be_requested_is_not_retried(transport: str, waits: list[float]) -> None:
    with pytest.raises(ProviderError) as caught:
        collect(make_provider("anthropic", "ftp://127.0.0.1:21", transport=transport), request("anthropic"))
    assert caught.value.code == "request_invalid" and not caught.value.retryable and waits == []


def test_a_provider_streams_from_one_event_loop_after_another(transport: str, fake: FakeLLM) -> None:
    """A forked worker child inherits the provider, not its loop: the client is made again."""
    fake.add("gpt-4o", {"loop": True, "steps": [{"text": ["again"]}]})
    provider = make_provider("openai", fake.url, transport=transport)

    async def once(close: bool) -> list[str]:
        try:
            return texts([c async for c in provider.stream(request("openai"))])
        finally:
            if close:
                await provider.aclose()

    assert asyncio.run(once(close=False)) == ["again"]
    assert asyncio.run(once(close=True)) == ["again"]
    assert fake.stats.connections == 2


@pytest.mark.parametrize("vendor", ["anthropic", "ollama"])
def test_a_stream_that_falls_silent_mid_answer_hits_the_read_timeout(transport: str, fake: FakeLLM,
                                                                     vendor: str) -> None:
    model = {"anthropic": "claude-sonnet-4-6", "ollama": "llama3.2"}[vendor]
    fake.add(model, {"steps": [{"text": ["first ", "late"], "tokens_per_s": 0.5}]})  # "late" 2 s after
    provider = make_provider(vendor, fake.url, transport=transport, timeout=0.3, max_retries=0)
    got: list[str] = []

    async def run() -> None:
        try:
            async for chunk in provider.stream(request(vendor)):
                if isinstance(chunk, TextChunk):
                    got.append(chunk.text)
        finally:
            await provider.aclose()

    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        asyncio.run(run())
    assert caught.value.code == "read_timeout" and caught.value.retryable and got == ["first "]
    assert time.monotonic() - started < 1.5  # the timeout, not the server, ended it


def test_a_caller_slower_than_the_read_timeout_is_not_timed_out(transport: str, fake: FakeLLM) -> None:
    fake.add("claude-sonnet-4-6", {"steps": [{"text": [f"t{i} " for i in range(4)]}]})  # all at once
    provider = make_provider("anthropic", fake.url, transport=transport, timeout=0.2, max_retries=0)

    async def run() -> list[str]:
        got: list[str] = []
        try:
            async for chunk in provider.stream(request("anthropic")):
                if isinstance(chunk, TextChunk):
                    got.append(chunk.text)
                    await asyncio.sleep(0.3)  # the engine busy elsewhere: the body waits in the buffer
        finally:
            await provider.aclose()
        return got

    assert asyncio.run(run()) == ["t0 ", "t1 ", "t2 ", "t3 "]
