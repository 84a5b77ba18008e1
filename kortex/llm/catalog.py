"""The models each cloud vendor offers and their list prices (rfc-005 §4), with per-model
overrides from configuration. Prices are USD per million tokens; the first model is the default.

The ids are the ones rfc-005 names. A deployment that needs another id (a newer model, a dated
snapshot) configures it as ``model``/``fast_model`` and gives it a price under ``prices``.
Cache prices follow the vendors' published ratios: Anthropic bills prompt-cache reads at 0.1x
and writes at 1.25x the input price; OpenAI bills cached input at 0.5x (GPT-5: 0.1x).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kortex.config import ProviderSettings
from kortex.llm.base import ModelInfo, Tier

DEFAULT_CONTEXT = 128_000
_MODEL_ID = re.compile(r"^[\x21-\x7e]{1,200}\Z")  # printable ASCII, no spaces

ANTHROPIC: tuple[ModelInfo, ...] = (
    ModelInfo(id="claude-opus-4-6", display_name="Claude Opus 4.6 (1M context)", context_tokens=1_000_000,
              tier="powerful", input_usd_per_mtok=15.0, output_usd_per_mtok=75.0,
              cache_read_usd_per_mtok=1.5, cache_write_usd_per_mtok=18.75),
    ModelInfo(id="claude-sonnet-4-6", display_name="Claude Sonnet 4.6", context_tokens=200_000,
              tier="balanced", input_usd_per_mtok=3.0, output_usd_per_mtok=15.0,
              cache_read_usd_per_mtok=0.3, cache_write_usd_per_mtok=3.75),
    ModelInfo(id="claude-haiku-4-6", display_name="Claude Haiku 4.6", context_tokens=200_000,
              tier="fast", input_usd_per_mtok=1.0, output_usd_per_mtok=5.0,
              cache_read_usd_per_mtok=0.1, cache_write_usd_per_mtok=1.25),
)

OPENAI: tuple[ModelInfo, ...] = (
    ModelInfo(id="gpt-5", display_name="GPT-5", context_tokens=400_000, tier="powerful",
              input_usd_per_mtok=12.0, output_usd_per_mtok=60.0, cache_read_usd_per_mtok=1.2),
    ModelInfo(id="gpt-4o", display_name="GPT-4o", context_tokens=128_000, tier="balanced",
              input_usd_per_mtok=2.5, output_usd_per_mtok=10.0, cache_read_usd_per_mtok=1.25),
    ModelInfo(id="gpt-4o-mini", display_name="GPT-4o mini", context_tokens=128_000, tier="fast",
              input_usd_per_mtok=0.15, output_usd_per_mtok=0.6, cache_read_usd_per_mtok=0.075),
)


def valid_id(model_id: str) -> bool:
    return bool(_MODEL_ID.match(model_id))


def with_price(model: ModelInfo, config: ProviderSettings) -> ModelInfo:
    price = config.prices.get(model.id)
    if not price:
        return model
    return model.model_copy(update={
        "input_usd_per_mtok": price.get("input", model.input_usd_per_mtok),
        "output_usd_per_mtok": price.get("output", model.output_usd_per_mtok),
        "cache_read_usd_per_mtok": price.get("cache_read", model.cache_read_usd_per_mtok),
        "cache_write_usd_per_mtok": price.get("cache_write", model.cache_write_usd_per_mtok)})


def unlisted(model_id: str, config: ProviderSettings, tier: Tier = "balanced") -> ModelInfo:
    """A model the catalogue does not know: priced from configuration, else free."""
    return with_price(ModelInfo(id=model_id, display_name=model_id, tier=tier,
                                 context_tokens=config.context_tokens or DEFAULT_CONTEXT), config)


def priced(catalogue: Sequence[ModelInfo], config: ProviderSettings) -> tuple[ModelInfo, ...]:
    """The catalogue with configured prices applied; models only the configuration prices
    (a newer model, a model of an OpenAI-compatible server) are appended."""
    out = [with_price(model, config) for model in catalogue]
    known = {m.id for m in out}
    out += [unlisted(model_id, config) for model_id in config.prices if model_id not in known]
    return tuple(out)


def offered(catalogue: Sequence[ModelInfo], config: ProviderSettings) -> tuple[tuple[ModelInfo, ...], list[str]]:
    """The models a provider offers, the configured ``model`` first (the default), and what is
    wrong with the configuration. A configured id outside the catalogue is offered (priced from
    ``prices``); one that cannot be a model id is not, and a bad ``fast_model`` only means
    frugal mode has no fast model here."""
    problems: list[str] = []
    models = list(priced(catalogue, config))
    known = {m.id for m in models}
    configured: tuple[tuple[str, str | None, Tier], ...] = (
        ("model", config.model, "balanced"), ("fast_model", config.fast_model, "fast"))
    for key, model_id, tier in configured:
        if not model_id or model_id in known:
            continue
        if not valid_id(model_id):
            problems.append(f"{key} is not a valid model id (printable characters, no spaces)"
                            + ("; frugal mode has no fast model here" if key == "fast_model" else ""))
            continue
        models.append(unlisted(model_id, config, tier))
        known.add(model_id)
        if model_id not in config.prices:
            problems.append(f"{key} {model_id!r} is not in the built-in catalogue and has no price under "
                            "prices: its calls are counted at $0")
    if config.model and config.model in known:
        models.sort(key=lambda m: m.id != config.model)  # stable: the rest keep their order
    return tuple(models), problems


def fast_model(models: Sequence[ModelInfo], config: ProviderSettings) -> str | None:
    """The model frugal mode tries first: configured, else the catalogue's fast tier."""
    if config.fast_model:
        return config.fast_model
    return next((m.id for m in models if m.tier == "fast"), None)
