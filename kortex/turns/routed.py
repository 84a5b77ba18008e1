"""Routing glue for a turn's step (``model: "auto"``): the catalog of models the step may use,
their measured latency, the decision, and the failover chain it becomes.

The catalog is the deployment's available providers' models (``[llm.routing] candidates``
narrows it), constrained by the mode: ``local-only`` keeps local models, ``frugal`` leaves out
the powerful tier. A local server's models compete only when the deployment names them (the
provider's ``model``, ``fast_model`` or ``prices``, or ``[llm.routing] candidates``/``models``):
whatever else it has pulled (an embedding model, say) is not a chat model to route to. Synthetic providers (the offline analyst) compete only when nothing else
can answer. Latency is measured, not configured: the tenant's successful LLM calls of the last
hour (audit rows), as p50/p95 time to first token and tokens per second, cached per process.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection

from kortex.config import Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm.base import Provider, ToolSchema
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import Candidate, is_cloud
from kortex.llm.routing import (
    TIER_CAPABILITIES,
    Latency,
    RouteModel,
    RoutingDecision,
    RoutingStrategy,
    load_strategy,
    model_key,
    task_of,
)
from kortex.messages import Message
from kortex.storage import audit
from kortex.timeparse import utcnow

AUTO = "auto"
WINDOW = timedelta(hours=1)
CACHE_S = 30.0


def is_auto(settings: Settings, model: str | None) -> bool:
    """Routed: the turn asked for ``auto``, or asked for nothing and the default is ``auto``.
    A model the caller named is never re-routed."""
    return (model or settings.llm.default_model) == AUTO


class LatencyBook:
    """Per tenant, per model: what its recent calls took. One query per tenant every 30 s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, dict[str, Latency]]] = {}

    def get(self, conn: Connection, tenant_id: str, min_samples: int) -> dict[str, Latency]:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(tenant_id)
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        figures = measure(audit.recent_llm_calls(conn, tenant_id, utcnow() - WINDOW), min_samples)
        with self._lock:
            if len(self._cache) > 10_000:  # bounded: tenants come and go
                self._cache.clear()
            self._cache[tenant_id] = (now, figures)
        return figures

    def forget(self) -> None:
        with self._lock:
            self._cache.clear()


def measure(rows: Sequence[Any], min_samples: int) -> dict[str, Latency]:
    """p50/p95 time to first token and tokens/s by model (``provider:model``), from audit rows;
    models with fewer than ``min_samples`` calls are left out (unknown, not fast)."""
    first: dict[str, list[float]] = defaultdict(list)
    speed: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        payload = getattr(row, "payload", None) or {}
        ttft = payload.get("first_token_ms")
        if ttft is None:
            continue
        subject = str(row.subject)
        first[subject].append(float(ttft))
        streaming_ms = float(row.latency_ms or 0) - float(ttft)
        tokens = int(row.output_tokens or 0)
        if streaming_ms > 0 and tokens > 0:
            speed[subject].append(tokens / (streaming_ms / 1000))
    out = {}
    for subject, values in first.items():
        if len(values) < min_samples:
            continue
        values.sort()
        p95 = values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]
        out[subject] = Latency(samples=len(values), first_token_p50_ms=statistics.median(values),
                               first_token_p95_ms=p95,
                               tokens_per_s=statistics.median(speed[subject]) if speed.get(subject) else None)
    return out


def catalog(registry: ProviderRegistry, settings: Settings, latency: dict[str, Latency]) -> list[RouteModel]:
    routing = settings.llm.routing
    wanted = set(routing.candidates) if routing.candidates is not None else None
    real: list[RouteModel] = []
    synthetic: list[RouteModel] = []
    for name in registry.names():
        try:
            provider = registry.get(name)
        except ProviderError:
            continue
        if settings.llm.local_only and provider.leaves_network():
            continue
        named = _named_locally(name, provider, settings)
        for model in provider.models():
            key = model_key(name, model.id)
            if wanted is not None and key not in wanted:
                continue
            if settings.llm.local_only and provider.leaves_network(model.id):
                continue  # a local server's model served elsewhere (an Ollama ":cloud" one)
            if named is not None and model.id not in named and key not in routing.models:
                continue
            override = routing.models.get(key)
            tier = (override.tier if override and override.tier else model.tier)
            if settings.llm.mode == "frugal" and tier == "powerful":
                continue
            caps = frozenset(override.capabilities) if override and override.capabilities is not None else (
                TIER_CAPABILITIES[tier])
            entry = RouteModel(provider=name, model=model, tier=tier, capabilities=caps,
                               latency=latency.get(f"{name}:{model.id}"))
            (synthetic if _synthetic(provider) and wanted is None else real).append(entry)
    return real or synthetic


def _synthetic(provider: Provider) -> bool:
    return bool(getattr(provider, "synthetic", False))


def _named_locally(name: str, provider: Provider, settings: Settings) -> set[str] | None:
    """The model ids of a local server that may be routed to (None: any it offers). Its list is
    whatever was pulled there, embedding models included; a cloud vendor's is a chat catalogue."""
    if is_cloud(provider) or _synthetic(provider):
        return None
    config = settings.llm.providers.get(name)
    ids = {m for m in ((config.model, config.fast_model, *config.prices) if config else ()) if m}
    routing = settings.llm.routing
    prefix = f"{name}::"
    ids |= {key[len(prefix):] for key in (*(routing.candidates or ()), *routing.models) if key.startswith(prefix)}
    return ids


def _tighter(deployment: float | None, tenant: Any) -> float | None:
    """The stricter of two limits; a tenant value that is not a positive number is ignored."""
    own = float(tenant) if isinstance(tenant, int | float) and not isinstance(tenant, bool) and tenant > 0 else None
    values = [v for v in (deployment, own) if v is not None]
    return min(values) if values else None


class Router:
    """The process's router: its strategy (configured), the latency book."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.strategy: RoutingStrategy = load_strategy(settings.llm.routing.strategy)
        self.latency = LatencyBook()
        # (system prompt, id of the tool schemas) -> (those schemas, kept so the id stays theirs;
        # the characters both come to). The registry builds a policy's schemas once, so a step
        # finds its prompt's size here instead of serialising sixteen JSON Schemas again.
        self._prompts: dict[tuple[str, tuple[int, ...]], tuple[tuple[ToolSchema, ...], int]] = {}
        self._routable: tuple[float, bool] | None = None

    def decide(self, registry: ProviderRegistry, history: Sequence[Message], latency: dict[str, Latency], *,
               last_step: bool, tenant: dict[str, Any] | None = None, system: str = "",
               tools: tuple[ToolSchema, ...] = ()) -> RoutingDecision:
        """The step's model. ``tenant``: the tenant's own terms (its settings' ``routing``), which
        tighten the deployment's: the lower cost ceiling and latency SLA win. ``system`` and
        ``tools``: what the step's request carries besides the history, priced with it."""
        routing = self.settings.llm.routing
        own = tenant or {}
        task = task_of(history, last_step=last_step,
                       cost_ceiling_usd=_tighter(routing.cost_ceiling_usd, own.get("cost_ceiling_usd")),
                       latency_sla_ms=_tighter(routing.latency_sla_ms, own.get("latency_sla_ms")),
                       required=frozenset(routing.required_capabilities), prompt_chars=self.prompt_chars(system, tools))
        models = catalog(registry, self.settings, latency)
        if not models:
            raise _no_route()
        return replace(self.strategy.select(task, models), task=task)

    def prompt_chars(self, system: str, tools: tuple[ToolSchema, ...]) -> int:
        """Characters of a request's system prompt and tool schemas (as JSON, the way vendors get
        them), worked out once per prompt and tool set.

        Keyed by the schemas themselves, not their tuple: a request holds a copy of the registry's
        cached tuple (pydantic builds a new one) with the same schema objects, so a key on the
        tuple missed on every step and encoded sixteen schemas each time (6% of a turns worker's
        CPU, py-spy). The entry keeps its schemas, so their ids cannot be reused while it stands."""
        key = (system, tuple(map(id, tools)))
        cached = self._prompts.get(key)
        if cached is not None and all(a is b for a, b in zip(cached[0], tools, strict=True)):
            return cached[1]
        chars = len(system) + (len(json.dumps([t.model_dump() for t in tools])) if tools else 0)
        if len(self._prompts) >= 256:  # profiles x tool policies are few; stay bounded all the same
            self._prompts.clear()
        self._prompts[key] = (tools, chars)
        return chars

    def check_routable(self, registry: ProviderRegistry) -> None:
        """Refuse ``model: "auto"`` up front (no_route) when no model could be routed to, as a
        pinned model that cannot answer is refused. Configuration decides it, not a vendor call,
        so the answer is kept a while: posts ask on every message."""
        now = time.monotonic()
        cached = self._routable
        if cached is None or now - cached[0] >= CACHE_S:
            cached = self._routable = (now, bool(catalog(registry, self.settings, {})))
        if not cached[1]:
            raise _no_route()

    def candidates(self, registry: ProviderRegistry, decision: RoutingDecision) -> list[Candidate]:
        chain = [decision.chosen] + ([decision.fallback] if decision.fallback else [])
        return [Candidate(registry.get(m.provider), m.model) for m in chain]

    def first_token_deadline(self, decision: RoutingDecision) -> float | None:
        """Seconds the chosen model may take to its first token before its fallback answers:
        a multiple of its measured p95; None when it is unmeasured or there is no fallback."""
        latency = decision.chosen.latency
        if decision.fallback is None or latency is None:
            return None
        routing = self.settings.llm.routing
        return max(routing.first_token_floor_ms, routing.first_token_factor * latency.first_token_p95_ms) / 1000


def _no_route() -> ProviderUnavailable:
    return ProviderUnavailable("no provider can answer: routing found no available model (see [llm.routing] "
                               "candidates and the providers' configuration)", code="no_route")


__all__ = ["AUTO", "LatencyBook", "Router", "catalog", "is_auto", "measure"]
