"""Settings from ``kortex.toml`` and ``KORTEX_*`` environment variables (pydantic-settings).

Precedence: explicit arguments > environment > ``kortex.toml`` > defaults. Nested keys use
``__`` in the environment (``KORTEX_LLM__MAX_TOOL_DEPTH=4``). Values written as ``${VAR}``
resolve from the environment; an unset variable leaves the value empty, which marks a provider
unavailable rather than broken (rfc-005 §5.3).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kortex.errors import ConfigError, InvalidInput
from kortex.timeparse import parse_duration

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_env_refs(value: Any) -> Any:
    """Replace ``${VAR}`` with the variable's value; a wholly unresolved value becomes None."""
    if not isinstance(value, str) or "${" not in value:
        return value
    missing = False

    def sub(match: re.Match[str]) -> str:
        nonlocal missing
        found = os.environ.get(match.group(1))
        if not found:
            missing = True
            return ""
        return found

    resolved = _VAR.sub(sub, value)
    return None if missing else resolved


def _seconds(value: Any) -> Any:
    """Seconds as a number (also from the environment, where it arrives as text) or a duration
    such as ``"90s"``, ``"5m"``, ``"PT1H"``."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return parse_duration(value).total_seconds()
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
    return value


Seconds = Annotated[float, BeforeValidator(_seconds)]
Secret = Annotated[SecretStr | None, BeforeValidator(resolve_env_refs)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderSettings(_Section):
    """One ``[llm.providers.<name>]`` table."""

    enabled: bool = True
    api_key: Secret = None
    model: str | None = None
    fast_model: str | None = None
    max_tokens: int = Field(4096, ge=1, le=1_000_000)
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    timeout: Seconds = 60.0
    connect_timeout: Seconds = 5.0
    base_url: Annotated[str | None, BeforeValidator(resolve_env_refs)] = None
    endpoint: Annotated[str | None, BeforeValidator(resolve_env_refs)] = None  # ollama's name for base_url
    max_retries: int = Field(3, ge=0, le=10)
    max_connections: int = Field(256, ge=1, le=10_000)  # open streams to this provider at once
    retry_base: Seconds = Field(0.5, ge=0)        # first backoff; doubles per retry, with jitter
    retry_max_wait: Seconds = Field(30.0, ge=0)   # a longer Retry-After gives up on this provider
    retry_budget: Seconds = Field(60.0, ge=0)     # total time one call may spend waiting to retry
    # Per-model prices, USD per million tokens: {"gpt-5": {"input": 12, "output": 60}}. A model
    # listed here that the catalogue lacks becomes usable (e.g. on an OpenAI-compatible server).
    prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Ollama: None tries native tool calls and falls back to prompt-injected markers when the
    # model refuses them; False always uses the markers.
    native_tools: bool | None = None
    context_tokens: int | None = Field(None, ge=1024)  # Ollama models' context window (default 8192)

    @field_validator("prices")
    @classmethod
    def _price_keys(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for model, price in value.items():
            unknown = set(price) - {"input", "output"}
            if unknown or any(v < 0 for v in price.values()):
                raise ValueError(f"prices.{model}: use non-negative 'input' and 'output' (USD per million tokens)")
        return value


class ToolOverride(_Section):
    """One ``[llm.tools.<tool>]`` table."""

    timeout: Seconds | None = None


class BudgetSettings(_Section):
    daily_usd_limit: float = Field(50.0, ge=0)
    per_session_token_cap: int = Field(200_000, ge=1000)
    max_concurrent_turns_per_tenant: int = Field(20, ge=1)


class PrivacySettings(_Section):
    """``[llm.privacy]``: ``local_only`` is the same as ``mode = "local-only"``."""

    local_only: bool = False


class LLMSettings(_Section):
    default_provider: str = "offline"
    default_model: str | None = None
    fallback_providers: list[str] = Field(default_factory=list)
    mode: Literal["normal", "frugal", "local-only"] = "normal"
    # How provider HTTP clients move bytes: aiohttp underneath httpx (the default: about half
    # the CPU per streamed chunk, and no slowdown with hundreds of open streams, encode/httpx#3215),
    # or httpx's own pool. bench/providers.py measures both.
    http_transport: Literal["httpx", "aiohttp"] = "aiohttp"
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)
    max_tool_depth: int = Field(8, ge=1, le=64)
    max_tool_calls_per_step: int = Field(16, ge=1, le=128)  # more calls in one answer get an error result
    max_history_messages: int = Field(200, ge=4)
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)

    @property
    def local_only(self) -> bool:
        return self.mode == "local-only" or self.privacy.local_only


class ToolPolicySettings(_Section):
    """Which tools sessions may call. Deny by default: only names listed here run."""

    allowed: list[str] | None = None  # None: every registered built-in read-only tool
    result_cap_bytes: int = Field(64 * 1024, ge=1024, le=4 * 1024 * 1024)
    progress_after_s: Seconds = 30.0
    # Beyond its own timeout a tool task gets soft_grace before the worker interrupts it and
    # hard_grace more before the worker process is killed (a tool that blocks its thread).
    soft_grace: Seconds = 10.0
    hard_grace: Seconds = 10.0


class PrometheusSettings(_Section):
    """``[telemetry.prometheus]``: where metrics come from when ``telemetry.metrics = "prometheus"``."""

    url: Annotated[str | None, BeforeValidator(resolve_env_refs)] = None
    product_label: str = "product"       # the label that names the product (service)
    # Tenant scoping, one of them required: a label whose value is the tenant id, or the tenant
    # id as X-Scope-OrgID (Mimir, Cortex, Thanos), or an explicit statement that this
    # Prometheus serves a single tenant. Without any, the sources refuse to start.
    tenant_label: str | None = None
    org_id_from_tenant: bool = False
    single_tenant: bool = False
    timeout: Seconds = 10.0
    bearer_token: Secret = None


class LokiSettings(_Section):
    """``[telemetry.loki]``: where logs come from when ``telemetry.logs = "loki"``."""

    url: Annotated[str | None, BeforeValidator(resolve_env_refs)] = None
    product_label: str = "product"
    level_label: str = "level"
    host_label: str = "host"
    trace_label: str = "trace_id"
    org_id_from_tenant: bool = True      # send X-Scope-OrgID: <tenant id> (Loki's multi-tenancy)
    single_tenant: bool = False          # required to turn the above off: this Loki serves one tenant
    timeout: Seconds = 10.0
    bearer_token: Secret = None


class TelemetrySettings(_Section):
    """Which source each kind of telemetry comes from. Everything else is the embedded store."""

    logs: Literal["embedded", "loki"] = "embedded"
    metrics: Literal["embedded", "prometheus"] = "embedded"
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    loki: LokiSettings = Field(default_factory=LokiSettings)


class TurnSettings(_Section):
    deadline: Seconds = 600.0               # a turn not finished by then is failed by the watchdog
    step_time_limit: Seconds = 300.0        # one LLM call, streamed
    step_lease: Seconds = 60.0              # a step whose worker stops renewing this long is run again
    stream_ttl: Seconds = 3600.0            # how long a finished turn's stream stays in Redis
    stream_maxlen: int = Field(20_000, ge=100)
    heartbeat: Seconds = 15.0
    text_flush_ms: int = Field(25, ge=0, le=1000)  # coalescing window for text deltas
    requeue_after: Seconds = 30.0           # a queued turn or tool untouched this long is re-enqueued
    watchdog_every: Seconds = 10.0          # how often beat runs the watchdog sweep
    max_message_chars: int = Field(32_000, ge=100)


class TestingSettings(_Section):
    """Switches for fakes. Off in production; a deployment never needs them."""

    enable_test_providers: bool = False
    enable_test_tools: bool = False
    scripts_dir: Path | None = None


def default_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kortex"


def _config_file() -> Path | None:
    explicit = os.environ.get("KORTEX_CONFIG")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"KORTEX_CONFIG points to {path}, which is not a file")
        return path
    local = Path("kortex.toml")
    return local if local.is_file() else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KORTEX_", env_nested_delimiter="__", extra="ignore", validate_default=True
    )

    database_url: str | None = None
    redis_url: str | None = None
    broker_url: str | None = None
    redis_prefix: str = "kortex"
    secret_key: Secret = None  # signs paging cursors; set it in production (KORTEX_SECRET_KEY)
    home: Path = Field(default_factory=default_home)
    log_level: str = "INFO"
    task_events: bool = False  # Celery task events from the start; Flower enables them itself
    llm: LLMSettings = Field(default_factory=LLMSettings)
    tools: ToolPolicySettings = Field(default_factory=ToolPolicySettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    turn: TurnSettings = Field(default_factory=TurnSettings)
    testing: TestingSettings = Field(default_factory=TestingSettings)

    @field_validator("redis_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", value):
            raise ValueError("redis_prefix may use letters, digits and _.:- only")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @property
    def embedded(self) -> bool:
        """No Redis configured: in-process broker, worker and stream store."""
        return not self.redis_url

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'kortex.db'}"

    @property
    def effective_broker_url(self) -> str:
        if self.broker_url:
            return self.broker_url
        return self.redis_url or "memory://localhost/"

    def tool_timeout(self, tool: str) -> float | None:
        override = self.llm.tools.get(tool)
        return override.timeout if override else None


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ConfigError:
        raise
    except Exception as exc:  # pydantic.ValidationError, TOML decode errors
        raise ConfigError(f"invalid configuration: {exc}") from exc
