"""The models each cloud vendor offers and their list prices (rfc-005 §4), with per-model
overrides from configuration. Prices are USD per million tokens; the first model is the default."""

from __future__ import annotations

from collections.abc import Sequence

from kortex.config import ProviderSettings
from kortex.llm.base import ModelInfo

ANTHROPIC: tuple[ModelInfo, ...] = (
    ModelInfo(id="claude-opus-4-6", display_name="Claude Opus 4.6 (1M context)", context_tokens=1_000_000,
              tier="deep", input_usd_per_mtok=15.0, output_usd_per_mtok=75.0),
    ModelInfo(id="claude-sonnet-4-6", display_name="Claude Sonnet 4.6", context_tokens=200_000,
              tier="balanced", input_usd_per_mtok=3.0, output_usd_per_mtok=15.0),
    ModelInfo(id="claude-haiku-4-6", display_name="Claude Haiku 4.6", context_tokens=200_000,
              tier="fast", input_usd_per_mtok=1.0, output_usd_per_mtok=5.0),
)

OPENAI: tuple[ModelInfo, ...] = (
    ModelInfo(id="gpt-5", display_name="GPT-5", context_tokens=400_000, tier="deep",
              input_usd_per_mtok=12.0, output_usd_per_mtok=60.0),
    ModelInfo(id="gpt-4o", display_name="GPT-4o", context_tokens=128_000, tier="balanced",
              input_usd_per_mtok=2.5, output_usd_per_mtok=10.0),
    ModelInfo(id="gpt-4o-mini", display_name="GPT-4o mini", context_tokens=128_000, tier="fast",
              input_usd_per_mtok=0.15, output_usd_per_mtok=0.6),
)


def priced(catalogue: Sequence[ModelInfo], config: ProviderSettings) -> tuple[ModelInfo, ...]:
    """The catalogue with configured prices applied; models only the configuration names
    (a newer model, a model of an OpenAI-compatible server) are appended."""
    out = []
    for model in catalogue:
        price = config.prices.get(model.id)
        if price:
            model = model.model_copy(update={
                "input_usd_per_mtok": price.get("input", model.input_usd_per_mtok),
                "output_usd_per_mtok": price.get("output", model.output_usd_per_mtok)})
        out.append(model)
    known = {m.id for m in out}
    for model_id, price in config.prices.items():
        if model_id not in known:
            out.append(ModelInfo(id=model_id, display_name=model_id, tier="balanced",
                                 input_usd_per_mtok=price.get("input", 0.0),
                                 output_usd_per_mtok=price.get("output", 0.0)))
    return tuple(out)


def fast_model(models: Sequence[ModelInfo], config: ProviderSettings) -> str | None:
    """The model frugal mode tries first: configured, else the catalogue's fast tier."""
    if config.fast_model:
        return config.fast_model
    return next((m.id for m in models if m.tier == "fast"), None)
