from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from kortex.config import Settings, load_settings
from kortex.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


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


def test_telemetry_sources_are_chosen_by_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       sqlite_url: str) -> None:
    from kortex.container import Kortex
    from kortex.telemetry.embedded import EmbeddedTelemetry
    from kortex.telemetry.loki import LokiLogs
    from kortex.telemetry.prometheus import PrometheusMetrics

    (tmp_path / "kortex.toml").write_text(
        '[telemetry]\nmetrics = "prometheus"\nlogs = "loki"\n'
        '[telemetry.prometheus]\nurl = "${TEST_PROM_URL}"\ntenant_label = "tenant"\ntimeout = "3s"\n'
        '[telemetry.loki]\nurl = "http://loki:3100"\n')
    monkeypatch.setenv("TEST_PROM_URL", "http://prometheus:9090")
    monkeypatch.setenv("KORTEX_DATABASE_URL", sqlite_url)
    k = Kortex.create(load_settings())
    try:
        assert isinstance(k.sources.metrics, PrometheusMetrics) and k.sources.metrics.timeout == 3
        assert k.sources.metrics.tenant_label == "tenant"
        assert isinstance(k.sources.logs, LokiLogs) and isinstance(k.sources.deploys, EmbeddedTelemetry)
    finally:
        k.close()
    monkeypatch.delenv("TEST_PROM_URL")  # an unresolved URL: the source cannot be built
    with pytest.raises(ConfigError, match="telemetry.prometheus.url"):
        Kortex.create(load_settings())
    (tmp_path / "kortex.toml").write_text('[telemetry]\nmetrics = "graphite"\n')
    with pytest.raises(ConfigError):
        load_settings()


def test_the_shipped_example_configuration_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "kortex.toml.example"
    monkeypatch.setenv("KORTEX_CONFIG", str(example))
    s = load_settings()
    assert s.llm.default_provider == "offline" and s.tools.allowed and s.turn.step_lease == 60


def test_tool_timeouts_must_be_positive_and_doubtful_ones_are_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from kortex.container import Kortex

    (tmp_path / "kortex.toml").write_text('[llm.tools.get_logs]\ntimeout = 0\n')
    with pytest.raises(ConfigError, match="longer than zero"):
        load_settings()
    (tmp_path / "kortex.toml").write_text('[llm.tools.get_logz]\ntimeout = "10s"\n'
                                          '[llm.tools.get_recent_deploys]\ntimeout = "10m"\n')
    monkeypatch.setenv("KORTEX_DATABASE_URL", sqlite_url)
    with caplog.at_level(logging.WARNING, logger="kortex.container"):
        k = Kortex.create(load_settings())
    try:
        assert k.pipeline.limits_for("get_recent_deploys") == (60.0, 60.0)  # clamped to the analysis ceiling
    finally:
        k.close()
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "get_logz] configures a tool that does not exist" in warnings
    assert "get_recent_deploys] timeout 600s is above its category's ceiling; 60s applies" in warnings


def test_unknown_keys_are_refused_with_the_likely_one_named_and_no_value_shown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kortex.toml").write_text('databse_url = "sqlite:///x.db"\n[llmm]\nmax_tool_depth = 3\n')
    with pytest.raises(ConfigError) as top:
        load_settings()
    assert "unknown key 'databse_url' (did you mean 'database_url'?)" in str(top.value)
    assert "unknown key 'llmm' (did you mean 'llm'?)" in str(top.value)
    (tmp_path / "kortex.toml").write_text(
        '[llm]\nmax_tool_dept = 3\n[llm.providers.anthropic]\napi_kye = "sk-ant-api03-abcdefghijklmnop"\n'
        '[turn]\nzzz = 1\n')
    with pytest.raises(ConfigError) as nested:
        load_settings()
    text = str(nested.value)
    assert "llm.max_tool_dept: unknown key (did you mean 'max_tool_depth'?)" in text
    assert "llm.providers.anthropic.api_kye: unknown key (did you mean 'api_key'?)" in text
    assert "turn.zzz: unknown key" in text and "turn.zzz: unknown key (" not in text  # nothing close
    assert "sk-ant" not in text  # a misspelt key often holds a secret
    (tmp_path / "kortex.toml").unlink()
    monkeypatch.setenv("KORTEX_TURN__DEADLIN", "5")
    with pytest.raises(ConfigError, match=r"turn.deadlin: unknown key \(did you mean 'deadline'\?\)"):
        load_settings()
    monkeypatch.delenv("KORTEX_TURN__DEADLIN")
    monkeypatch.setenv("KORTEX_SOMETHING_ELSE", "1")  # the prefix is shared at the top level: not ours to refuse
    assert load_settings().embedded


def test_connection_urls_keep_their_password_for_consumers_and_hide_it_wherever_settings_show(
        monkeypatch: pytest.MonkeyPatch) -> None:
    urls = {"KORTEX_DATABASE_URL": "postgresql://kortex:DbPw-s3cret@db:5432/kortex",
            "KORTEX_REDIS_URL": "redis://:RedisPw-s3cret@redis:6379/0",
            "KORTEX_BROKER_URL": "amqp://kortex:Broker/Pw@s3cret@rabbit:5672//",  # unescaped / and @
            "KORTEX_TELEMETRY__LOKI__URL": "http://reader:LokiPw-s3cret@loki:3100"}
    for name, url in urls.items():
        monkeypatch.setenv(name, url)
    s = load_settings()
    assert (s.database_url, s.redis_url, s.broker_url) == (
        urls["KORTEX_DATABASE_URL"], urls["KORTEX_REDIS_URL"], urls["KORTEX_BROKER_URL"])
    assert s.effective_database_url == urls["KORTEX_DATABASE_URL"] and s.telemetry.loki.url == urls[
        "KORTEX_TELEMETRY__LOKI__URL"]
    shown = "\n".join([repr(s), str(s), s.model_dump_json(), str(s.model_dump()), repr(s.telemetry),
                       str(s.telemetry.loki), s.telemetry.model_dump_json()])
    assert "s3cret" not in shown
    assert "postgresql://kortex:[REDACTED]@db:5432/kortex" in shown  # where it points is still said
    assert "redis://:[REDACTED]@redis:6379/0" in shown and "amqp://kortex:[REDACTED]@rabbit:5672//" in shown
    query = Settings(database_url="postgresql://db/kortex?user=k&password=QueryPw-s3cret&sslmode=require")
    assert "s3cret" not in repr(query) + query.model_dump_json() and "sslmode=require" in repr(query)
    plain = Settings(database_url="sqlite:////var/lib/kortex.db", redis_url="redis://redis:6379/0")
    assert "database_url='sqlite:////var/lib/kortex.db', redis_url='redis://redis:6379/0'" in repr(plain)


SECRET = "corp-SECRETVALUE-1234"


@pytest.mark.parametrize("toml", [
    '[llm.providers.openai]\nmax_retries = "corp-SECRETVALUE-1234"\n',
    '[llm.routing]\ncandidates = ["anthropic::claude-haiku-4-6", "corp-SECRETVALUE-1234"]\n',
    '[llm.routing]\nrequired_capabilities = ["corp-SECRETVALUE-1234"]\n',
    '[llm.routing.models."corp-SECRETVALUE-1234"]\ntier = "fast"\n',
    '[llm.anomalies]\nactions = { "corp-SECRETVALUE-1234" = "retry" }\n',
    '[llm.providers.openai]\nprices = { "corp-SECRETVALUE-1234" = { inptu = 1.0 } }\n',
    '[llm.providers.openai]\ntimeout = "corp-SECRETVALUE-1234"\n',
])
def test_a_configuration_error_names_the_setting_and_never_carries_the_value(tmp_path: Path, toml: str) -> None:
    (tmp_path / "kortex.toml").write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    error = caught.value
    # Nothing chained either: a server that fails to load prints the whole traceback.
    assert error.__cause__ is None and error.__context__ is None
    assert SECRET not in "".join(traceback.format_exception(error))
    assert "invalid configuration: llm." in str(error)


def test_a_validator_that_quotes_its_input_has_it_taken_out_of_the_description() -> None:
    from pydantic import BaseModel, ValidationError, field_validator

    from kortex.config_errors import describe_errors

    class Section(BaseModel):
        region: str
        zones: list[str] = []

        @field_validator("region", "zones")
        @classmethod
        def _careless(cls, value: object) -> object:
            raise ValueError(f"{value!r} is not a region we know; try eu-west or eu-westish")

    with pytest.raises(ValidationError) as caught:
        Section(region=SECRET, zones=["eu-wes"])
    text = describe_errors(caught.value, Section)
    assert SECRET not in text and "region: Value error, '[value]' is not a region" in text
    assert "try eu-west or eu-westish" in text  # a known name that starts like the input stays whole


def test_an_unknown_anomaly_kind_is_named_by_position_with_the_likely_one(tmp_path: Path) -> None:
    (tmp_path / "kortex.toml").write_text('[llm.anomalies]\nactions = { chain_depth = "escalate", cost_overun = "retry" }\n')
    with pytest.raises(ConfigError, match=r"unknown anomaly kind: entry 2 \(did you mean 'cost_overrun'\?\)"):
        load_settings()


@pytest.mark.parametrize("entry", [
    [sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app", "--port", "0"],
    [sys.executable, "-m", "celery", "-A", "workers.app", "inspect", "ping"],
], ids=["api", "workers"])
@pytest.mark.parametrize("source", ["toml", "env"])
def test_servers_that_fail_on_a_bad_configuration_never_print_the_value(
        tmp_path: Path, entry: list[str], source: str) -> None:
    """The servers' own entry points, as deployed: they print the traceback of the failed load."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env["XDG_DATA_HOME"] = str(tmp_path)
    key = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
    if source == "toml":
        (tmp_path / "kortex.toml").write_text(
            f'[llm.providers.openai]\napikey = "{key}"\nmax_retries = "{SECRET}"\n')
        env["KORTEX_CONFIG"] = str(tmp_path / "kortex.toml")
    else:
        key = SECRET
        env["KORTEX_LLM__PROVIDERS__OPENAI__APIKEY"] = key
    run = subprocess.run(entry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    said = run.stdout + run.stderr
    assert run.returncode != 0
    assert "llm.providers.openai.apikey: unknown key (did you mean 'api_key'?)" in said
    assert key not in said and SECRET not in said and "input_value" not in said
