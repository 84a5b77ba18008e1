"""The [llm] tables of rfc-005 §5.1 from kortex.toml and KORTEX_* variables, down to the providers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kortex.config import load_settings
from kortex.errors import ConfigError
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import plan

TOML = '''
[llm]
default_provider  = "anthropic"
fallback_providers = ["openai", "ollama"]
mode              = "normal"
max_tool_depth    = 8

[llm.providers.anthropic]
api_key     = "${TEST_ANTHROPIC_KEY}"
model       = "claude-opus-4-6"
fast_model  = "claude-haiku-4-6"
max_tokens  = 4096
timeout     = "60s"
base_url    = "https://api.anthropic.com"

[llm.providers.openai]
api_key     = "${TEST_OPENAI_KEY}"
model       = "gpt-5"
fast_model  = "gpt-4o-mini"
timeout     = "60s"
base_url    = "https://api.openai.com"

[llm.providers.ollama]
endpoint    = "https://ollama.internal.example:11434"
model       = "llama3:70b"
fast_model  = "llama3:8b"
timeout     = "120s"

[llm.privacy]
local_only  = false
'''


def test_the_rfc_example_configures_the_providers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kortex.toml").write_text(TOML)
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-ant-test")
    monkeypatch.delenv("TEST_OPENAI_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("KORTEX_LLM__MODE", "frugal")
    monkeypatch.setenv("KORTEX_LLM__PROVIDERS__ANTHROPIC__MAX_RETRIES", "5")
    settings = load_settings()
    llm = settings.llm
    assert llm.mode == "frugal" and llm.providers["anthropic"].max_retries == 5  # the environment wins
    assert llm.providers["ollama"].timeout == 120 and llm.providers["anthropic"].timeout == 60
    registry = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    chain = plan(registry, None)
    assert [(c.spec, c.fast.id if c.fast else None) for c in chain] == [
        ("anthropic:claude-opus-4-6", "claude-haiku-4-6"), ("ollama:llama3:70b", "llama3:8b")]  # openai: no key
    status = {s.name: s for s in registry.status()}
    assert status["anthropic"].available and not status["openai"].available
    assert "sk-ant-test" not in repr(settings) and "sk-ant-test" not in repr(status)
    ollama = registry.get("ollama")
    assert ollama.endpoint == "https://ollama.internal.example:11434"  # type: ignore[attr-defined]


def test_bad_provider_settings_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text('[llm.providers.openai.prices]\n"gpt-5" = { inptu = 1.0 }\n')
    with pytest.raises(ConfigError, match="prices.gpt-5"):
        load_settings()
    (tmp_path / "kortex.toml").write_text('[llm]\nhttp_transport = "curl"\n')
    with pytest.raises(ConfigError):
        load_settings()
