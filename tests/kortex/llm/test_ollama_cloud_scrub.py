"""Whether a conversation leaves the operator's network is a question about the model, not the
provider: a local Ollama hands its ``:cloud`` models (``gpt-oss:120b-cloud``) to ollama.com,
and an Ollama endpoint off the network (ollama.com itself, with an ``api_key``) serves every
model there. Such requests are scrubbed of credentials (``llm.privacy.redact_secrets``), refused
in local-only mode, and never listed as local."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kortex.config import Settings
from kortex.errors import ProviderUnavailable
from kortex.llm.base import CompletionRequest
from kortex.llm.ollama import on_private_network
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import RoutedStream, plan
from kortex.messages import UserMessage
from kortex.testing.fakellm import FakeLLM

CLOUD_MODEL = "gpt-oss:120b-cloud"
LOCAL_MODEL = "llama3.2:latest"
PASSWORD = "Hunter2-audit-9f3c"
KORTEX_KEY = "kx_0123456789ab_AbCdEfGhIjKlMnOpQrStUvWx"
PASTED = f"checkout is slow; db password={PASSWORD}, my Kortex key is {KORTEX_KEY}"


def _registry(ollama: dict[str, Any], **llm: Any) -> ProviderRegistry:
    settings = Settings.model_validate({"llm": {**llm, "providers": {"ollama": {"max_retries": 0, **ollama}}}})
    return ProviderRegistry(settings, BUILTIN_PROVIDERS)


def _sent_for(fake: FakeLLM, model: str) -> str:
    """The body of the one /api/chat request a routed step for ``ollama:<model>`` made."""
    fake.add(model, {"steps": [{"text": ["ok"]}], "loop": True})
    reg = _registry({"endpoint": fake.url, "model": model})
    routed = RoutedStream(plan(reg, f"ollama:{model}"), CompletionRequest(messages=(UserMessage(content=PASTED),)),
                          reg.settings.llm)

    async def go() -> None:
        try:
            async for _ in routed.stream():
                pass
        finally:
            await reg.aclose()

    asyncio.run(go())
    [chat] = [r for r in fake.requests if r.path == "/api/chat"]
    assert chat.body["model"] == model
    return json.dumps(chat.body)


def test_a_conversation_sent_to_an_ollama_cloud_model_is_scrubbed(fake: FakeLLM) -> None:
    fake.ollama_models = [CLOUD_MODEL]
    sent = _sent_for(fake, CLOUD_MODEL)  # the local server passes it on to ollama.com
    assert "checkout is slow" in sent
    assert PASSWORD not in sent and KORTEX_KEY not in sent, sent


def test_a_local_model_of_the_same_server_gets_the_conversation_as_written(fake: FakeLLM) -> None:
    fake.ollama_models = [LOCAL_MODEL, CLOUD_MODEL]
    sent = _sent_for(fake, LOCAL_MODEL)
    assert PASSWORD in sent and KORTEX_KEY in sent  # it never leaves this machine


def test_every_model_of_an_ollama_endpoint_off_the_network_is_scrubbed() -> None:
    # OLLAMA pointed at ollama.com with a key: no model of it is local, cloud tag or not
    reg = _registry({"endpoint": "https://ollama.com", "api_key": "ollama-test-key", "model": "gpt-oss:120b"})
    [candidate] = plan(reg, "ollama:gpt-oss:120b")
    routed = RoutedStream([candidate], CompletionRequest(messages=(UserMessage(content=PASTED),)), reg.settings.llm)
    sent = routed.request_for(candidate.provider, candidate.model, fast=False)  # what the provider is handed
    text = json.dumps([m.model_dump(mode="json") for m in sent.messages])
    assert "checkout is slow" in text and PASSWORD not in text and KORTEX_KEY not in text, text
    asyncio.run(reg.aclose())


@pytest.mark.parametrize(("url", "private"), [
    ("http://127.0.0.1:11434", True), ("http://localhost:11434", True), ("http://[::1]:11434", True),
    ("http://10.1.2.3:11434", True), ("http://192.168.1.20", True), ("http://100.101.102.103:11434", True),
    ("http://ollama:11434", True), ("http://gpu-box.lan:11434", True), ("http://host.docker.internal:11434", True),
    ("https://ollama.com", False), ("https://gpu.example.com:11434", False), ("http://8.8.8.8:11434", False),
    ("http://user:pass@ollama.com", False), ("not a url", False),
])
def test_which_endpoints_are_on_the_operators_network(url: str, private: bool) -> None:
    assert on_private_network(url) is private


def test_the_listing_never_calls_an_off_network_model_local(fake: FakeLLM) -> None:
    fake.ollama_models = [LOCAL_MODEL, CLOUD_MODEL]
    reg = _registry({"endpoint": fake.url, "model": LOCAL_MODEL})
    remote = _registry({"endpoint": "https://ollama.com", "api_key": "ollama-test-key", "model": "gpt-oss:120b"})

    async def statuses() -> tuple[Any, Any]:
        try:
            return reg.status(await reg.probe()), remote.status({})
        finally:
            await reg.aclose()
            await remote.aclose()

    here, there = (next(s for s in found if s.name == "ollama") for found in asyncio.run(statuses()))
    names = {m.id: m.display_name for m in here.models}
    assert here.local and names[LOCAL_MODEL] == f"{LOCAL_MODEL} (local)"
    assert "local" not in names[CLOUD_MODEL] and "ollama.com" in names[CLOUD_MODEL]
    assert there.available and not there.local
    assert all("local" not in m.display_name and "ollama.com" in m.display_name for m in there.models)


def test_local_only_refuses_an_ollama_endpoint_off_the_network() -> None:
    reg = _registry({"endpoint": "https://ollama.com", "api_key": "ollama-test-key", "model": "gpt-oss:120b"},
                    mode="local-only", default_provider="ollama")
    with pytest.raises(ProviderUnavailable) as caught:
        plan(reg, "ollama:gpt-oss:120b")
    assert caught.value.code == "local_only" and "ollama.com" in caught.value.message
    [status] = [s for s in reg.status({}) if s.name == "ollama"]
    assert not status.available and not status.local and "local-only" in (status.reason or "")
    with pytest.raises(ProviderUnavailable):
        reg.resolve(None)  # the configured default gives way to the local provider, which is not local either
