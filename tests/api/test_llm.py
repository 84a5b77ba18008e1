"""GET /v1/llm/providers: what the deployment offers, with prices and availability, never secrets."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.main import create_app
from kortex.testing.fakellm import FakeLLM


def test_providers_models_prices_and_availability_without_secrets(harness_factory, monkeypatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OLLAMA_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEST_ANTHROPIC_SECRET", "sk-ant-very-secret")
    with FakeLLM(ollama_models=["llama3.2:latest", "qwen2.5:7b"]) as ollama_server:
        h = harness_factory(llm={"default_provider": "anthropic", "fallback_providers": ["ollama"], "providers": {
            "anthropic": {"api_key": "${TEST_ANTHROPIC_SECRET}", "prices": {"claude-sonnet-4-6": {"input": 2.5}}},
            "openai": {"api_key": "${TEST_UNSET_OPENAI_KEY}"},
            "ollama": {"endpoint": ollama_server.url, "model": "llama3.2:latest"}}})
        app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
        with TestClient(app) as client:
            assert client.get("/v1/llm/providers").status_code == 401
            key = h.api_key(h.tenant("acme"))
            response = client.get("/v1/llm/providers", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200
    assert "sk-ant-very-secret" not in response.text
    body = response.json()
    assert body["mode"] == "normal" and body["default_provider"] == "anthropic"
    assert body["fallback_providers"] == ["ollama"]
    by_name = {p["name"]: p for p in body["providers"]}
    assert set(by_name) >= {"offline", "anthropic", "openai", "ollama", "koder-ai", "scripted"}
    anthropic = by_name["anthropic"]
    assert anthropic["available"] and anthropic["default"] and not anthropic["local"]
    models = {m["id"]: m for m in anthropic["models"]}
    assert [m["id"] for m in anthropic["models"]] == ["claude-opus-4-6", "claude-sonnet-4-6", "claude-haiku-4-6"]
    assert models["claude-opus-4-6"] == {"id": "claude-opus-4-6", "display_name": "Claude Opus 4.6 (1M context)",
                                         "tier": "powerful", "context_tokens": 1_000_000, "supports_tools": True,
                                         "input_usd_per_mtok": 15.0, "output_usd_per_mtok": 75.0,
                                         "cache_read_usd_per_mtok": 1.5, "cache_write_usd_per_mtok": 18.75}
    assert anthropic["problems"] == []
    assert models["claude-sonnet-4-6"]["input_usd_per_mtok"] == 2.5  # the configured price wins
    openai = by_name["openai"]
    assert not openai["available"] and "OPENAI_API_KEY" in openai["reason"] and openai["models"] == []
    assert "not available yet" in by_name["koder-ai"]["reason"]
    ollama = by_name["ollama"]
    assert ollama["available"] and ollama["reachable"] and ollama["local"]
    assert [m["id"] for m in ollama["models"]] == ["llama3.2:latest", "qwen2.5:7b"]
    assert all(m["input_usd_per_mtok"] == 0 for m in ollama["models"])


def test_an_unreachable_ollama_is_listed_as_such(harness_factory) -> None:
    with FakeLLM() as gone:
        url = gone.url
    h = harness_factory(llm={"providers": {"ollama": {"endpoint": url, "connect_timeout": 0.5}}})
    app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app) as client:
        key = h.api_key(h.tenant("acme"))
        body = client.get("/v1/llm/providers", headers={"Authorization": f"Bearer {key}"}).json()
    ollama = next(p for p in body["providers"] if p["name"] == "ollama")
    assert not ollama["available"] and ollama["reachable"] is False and "unreachable" in ollama["reason"]
    offline = next(p for p in body["providers"] if p["name"] == "offline")
    assert offline["available"] and offline["default"] and offline["synthetic"]


def test_configuration_problems_are_shown_without_making_the_provider_unavailable(harness_factory) -> None:
    h = harness_factory(llm={"default_provider": "anthropic", "providers": {
        "anthropic": {"api_key": "test-key", "model": "claude-opus-4-7", "fast_model": "claude haiku"}}})
    app = create_app(h.settings, dispatch=lambda handoff: None, embedded_worker=False)
    with TestClient(app) as client:
        key = h.api_key(h.tenant("acme"))
        body = client.get("/v1/llm/providers", headers={"Authorization": f"Bearer {key}"}).json()
    anthropic = next(p for p in body["providers"] if p["name"] == "anthropic")
    assert anthropic["available"] and anthropic["models"][0]["id"] == "claude-opus-4-7"
    problems = " ".join(anthropic["problems"])
    assert "claude-opus-4-7" in problems and "$0" in problems and "fast_model" in problems
