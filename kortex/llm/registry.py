"""Provider registry: builds configured providers once per process and resolves model specs.

A model spec is ``provider:model`` (``anthropic:claude-sonnet-4-6``), a bare provider name
(its default model), or a bare model id that one configured provider offers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kortex.config import ProviderSettings, Settings
from kortex.errors import ConfigError, InvalidInput, ProviderError, ProviderUnavailable
from kortex.llm.base import ModelInfo, Provider

log = logging.getLogger(__name__)

ProviderFactory = Callable[[str, ProviderSettings, Settings], Provider]
#: the provider local-only mode falls back to
LOCAL_PROVIDER = "ollama"


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    name: str
    available: bool
    reason: str | None
    models: tuple[ModelInfo, ...]
    local: bool  # its requests stay on this network (a model may still leave it: see its display name)
    synthetic: bool
    reachable: bool | None = None  # None: not probed (cloud providers are not called to list models)
    problems: tuple[str, ...] = ()  # configuration worth fixing that does not stop the provider


@dataclass(frozen=True, slots=True)
class Resolved:
    provider: Provider
    model: ModelInfo

    @property
    def spec(self) -> str:
        return f"{self.provider.name}:{self.model.id}"


class ProviderRegistry:
    def __init__(self, settings: Settings, factories: dict[str, ProviderFactory]) -> None:
        self.settings = settings
        self._factories = factories
        self._providers: dict[str, Provider] = {}
        self._unavailable: dict[str, str] = {}
        self._check_names()

    def _check_names(self) -> None:
        """Provider names in ``[llm]`` must be providers of this build: a typo would otherwise
        fail every turn (a default) or silently never fail over (a fallback)."""
        llm = self.settings.llm
        known = ", ".join(self._factories)
        named = [("llm.default_provider", llm.default_provider)]
        named += [(f"llm.fallback_providers[{i}]", f) for i, f in enumerate(llm.fallback_providers)]
        if llm.default_model and ":" in llm.default_model:
            named.append(("llm.default_model", llm.default_model.partition(":")[0]))
        for where, name in named:
            if name not in self._factories:
                raise ConfigError(f"{where}: no provider named {name!r} (known: {known})")
        unused = sorted(set(llm.providers) - set(self._factories))
        if unused:
            log.warning("llm.providers names providers this build does not have: %s (known: %s)",
                        ", ".join(unused), known)

    def names(self) -> list[str]:
        return list(self._factories)

    def get(self, name: str) -> Provider:
        if name in self._providers:
            return self._providers[name]
        if name in self._unavailable:
            raise ProviderUnavailable(self._unavailable[name], provider=name)
        factory = self._factories.get(name)
        if factory is None:
            raise ProviderUnavailable(f"no provider named {name!r}", provider=name)
        config = self.settings.llm.providers.get(name, ProviderSettings())
        if not config.enabled:
            self._unavailable[name] = "disabled in configuration"
            raise ProviderUnavailable(self._unavailable[name], provider=name)
        try:
            provider = factory(name, config, self.settings)
        except ProviderUnavailable as exc:
            self._unavailable[name] = exc.message
            raise
        except (ConfigError, ProviderError) as exc:
            self._unavailable[name] = exc.message
            raise ProviderUnavailable(exc.message, provider=name) from exc
        self._providers[name] = provider
        return provider

    def status(self, unreachable: dict[str, str] | None = None) -> list[ProviderStatus]:
        """Every provider of the build, whether it can be used and why not; ``unreachable`` is
        what ``probe`` found. Never includes secrets."""
        unreachable = unreachable or {}
        local_only = self.settings.llm.local_only
        out = []
        for name in self._factories:
            try:
                provider = self.get(name)
            except ProviderError as exc:
                out.append(ProviderStatus(name, False, exc.message, (), False, False))
                continue
            models = tuple(provider.models())
            # "local" only where requests stay here: an Ollama at ollama.com is not
            local = provider.local and not provider.leaves_network()
            problems = tuple(getattr(provider, "problems", ()))
            if local_only and provider.leaves_network():
                out.append(ProviderStatus(name, False, "refused in local-only mode", models, False, False,
                                          problems=problems))
            elif name in unreachable:
                out.append(ProviderStatus(name, False, unreachable[name], models, local, provider.synthetic,
                                          reachable=False, problems=problems))
            else:
                probed = True if hasattr(provider, "refresh_models") else None
                out.append(ProviderStatus(name, True, None, models, local, provider.synthetic,
                                          reachable=probed, problems=problems))
        return out

    async def probe(self, timeout: float = 2.0) -> dict[str, str]:
        """Refresh the model lists of providers that ask a server for them (Ollama's
        ``/api/tags``); returns why each unreachable one failed."""
        failures: dict[str, str] = {}
        for name in self._factories:
            try:
                provider = self.get(name)
            except ProviderError:
                continue
            refresh = getattr(provider, "refresh_models", None)
            if refresh is None:
                continue
            try:
                await asyncio.wait_for(refresh(timeout=timeout), timeout + 1)
            except ProviderError as exc:
                failures[name] = f"unreachable: {exc.message}"
            except TimeoutError:
                failures[name] = "unreachable: no answer in time"
        return failures

    def find(self, spec: str | None) -> Resolved:
        """The provider and model for ``spec``, whatever the mode."""
        return self._resolve(spec)

    def resolve(self, spec: str | None) -> Resolved:
        """Find the provider and model for ``spec`` (None: the configured default). In
        local-only mode a model whose requests leave the network (``Provider.leaves_network``)
        is refused here when a caller names it, before anything is queued; a configured default
        that is one gives way to the local provider."""
        resolved = self._resolve(spec)
        provider, model = resolved.provider, resolved.model
        if self.settings.llm.local_only and provider.leaves_network(model.id):
            if not spec:
                local = self.get(LOCAL_PROVIDER)
                return Resolved(local, local.model_info(self._configured_model(LOCAL_PROVIDER)))
            if provider.leaves_network():
                raise ProviderUnavailable(
                    f"provider {provider.name!r} sends data off this network, which local-only mode forbids; "
                    "use a local provider such as 'ollama'", provider=provider.name, code="local_only")
            raise ProviderUnavailable(
                f"model {model.id!r} of {provider.name!r} is served off this network, which local-only mode "
                "forbids", provider=provider.name, model=model.id, code="local_only")
        return resolved

    def _resolve(self, spec: str | None) -> Resolved:
        if not spec:
            default = self.settings.llm.default_model
            if default:
                return self._resolve(default)
            provider = self.get(self.settings.llm.default_provider)
            return Resolved(provider, provider.model_info(self._configured_model(provider.name)))
        name, sep, model_id = spec.partition(":")
        if sep:
            if not name:
                raise InvalidInput(f"model {spec!r}: missing provider before ':'")
            provider = self.get(name)
            return Resolved(provider, provider.model_info(model_id or self._configured_model(name)))
        if spec in self._factories:
            provider = self.get(spec)
            return Resolved(provider, provider.model_info(self._configured_model(spec)))
        for candidate in self._factories:
            try:
                provider = self.get(candidate)
            except ProviderError:
                continue
            if any(m.id == spec for m in provider.models()):
                return Resolved(provider, provider.model_info(spec))
        raise InvalidInput(f"unknown model {spec!r}; use provider:model, e.g. 'offline:analyst'")

    def _configured_model(self, name: str) -> str | None:
        config = self.settings.llm.providers.get(name)
        return config.model if config else None

    async def aclose(self) -> None:
        for provider in self._providers.values():
            try:
                await provider.aclose()
            except Exception:  # closing must never mask the shutdown reason
                log.exception("closing provider %s failed", provider.name)
