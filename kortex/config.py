"""Settings from ``kortex.toml`` and ``KORTEX_*`` environment variables (pydantic-settings).

Precedence: explicit arguments > environment > ``kortex.toml`` > defaults. Nested keys use
``__`` in the environment (``KORTEX_LLM__MAX_TOOL_DEPTH=4``). Values written as ``${VAR}``
resolve from the environment; an unset variable leaves the value empty, which marks a provider
unavailable rather than broken (rfc-005 §5.3).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kortex.config_env import check_environment
from kortex.config_errors import describe_errors, did_you_mean
from kortex.config_retention import RetentionSettings
from kortex.config_urls import URL, masked_repr
from kortex.config_values import EnvURL, LogLevel, Seconds, Secret, _log_level
from kortex.errors import ConfigError, InvalidInput
from kortex.redaction import scrub_text


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        return masked_repr(self, super().__repr_args__())


class ProviderSettings(_Section):
    """One ``[llm.providers.<name>]`` table."""

    enabled: bool = True
    api_key: Secret = None
    model: str | None = None
    fast_model: str | None = None
    max_tokens: int = Field(4096, ge=1, le=1_000_000)
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    timeout: Seconds = Field(60.0, gt=0)
    connect_timeout: Seconds = Field(5.0, gt=0)
    base_url: EnvURL = None
    endpoint: EnvURL = None  # ollama's name for base_url
    max_retries: int = Field(3, ge=0, le=10)
    # open streams to this provider at once, per process: as many as the step engine runs
    max_connections: int = Field(1000, ge=1, le=10_000)
    retry_base: Seconds = Field(0.5, ge=0)        # first backoff; doubles per retry, with jitter
    retry_max_wait: Seconds = Field(30.0, ge=0)   # a longer Retry-After gives up on this provider
    retry_budget: Seconds = Field(60.0, ge=0)     # total time one call may spend waiting to retry
    # Per-model prices, USD per million tokens: {"gpt-5": {"input": 12, "output": 60}}, with
    # optional "cache_read"/"cache_write" for prompt-cache tokens. A model listed here that the
    # catalogue lacks becomes usable (e.g. on an OpenAI-compatible server).
    prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    # Callers (sessions, turns) may only name models this provider lists: its catalogue, the
    # configured model and fast_model, the keys of `prices`, and for Ollama the models it serves.
    # True lets them name any id; such a model is priced from `prices`, else costs nothing, so
    # turn it on only where every model the server offers is free to you (a local server).
    allow_unlisted_models: bool = False
    # Ollama: None tries native tool calls and falls back to prompt-injected markers when the
    # model refuses them; False always uses the markers.
    native_tools: bool | None = None
    # Ollama models' context window (default 8192): sent as num_ctx, overriding the Modelfile's
    context_tokens: int | None = Field(None, ge=1024)

    @field_validator("prices")
    @classmethod
    def _price_keys(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for n, price in enumerate(value.values(), 1):
            unknown = set(price) - {"input", "output", "cache_read", "cache_write"}
            if unknown or any(v < 0 for v in price.values()):
                # By position, not by name: configuration errors never quote what was written.
                raise ValueError(f"model {n} of prices: use non-negative 'input', 'output' and optionally "
                                 "'cache_read', 'cache_write' (USD per million tokens)")
        return value


class ToolOverride(_Section):
    """One ``[llm.tools.<tool>]`` table."""

    timeout: Seconds | None = None

    @field_validator("timeout")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("timeout must be longer than zero, e.g. \"30s\"")
        return value


class BudgetSettings(_Section):
    """``[llm.budget]``, enforced before each turn and each LLM call (kortex/budget.py); a
    tenant's own settings may narrow them."""

    daily_usd_limit: float = Field(50.0, ge=0)            # per tenant, per UTC day, every LLM call
    per_session_token_cap: int = Field(200_000, ge=1000)  # input + output tokens of a session
    per_user_hourly_limit: int | None = Field(None, ge=1)  # rfc-005 §5.1; accepted, not enforced yet
    alert_at_pct: float | None = Field(None, gt=0, le=100)  # rfc-005 §5.1; accepted, not enforced yet
    max_concurrent_turns_per_tenant: int = Field(20, ge=1)
    turns_per_minute: int = Field(120, ge=1)              # per tenant
    # Quotas on the other writes a tenant can make, per tenant and minute (429 with Retry-After
    # past them): session creation, and telemetry ingest counted both in requests and in items.
    sessions_per_minute: int = Field(60, ge=1)
    ingest_requests_per_minute: int = Field(600, ge=1)
    ingest_items_per_minute: int = Field(200_000, ge=1)


class PrivacySettings(_Section):
    """``[llm.privacy]``: ``local_only`` is the same as ``mode = "local-only"``."""

    local_only: bool = False
    # Credential-shaped text (keys, tokens, passwords, private keys) in the conversation is
    # replaced with [REDACTED] before it is sent to a cloud provider.
    redact_secrets: bool = True
    redact_pii: bool = False              # accepted, not enforced yet (a startup warning says so)
    audit_every_call: bool = True         # every LLM call is audited; false is refused
    do_not_retain_default: bool = False   # accepted, not enforced yet (a startup warning says so)

    @field_validator("audit_every_call")
    @classmethod
    def _always_audited(cls, value: bool) -> bool:
        if not value:
            raise ValueError("false is not supported: every LLM call, tool call and proposal writes an audit row")
        return value


class GroundingSettings(_Section):
    """What happens when a final answer cites no call of its turn, or a failed one, or quotes
    numbers found in no tool result (kortex/turns/grounding.py). ``warn``: the answer stands and
    the done event and stored message carry the flags, with a notice event; ``strict``: the
    model is asked once more (same step, no tools) to answer citing only its turn's calls, and
    what remains is flagged as in ``warn``."""

    policy: Literal["warn", "strict"] = "warn"
    check_numbers: bool = True  # flag quoted numbers found in no result (citations are always checked)


def _vocabulary(check: Any, values: Any) -> Any:
    """Run the router's vocabulary check as a validator: its refusal becomes a ValueError, which
    pydantic reports with the field's path like any other. The router's text quotes the value;
    here it names the entry by position instead, as a secret pasted on the wrong line would
    otherwise be printed."""

    out = []
    for n, value in enumerate(values, 1):
        try:
            out.append(check(value))
        except InvalidInput as exc:
            message = exc.message.replace(repr(value), f"entry {n}")
            if str(value) and re.search(rf"(?<![\w-]){re.escape(str(value))}(?![\w-])", message):
                message = f"entry {n} is not accepted"  # quoted some other way: no words of it kept
            raise ValueError(message) from None
    return out


class RoutedModelSettings(_Section):
    """What the router should believe of one model (keyed ``provider::model``) where the
    catalogue's tier or the tier's default capabilities do not fit."""

    tier: Literal["fast", "balanced", "powerful"] | None = None
    capabilities: list[str] | None = None

    @field_validator("capabilities")
    @classmethod
    def _canonical(cls, value: list[str] | None) -> list[str] | None:
        from kortex.llm.routing import canonical  # the vocabulary lives with the router

        return None if value is None else _vocabulary(canonical, value)


class RoutingSettings(_Section):
    """``model: "auto"`` (kortex/llm/routing.py): which models compete, on what terms."""

    strategy: str = "kortex.llm.routing:HeuristicRoutingStrategy"  # module:Class of a RoutingStrategy
    # provider::model keys; None: every model of every available provider that is not synthetic
    # (the offline analyst answers only when nothing else can)
    candidates: list[str] | None = None
    models: dict[str, RoutedModelSettings] = Field(default_factory=dict)
    cost_ceiling_usd: float | None = Field(None, gt=0)   # per step, estimated before the call
    latency_sla_ms: float | None = Field(None, gt=0)     # time to first token, measured p50
    required_capabilities: list[str] = Field(default_factory=list)
    # A routed step whose first token has not come within this many times the model's measured
    # p95 (at least first_token_floor_ms) is a latency spike: its fallback answers instead.
    first_token_factor: float = Field(3.0, ge=1.0)
    first_token_floor_ms: float = Field(2000.0, ge=0)
    min_latency_samples: int = Field(10, ge=1)  # fewer measured calls than this: the latency is unknown

    @field_validator("candidates")
    @classmethod
    def _keys(cls, value: list[str] | None) -> list[str] | None:
        from kortex.llm.routing import check_key

        return None if value is None else _vocabulary(check_key, value)

    @field_validator("models")
    @classmethod
    def _model_keys(cls, value: dict[str, RoutedModelSettings]) -> dict[str, RoutedModelSettings]:
        from kortex.llm.routing import check_key

        _vocabulary(check_key, list(value))
        return value

    @field_validator("required_capabilities")
    @classmethod
    def _required(cls, value: list[str]) -> list[str]:
        from kortex.llm.routing import canonical

        return _vocabulary(canonical, value)  # type: ignore[no-any-return]


class AnomalySettings(_Section):
    """The checks run on each step and what recovery may do (kortex/turns/anomalies.py).
    ``scope``: ``routed`` checks the steps of ``model: "auto"`` turns, whose recoveries may
    re-route (a model the caller pinned is never re-routed); ``all`` checks every step
    (recoveries then stay on the pinned model); ``off`` none."""

    scope: Literal["routed", "all", "off"] = "routed"
    min_answer_chars: int = Field(20, ge=0)         # a final answer shorter than this is short (empty: 0 chars)
    cost_overrun_ratio: float = Field(3.0, ge=1.0)  # actual step cost vs the router's estimate
    context_cut_ratio: float = Field(0.8, gt=0, le=1.0)  # history cut by more than this to fit
    max_retries_per_step: int = Field(1, ge=0, le=3)
    max_retries_per_turn: int = Field(3, ge=0, le=10)
    # the same tool call (name and arguments) made this many times in a turn ends it (escalate)
    repeated_calls_escalate: int = Field(3, ge=2)
    # kind -> action, where the deployment wants another recovery than the policy's recommendation
    # (kortex/turns/anomalies.py POLICY): {"repeated_tool_call": "rollback"}
    actions: dict[str, Literal["continue", "retry", "fallback", "rollback", "escalate"]] = Field(default_factory=dict)

    @field_validator("actions")
    @classmethod
    def _kinds(cls, value: dict[str, str]) -> dict[str, str]:
        from kortex.turns.anomalies import ACTIONS, POLICY

        # By position, not by name: configuration errors never quote what was written.
        unknown = [f"entry {n}{did_you_mean(kind, POLICY)}" for n, kind in enumerate(value, 1) if kind not in POLICY]
        if unknown:
            raise ValueError(f"unknown anomaly kind: {', '.join(unknown)}; known: {', '.join(POLICY)}")
        # Known kinds and actions (our vocabulary) may be quoted. Refused here, not ignored at
        # run time: an action recovery cannot carry out would be announced and then not taken.
        impossible = [f"{kind} cannot {action} (it can: {', '.join(sorted(ACTIONS[kind]))})"
                      for kind, action in value.items() if action not in ACTIONS[kind]]
        if impossible:
            raise ValueError(f"[llm.anomalies] actions: {'; '.join(impossible)}")
        return value


class LLMSettings(_Section):
    default_provider: str = "offline"
    default_model: str | None = None
    fallback_providers: list[str] = Field(default_factory=list)
    mode: Literal["normal", "frugal", "local-only"] = "normal"
    # How provider HTTP clients move bytes: aiohttp directly (the default: within a fifth of a
    # bare aiohttp reader's CPU per streamed answer, and no slowdown with hundreds of open
    # streams, encode/httpx#3215), or httpx with its own pool. bench/providers.py measures both.
    http_transport: Literal["httpx", "aiohttp"] = "aiohttp"
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)
    max_tool_depth: int = Field(8, ge=1, le=64)
    max_tool_calls_per_step: int = Field(16, ge=1, le=128)  # more calls in one answer get an error result
    # Characters one model answer may stream, its text and its tool calls' arguments (as compact
    # JSON bytes) together; past it the step fails (stream_invalid) and nothing is kept. A provider that ignores max_tokens must not fill memory or the database;
    # the default is well above what an answer of even 128k tokens comes to.
    max_answer_chars: int = Field(1_000_000, ge=1_000, le=100_000_000)
    max_history_messages: int = Field(200, ge=4)
    session_idle_ttl: Seconds | None = Field(None, gt=0)  # rfc-005 §5.1; accepted, not enforced yet
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    grounding: GroundingSettings = Field(default_factory=GroundingSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    anomalies: AnomalySettings = Field(default_factory=AnomalySettings)

    @property
    def local_only(self) -> bool:
        return self.mode == "local-only" or self.privacy.local_only

    def unenforced(self) -> list[str]:
        """Settings of rfc-005 §5.1 that are accepted but do nothing yet, as set here; the
        process says so at startup rather than pretend."""
        out = []
        if self.session_idle_ttl is not None:
            out.append("llm.session_idle_ttl (sessions do not expire)")
        if self.budget.per_user_hourly_limit is not None:
            out.append("llm.budget.per_user_hourly_limit (no per-user hourly limit is applied)")
        if self.budget.alert_at_pct is not None:
            out.append("llm.budget.alert_at_pct (no budget alert is sent)")
        if self.privacy.redact_pii:
            out.append("llm.privacy.redact_pii (personal data is not redacted; redact_secrets is applied)")
        if self.privacy.do_not_retain_default:
            out.append("llm.privacy.do_not_retain_default (messages are retained)")
        return out


class ToolPolicySettings(_Section):
    """Which tools sessions may call. Deny by default: only names listed here run."""

    allowed: list[str] | None = None  # None: every registered built-in read-only tool
    result_cap_bytes: int = Field(64 * 1024, ge=1024, le=4 * 1024 * 1024)
    progress_after_s: Seconds = Field(30.0, ge=0)  # 0: a progress event as soon as a call starts
    # Beyond its own timeout a tool task gets soft_grace before the worker interrupts it and
    # hard_grace more before the worker process is killed (a tool that blocks its thread);
    # with no hard_grace the kill would land with the interrupt, before the tool could report.
    soft_grace: Seconds = Field(10.0, ge=0)
    hard_grace: Seconds = Field(10.0, ge=0.1)


class PrometheusSettings(_Section):
    """``[telemetry.prometheus]``: where metrics come from when ``telemetry.metrics = "prometheus"``."""

    url: EnvURL = None
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

    url: EnvURL = None
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
    # Durations below 0.1 s fail every turn (deadline, step_time_limit) or spin a core (the lease
    # is renewed every third of it, the heartbeat and watchdog loops wait this long).
    deadline: Seconds = Field(600.0, ge=0.1)         # a turn not finished by then is failed by the watchdog
    step_time_limit: Seconds = Field(300.0, ge=0.1)  # one LLM call, streamed
    step_lease: Seconds = Field(60.0, ge=0.1)        # a step whose worker stops renewing this long is run again
    stream_ttl: Seconds = Field(3600.0, ge=1)        # how long a finished turn's stream stays in Redis (EXPIRE: whole seconds)
    stream_maxlen: int = Field(20_000, ge=100)
    heartbeat: Seconds = Field(15.0, ge=0.1)
    max_streams_per_tenant: int = Field(500, ge=1)  # open event streams per tenant, per API process
    # The API's stream hub: reader connections per process, and the least time between two reads
    # of one reader (under load each read carries more entries; idle streams are not delayed).
    stream_readers: int = Field(2, ge=1, le=64)
    stream_round_ms: int = Field(20, ge=0, le=1000)
    # Coalescing window for text deltas after the first (which goes at once): a model streams a
    # piece every 15-70 ms, so 100 ms halves the stream writes and SSE events of a turn while
    # text still reaches the reader ten times a second.
    text_flush_ms: int = Field(100, ge=0, le=1000)
    requeue_after: Seconds = Field(30.0, ge=0)  # a queued turn or tool untouched this long is re-enqueued (0: at once)
    watchdog_every: Seconds = Field(10.0, ge=0.1)  # how often the watchdog process sweeps
    max_message_chars: int = Field(32_000, ge=100)
    # The step engine of each turns-worker process (kortex/turns/engine.py): LLM steps stream
    # concurrently on one event loop; past ``max_inflight_steps`` they wait in the process,
    # taken round-robin across tenants (``tenant_weights`` gives some tenants more turns of
    # the wheel); past ``max_waiting_steps`` a step is set aside and offered again every 0.5-1 s.
    max_inflight_steps: int = Field(1000, ge=1, le=100_000)
    max_inflight_per_tenant: int | None = Field(None, ge=1)  # default: 3/4 of max_inflight_steps
    max_waiting_steps: int = Field(5000, ge=1)
    # Below that bound, the loop-lag governor's target and floor (kortex/turns/governor.py); 0: off.
    # The target trades a flood's speed for a light tenant's latency (figures in governor.py).
    loop_lag_target_ms: int = Field(1, ge=0, le=10_000)
    min_inflight_steps: int = Field(32, ge=1)
    tenant_weights: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    # A tenant with more live chat turns than this is busy: its steps wait in the turns queue
    # behind other tenants' (a lower message priority), so one tenant's flood does not queue
    # ahead of another's turn. 0: one priority for all.
    busy_tenant_turns: int = Field(8, ge=0)
    shutdown_grace: Seconds = Field(20.0, ge=0)  # steps still streaming then are handed to another worker (0: at once)

    @model_validator(mode="after")
    def _limits_agree(self) -> TurnSettings:
        # The default floor follows a lower ceiling (the governor clamps it); one set above it,
        # or a tenant cap above the process's, is a contradiction nothing would act on.
        if "min_inflight_steps" in self.model_fields_set and self.min_inflight_steps > self.max_inflight_steps:
            raise ValueError("min_inflight_steps must not exceed max_inflight_steps")
        if self.max_inflight_per_tenant is not None and self.max_inflight_per_tenant > self.max_inflight_steps:
            raise ValueError("max_inflight_per_tenant must not exceed max_inflight_steps")
        return self


class BatchSettings(_Section):
    """Batch jobs (kortex/postmortems/): how much of the batch lane one tenant may hold."""

    # items in flight across all of a tenant's jobs: a tenant with many jobs waits its turn
    # instead of filling the batch queue ahead of everyone else
    max_active_items_per_tenant: int = Field(16, ge=1, le=1000)
    # items not finished (queued, dispatched, running) across a tenant's jobs, each an LLM
    # investigation to come: a job that would pass it is refused whole (429); 1000 fits one job
    max_open_items_per_tenant: int = Field(1000, ge=1, le=1_000_000)
    jobs_per_minute: int = Field(10, ge=1)  # new jobs per tenant (429 with Retry-After past it)


class ApiKeySettings(_Section):
    """``[api_keys]``: what one tenant may hold (kortex/keys.py)."""

    # unrevoked keys per tenant: one more is refused (409) until one is revoked; rotating keeps the count
    max_active_per_tenant: int = Field(100, ge=1, le=100_000)


class PoolSettings(_Section):
    """Connection budgets of one process; README "Sizing" adds them up for a deployment. Every
    pool waits (up to its timeout) when it is full instead of raising, and each is sized so
    that what a process runs at once fits without waiting."""

    db_pool_size: int = Field(5, ge=1, le=500)        # PostgreSQL connections kept open
    db_max_overflow: int = Field(5, ge=0, le=500)     # more opened under load (PostgreSQL: kept once open)
    telemetry_pool_size: int = Field(2, ge=1, le=500)  # tool queries (tools workers; lazily opened)
    telemetry_max_overflow: int = Field(2, ge=0, le=500)
    redis_max_connections: int = Field(32, ge=2, le=10_000)  # the shared client (stream writes, limits)
    redis_pool_timeout: Seconds = Field(5.0, ge=0.1)  # wait for a free Redis connection, then fail
    broker_max_connections: int = Field(32, ge=2, le=10_000)  # per broker channel; raised to concurrency + 8


class TracingSettings(_Section):
    """OpenTelemetry spans for turns (kortex/tracing.py): off unless enabled; OTLP over HTTP."""

    enabled: bool = False
    endpoint: URL = None  # e.g. http://otel-collector:4318/v1/traces; else OTEL_EXPORTER_OTLP_* env
    service_name: str = "kortex"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class MetricsSettings(_Section):
    """Prometheus metrics (kortex/metrics.py): ``/metrics`` on the API; ``kortex worker`` and
    ``kortex beat`` serve them on ``--metrics-port``. With ``token`` set, scrapes must send
    ``Authorization: Bearer <token>`` (Prometheus: ``authorization.credentials``)."""

    enabled: bool = True
    token: Secret = None


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

    database_url: URL = None
    redis_url: URL = None
    broker_url: URL = None
    redis_prefix: str = "kortex"
    secret_key: Secret = None  # signs paging cursors; set it in production (KORTEX_SECRET_KEY)
    home: Path = Field(default_factory=default_home)
    log_level: Annotated[LogLevel, BeforeValidator(_log_level)] = "INFO"
    task_events: bool = False  # Celery task events from the start; Flower enables them itself
    # Servers (API, workers, beat) freeze their start-up heap and collect garbage less often
    # once started (kortex/heap.py): collections stalled the stream hub for 100+ ms.
    settle_heap: bool = True
    # Servers let a waking thread take the GIL after this long, not CPython's 5 ms: every
    # step and post crosses threads several times (kortex/switching.py).
    switch_interval_ms: float = Field(1.0, ge=0.1, le=100.0)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    tools: ToolPolicySettings = Field(default_factory=ToolPolicySettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    turn: TurnSettings = Field(default_factory=TurnSettings)
    batch: BatchSettings = Field(default_factory=BatchSettings)
    api_keys: ApiKeySettings = Field(default_factory=ApiKeySettings)
    pools: PoolSettings = Field(default_factory=PoolSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    testing: TestingSettings = Field(default_factory=TestingSettings)

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        return masked_repr(self, super().__repr_args__())

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value and not value.lower().startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("use redis://, rediss:// or unix://")
        return value

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
        check_environment(Settings)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            sources.append(_StrictToml(settings_cls, toml_file=path))
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


class _StrictToml(TomlConfigSettingsSource):
    """kortex.toml, whose top-level keys must be settings, as the environment's must be
    (``_check_environment``); sections forbid unknown keys from either source (``_Section``)."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        unknown = sorted(set(data) - set(Settings.model_fields))
        if unknown:
            raise ConfigError("invalid configuration: " + "; ".join(
                f"{self.toml_file_path}: unknown key {key!r}{did_you_mean(key, Settings.model_fields)}"
                for key in unknown))
        return data


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**overrides)
    except ConfigError:
        raise
    except ValidationError as exc:
        problem = describe_errors(exc, Settings)
    except Exception as exc:  # TOML decode errors, pydantic-settings parse errors
        problem = f"{exc.__class__.__name__}: {scrub_text(str(exc))[:500]}"
    # Raised outside the handlers, so the error has neither cause nor context: pydantic's text
    # quotes every input (a misspelt ``apikey = "sk-..."``), and the traceback a server prints
    # when its factory or app module fails to load would show it.
    raise ConfigError(f"invalid configuration: {problem}")
