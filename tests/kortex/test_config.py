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
    monkeypatch.setenv("KORTEX_SOMETHING_ELSE", "1")
    with pytest.raises(ConfigError, match="KORTEX_SOMETHING_ELSE is not a setting"):
        load_settings()


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


@pytest.mark.parametrize(("name", "value"), [
    ("KORTEX_TURN__DEADLINE", "-5"), ("KORTEX_TURN__DEADLINE", "0"), ("KORTEX_TURN__DEADLINE", "inf"),
    ("KORTEX_TURN__DEADLINE", "nan"), ("KORTEX_TURN__DEADLINE", "1e12"), ("KORTEX_TURN__STEP_LEASE", "0"),
    ("KORTEX_TURN__WATCHDOG_EVERY", "0"), ("KORTEX_TURN__HEARTBEAT", "0"), ("KORTEX_TURN__STREAM_TTL", "0"),
    ("KORTEX_TURN__STEP_TIME_LIMIT", "0"), ("KORTEX_TURN__REQUEUE_AFTER", "-1"),
    ("KORTEX_TURN__SHUTDOWN_GRACE", "-infinity"), ("KORTEX_TOOLS__PROGRESS_AFTER_S", "-1"),
    ("KORTEX_TOOLS__SOFT_GRACE", "nan"), ("KORTEX_TOOLS__HARD_GRACE", "0"),
    ("KORTEX_POOLS__REDIS_POOL_TIMEOUT", "0"), ("KORTEX_POOLS__REDIS_POOL_TIMEOUT", "1e12"),
    ("KORTEX_LLM__PROVIDERS__OPENAI__TIMEOUT", "inf"),
])
def test_a_duration_out_of_its_bounds_is_refused_in_one_line_naming_it(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    setting = name.removeprefix("KORTEX_").lower().replace("__", ".")
    text = str(caught.value)
    assert text.startswith(f"invalid configuration: {setting}: ") and "\n" not in text, text


def test_durations_from_toml_must_be_finite_and_zero_stays_where_it_means_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kortex.toml").write_text("[turn]\ndeadline = inf\n")
    with pytest.raises(ConfigError, match=r"turn\.deadline: "):
        load_settings()
    (tmp_path / "kortex.toml").write_text("[turn]\nheartbeat = nan\n")
    with pytest.raises(ConfigError, match=r"turn\.heartbeat: "):
        load_settings()
    (tmp_path / "kortex.toml").unlink()
    # 0: re-enqueue at once, hand steps back at once, report progress at once, interrupt at the timeout
    s = Settings(turn={"requeue_after": 0, "shutdown_grace": 0, "deadline": 0.3, "step_lease": 0.3,
                       "step_time_limit": 0.3, "heartbeat": 0.1, "watchdog_every": 0.5},
                 tools={"progress_after_s": 0, "soft_grace": 0}, pools={"redis_pool_timeout": 1.5})
    assert s.turn.requeue_after == 0 and s.turn.deadline == 0.3 and s.tools.soft_grace == 0
    assert Settings(turn={"stream_ttl": "7d", "deadline": "1h"}).turn.stream_ttl == 7 * 86400


@pytest.mark.parametrize("source", ["env", "toml"])
def test_the_log_level_is_a_choice_in_any_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    def use(level: str) -> None:
        if source == "env":
            monkeypatch.setenv("KORTEX_LOG_LEVEL", level)
        else:
            (tmp_path / "kortex.toml").write_text(f'log_level = "{level}"\n')

    use("debug")
    assert load_settings().log_level == "DEBUG"
    use("Warning")
    assert load_settings().log_level == "WARNING"
    use("LOUD")
    with pytest.raises(ConfigError, match=r"^invalid configuration: log_level: .*use one of debug, info, warning, error, critical"):
        load_settings()


@pytest.mark.parametrize(("name", "meant"), [
    ("KORTEX_REDIS_ULR", "KORTEX_REDIS_URL"), ("KORTEX_TURN_DEADLINE", "KORTEX_TURN__DEADLINE"),
    ("KORTEX_TRUN__DEADLINE", "KORTEX_TURN__DEADLINE"), ("kortex_database_ulr", "KORTEX_DATABASE_URL"),
])
def test_an_environment_variable_that_is_no_setting_is_refused_with_the_likely_one(
        monkeypatch: pytest.MonkeyPatch, name: str, meant: str) -> None:
    monkeypatch.setenv(name, "redis://:s3cret-pw@redis:6379/0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    text = str(caught.value)
    assert f"{name} is not a setting (did you mean {meant!r}?)" in text and "s3cret" not in text, text


def test_the_variables_read_outside_the_settings_still_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "k.toml").write_text("")
    for name in ("KORTEX_API_KEY", "KORTEX_API_URL", "KORTEX_DEBUG", "KORTEX_LOG_FORMAT", "KORTEX_METRICS_DIR",
                 "KORTEX_METRICS_PORT", "KORTEX_ACCESS_LOG", "KORTEX_TEST_PG_URL", "KORTEX_BENCH_PYSPY",
                 "KORTEX_BENCH_SET_TURN__LOOP_LAG_TARGET_MS", "KORTEX_HOME", "KORTEX_LOG_LEVEL"):
        monkeypatch.setenv(name, "info" if name == "KORTEX_LOG_LEVEL" else str(tmp_path))
    monkeypatch.setenv("KORTEX_CONFIG", str(tmp_path / "k.toml"))
    assert load_settings().embedded


@pytest.mark.parametrize(("turn", "names"), [
    ({"min_inflight_steps": 64, "max_inflight_steps": 32}, "min_inflight_steps"),
    ({"max_inflight_per_tenant": 2000}, "max_inflight_per_tenant"),
    ({"max_inflight_per_tenant": 8, "max_inflight_steps": 4}, "max_inflight_per_tenant"),
    ({"tenant_weights": {"acme": 0}}, "turn.tenant_weights.acme"),
])
def test_contradictory_engine_limits_are_refused(turn: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(turn=turn)
    text = str(caught.value)
    assert names in text and "\n" not in text, text


def test_a_lower_ceiling_alone_takes_the_default_floor_down_with_it() -> None:
    # The governor clamps its floor to the ceiling: only a floor set above it contradicts it.
    assert load_settings(turn={"max_inflight_steps": 1}).turn.max_inflight_steps == 1


@pytest.mark.parametrize(("name", "url"), [
    ("KORTEX_REDIS_URL", "htp://redis:6379/0"), ("KORTEX_REDIS_URL", "redis://:pw-s3cret@redis:xx/0"),
    ("KORTEX_BROKER_URL", "redis://redis:99999/0"), ("KORTEX_DATABASE_URL", "postgresql://kortex:pw-s3cret@db:port/x"),
])
def test_a_malformed_url_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch, name: str, url: str) -> None:
    monkeypatch.setenv(name, url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    text = str(caught.value)
    assert text.startswith(f"invalid configuration: {name.removeprefix('KORTEX_').lower()}: "), text
    assert "s3cret" not in text and "unexpected" not in text
