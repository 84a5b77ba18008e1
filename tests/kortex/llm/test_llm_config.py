"""The [llm] tables of rfc-005 §5.1 from kortex.toml and KORTEX_* variables, down to the providers."""

from __future__ import annotations

from pathlib import Path

import pytest

from kortex.config import load_settings
from kortex.errors import ConfigError
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import plan

# rfc-005 §5.1, verbatim but for the names of the key variables.
TOML = '''
# kortex.toml — LLM section

[llm]
default_provider  = "anthropic"
fallback_providers = ["openai", "ollama"]
mode              = "normal"            # "normal" | "frugal" | "local-only"
max_tool_depth    = 8
session_idle_ttl  = "168h"              # 7 days

[llm.providers.anthropic]
api_key     = "${TEST_ANTHROPIC_KEY}"
model       = "claude-opus-4-6"
fast_model  = "claude-haiku-4-6"        # used in frugal mode
max_tokens  = 4096
timeout     = "60s"
base_url    = "https://api.anthropic.com"

[llm.providers.openai]
api_key     = "${TEST_OPENAI_KEY}"
model       = "gpt-5"
fast_model  = "gpt-4o-mini"
max_tokens  = 4096
timeout     = "60s"
base_url    = "https://api.openai.com"

[llm.providers.ollama]
endpoint    = "https://ollama.internal.example:11434"
model       = "llama3:70b"
fast_model  = "llama3:8b"
timeout     = "120s"

[llm.budget]
daily_usd_limit       = 50.00
per_user_hourly_limit = 30
per_session_token_cap = 200000
alert_at_pct          = 80              # email admin at 80% of daily limit

[llm.privacy]
redact_pii          = true              # apply PII redactors before send
redact_secrets      = true              # apply secret-pattern redactors
local_only          = false             # if true, force ollama regardless
audit_every_call    = true
do_not_retain_default = false
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
    # Every key of the example is accepted; what is not enforced yet is said, not hidden.
    assert llm.session_idle_ttl == 168 * 3600 and llm.budget.per_user_hourly_limit == 30
    assert llm.budget.alert_at_pct == 80 and llm.budget.daily_usd_limit == 50
    assert llm.privacy.redact_secrets and llm.privacy.redact_pii and llm.privacy.audit_every_call
    assert [u.split(" ")[0] for u in llm.unenforced()] == [
        "llm.session_idle_ttl", "llm.budget.per_user_hourly_limit", "llm.budget.alert_at_pct",
        "llm.privacy.redact_pii"]


def test_settings_that_are_not_enforced_yet_are_announced_at_startup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, sqlite_url: str) -> None:
    from kortex.container import Kortex

    (tmp_path / "kortex.toml").write_text(TOML)
    monkeypatch.setenv("KORTEX_DATABASE_URL", sqlite_url)
    with caplog.at_level("WARNING", logger="kortex.container"):
        k = Kortex.create(load_settings())
        k.close()
    said = caplog.text
    for key in ("session_idle_ttl", "per_user_hourly_limit", "alert_at_pct", "redact_pii"):
        assert f"{key}" in said and "not enforced yet" in said
    assert "llm.privacy.redact_secrets" not in said  # that one is enforced


def test_audit_every_call_cannot_be_turned_off(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text("[llm.privacy]\naudit_every_call = false\n")
    with pytest.raises(ConfigError, match="llm.privacy.audit_every_call: .*every LLM call"):
        load_settings()


def test_a_misspelt_secret_key_is_named_but_its_value_never_shown(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text('[llm.providers.openai]\napikey = "sk-live-VERYSECRET0123456789"\n'
                                          'timeout = "sk-live-OTHERSECRET012345"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "llm.providers.openai.apikey" in message and "llm.providers.openai.timeout" in message
    assert "VERYSECRET" not in message and "OTHERSECRET" not in message


@pytest.mark.parametrize("line", ['timeout = 0', 'connect_timeout = "0s"', 'timeout = -5'])
def test_timeouts_must_be_positive(tmp_path: Path, line: str) -> None:
    (tmp_path / "kortex.toml").write_text(f"[llm.providers.anthropic]\n{line}\n")
    with pytest.raises(ConfigError, match="timeout"):
        load_settings()


@pytest.mark.parametrize(("llm", "where"), [
    ({"default_provider": "antrhopic"}, "llm.default_provider"),
    ({"fallback_providers": ["openai", "olama"]}, "llm.fallback_providers[1]"),
    ({"default_model": "opnai:gpt-4o"}, "llm.default_model"),
])
def test_provider_names_in_the_configuration_must_exist(llm: dict, where: str) -> None:
    from kortex.config import Settings

    with pytest.raises(ConfigError) as caught:
        ProviderRegistry(Settings(llm=llm), BUILTIN_PROVIDERS)
    assert where in str(caught.value) and "known: offline, anthropic" in str(caught.value)


def test_bad_provider_settings_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text('[llm.providers.openai.prices]\n"gpt-5" = { inptu = 1.0 }\n')
    with pytest.raises(ConfigError, match="model 1 of prices"):
        load_settings()
    (tmp_path / "kortex.toml").write_text('[llm]\nhttp_transport = "curl"\n')
    with pytest.raises(ConfigError):
        load_settings()
