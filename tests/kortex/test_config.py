from __future__ import annotations

from pathlib import Path

import pytest

from kortex.config import load_settings
from kortex.errors import ConfigError


def test_toml_env_and_secret_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kortex.toml").write_text(
        '[llm]\ndefault_provider = "anthropic"\nmax_tool_depth = 5\n'
        '[llm.providers.anthropic]\napi_key = "${TEST_ANTHROPIC_KEY}"\ntimeout = "90s"\n'
        '[llm.providers.openai]\napi_key = "${UNSET_OPENAI_KEY}"\n'
        '[llm.tools.get_logs]\ntimeout = "2m"\n')
    monkeypatch.setenv("TEST_ANTHROPIC_KEY", "sk-test-123")
    monkeypatch.setenv("KORTEX_LLM__MAX_TOOL_DEPTH", "3")
    s = load_settings()
    assert s.llm.default_provider == "anthropic" and s.llm.max_tool_depth == 3  # env beats the file
    anthropic = s.llm.providers["anthropic"]
    assert anthropic.api_key is not None and anthropic.api_key.get_secret_value() == "sk-test-123"
    assert "sk-test-123" not in repr(s)  # secrets never show up in reprs or logs
    assert anthropic.timeout == 90 and s.tool_timeout("get_logs") == 120
    assert s.llm.providers["openai"].api_key is None  # unset: unavailable, not an error
    assert s.embedded and s.effective_broker_url.startswith("memory://")


def test_bad_configuration_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kortex.toml").write_text('[llm]\nmode = "reckless"\n')
    with pytest.raises(ConfigError):
        load_settings()
    monkeypatch.setenv("KORTEX_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError):
        load_settings()
