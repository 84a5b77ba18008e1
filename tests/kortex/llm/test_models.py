"""Which models a provider offers and what they cost: callers may only name listed models,
configured ids outside the catalogue work (priced from configuration), cached tokens are
costed at cache prices."""

from __future__ import annotations

from typing import Any

import pytest

from kortex.config import Settings
from kortex.errors import ProviderError
from kortex.llm import catalog
from kortex.llm.base import DoneChunk, ModelInfo, TokenUsage
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderRegistry
from kortex.llm.router import plan
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import collect, make_provider, request, vendor_config


def registry(url: str, **providers: dict[str, Any]) -> ProviderRegistry:
    configured = {name: vendor_config(name, url, **extra) for name, extra in providers.items()}
    return ProviderRegistry(Settings(llm={"providers": configured, "default_provider": next(iter(providers))}),
                            BUILTIN_PROVIDERS)


OPENROUTER_STYLE = "anthropic/claude-opus-4"


def test_a_caller_cannot_name_a_model_the_provider_does_not_list(fake: FakeLLM) -> None:
    reg = registry(fake.url, openai={"model": "local-llama"})  # a compatible server (not api.openai.com)
    with pytest.raises(ProviderError) as caught:
        plan(reg, f"openai:{OPENROUTER_STYLE}")
    assert caught.value.code == "unknown_model"
    with pytest.raises(ProviderError):
        reg.resolve(f"openai:{OPENROUTER_STYLE}")  # what posting a message checks: a 4xx, no turn
    assert plan(reg, "openai:local-llama")[0].model.id == "local-llama"  # configured: listed
    assert plan(reg, "openai:gpt-4o-mini")[0].model.input_usd_per_mtok == 0.15  # catalogue: listed


def test_allow_unlisted_models_accepts_any_id_priced_from_configuration(fake: FakeLLM) -> None:
    reg = registry(fake.url, openai={"allow_unlisted_models": True,
                                     "prices": {"priced/model": {"input": 1.0, "output": 2.0}}})
    free = plan(reg, f"openai:{OPENROUTER_STYLE}")[0].model
    assert free.id == OPENROUTER_STYLE and free.input_usd_per_mtok == 0 and free.output_usd_per_mtok == 0
    priced = plan(reg, "openai:priced/model")[0].model
    assert (priced.input_usd_per_mtok, priced.output_usd_per_mtok) == (1.0, 2.0)


def test_a_configured_model_outside_the_catalogue_answers_and_is_priced_from_configuration(fake: FakeLLM) -> None:
    fake.add("claude-opus-4-7", {"steps": [{"text": ["new model"], "usage": {"input_tokens": 1000,
                                                                             "output_tokens": 100}}]})
    reg = registry(fake.url, anthropic={"model": "claude-opus-4-7", "prices": {"claude-opus-4-7": {
        "input": 5.0, "output": 25.0}}})
    [head] = plan(reg, None)
    assert head.spec == "anthropic:claude-opus-4-7"  # not skipped for the fallback
    assert head.model.cost(1000, 100) == pytest.approx((1000 * 5 + 100 * 25) / 1e6)
    provider = reg.get("anthropic")
    assert provider.default_model().id == "claude-opus-4-7"  # the configured model leads the list
    chunks = collect(provider, request("anthropic").model_copy(update={"model": "claude-opus-4-7"}))
    assert isinstance(chunks[-1], DoneChunk) and chunks[-1].usage.input_tokens == 1000
    [status] = [s for s in reg.status() if s.name == "anthropic"]
    assert status.available and status.problems == ()


def test_an_unpriced_configured_model_works_and_the_status_says_it_costs_nothing(fake: FakeLLM) -> None:
    reg = registry(fake.url, anthropic={"model": "claude-opus-4-7"})
    assert plan(reg, None)[0].spec == "anthropic:claude-opus-4-7"
    [status] = [s for s in reg.status() if s.name == "anthropic"]
    assert status.available and any("claude-opus-4-7" in p and "$0" in p for p in status.problems)


def test_a_bad_fast_model_means_no_fast_model_not_no_provider(fake: FakeLLM) -> None:
    settings = Settings(llm={"mode": "frugal", "default_provider": "anthropic", "providers": {
        "anthropic": vendor_config("anthropic", fake.url, fast_model="claude haiku")}})
    reg = ProviderRegistry(settings, BUILTIN_PROVIDERS)
    [head] = plan(reg, None)
    assert head.spec == "anthropic:claude-opus-4-6" and head.fast is None
    [status] = [s for s in reg.status() if s.name == "anthropic"]
    assert status.available and any("fast_model" in p for p in status.problems)
    newer = Settings(llm={"mode": "frugal", "default_provider": "anthropic", "providers": {
        "anthropic": vendor_config("anthropic", fake.url, fast_model="claude-haiku-4-7")}})
    [head] = plan(ProviderRegistry(newer, BUILTIN_PROVIDERS), None)
    assert head.fast is not None and head.fast.id == "claude-haiku-4-7"  # an id the catalogue lacks still works


def test_a_configured_model_that_cannot_be_an_id_makes_the_provider_unavailable_with_a_reason(fake: FakeLLM) -> None:
    reg = registry(fake.url, anthropic={"model": "claude opus"})
    [status] = [s for s in reg.status() if s.name == "anthropic"]
    assert not status.available and "model" in (status.reason or "")


def test_the_catalogue_keeps_the_ids_rfc_005_names() -> None:
    assert [m.id for m in catalog.ANTHROPIC] == ["claude-opus-4-6", "claude-sonnet-4-6", "claude-haiku-4-6"]
    assert [m.id for m in catalog.OPENAI] == ["gpt-5", "gpt-4o", "gpt-4o-mini"]
    assert (catalog.ANTHROPIC[0].input_usd_per_mtok, catalog.ANTHROPIC[0].output_usd_per_mtok) == (15.0, 75.0)
    assert (catalog.OPENAI[0].input_usd_per_mtok, catalog.OPENAI[0].output_usd_per_mtok) == (12.0, 60.0)


def test_cached_tokens_cost_the_cache_price() -> None:
    model = ModelInfo(id="m", input_usd_per_mtok=3.0, output_usd_per_mtok=15.0, cache_read_usd_per_mtok=0.3,
                      cache_write_usd_per_mtok=3.75)
    usage = TokenUsage(input_tokens=1_300_000, output_tokens=0, cache_read_tokens=1_000_000,
                       cache_write_tokens=200_000)
    assert model.cost_of(usage) == pytest.approx(0.1 * 3.0 + 1.0 * 0.3 + 0.2 * 3.75)
    assert ModelInfo(id="n", input_usd_per_mtok=3.0).cost_of(usage) == pytest.approx(1.3 * 3.0)  # no cache price


@pytest.mark.parametrize("vendor", ["anthropic", "openai"])
def test_cache_usage_is_read_from_each_vendor_and_costed(fake: FakeLLM, vendor: str) -> None:
    model = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o"}[vendor]
    fake.add(model, {"steps": [{"text": ["cached"], "usage": {
        "input_tokens": 100, "output_tokens": 10, "cache_read_tokens": 5000,
        "cache_write_tokens": 400 if vendor == "anthropic" else 0}}]})
    provider = make_provider(vendor, fake.url)
    done = collect(provider, request(vendor).model_copy(update={"model": model}))[-1]
    assert isinstance(done, DoneChunk)
    write = 400 if vendor == "anthropic" else 0
    assert done.usage == TokenUsage(input_tokens=5100 + write, output_tokens=10, cache_read_tokens=5000,
                                    cache_write_tokens=write)
    info = provider.model_info(model)
    assert info.cost_of(done.usage) < info.cost(done.usage.input_tokens, 10)  # cheaper than all at full price
    if vendor == "anthropic":
        assert info.cost_of(done.usage) == pytest.approx((100 * 3 + 5000 * 0.3 + 400 * 3.75 + 10 * 15) / 1e6)
    else:
        assert info.cost_of(done.usage) == pytest.approx((100 * 2.5 + 5000 * 1.25 + 10 * 10) / 1e6)


def test_configured_cache_prices_override_the_catalogue(fake: FakeLLM) -> None:
    provider = make_provider("anthropic", fake.url, prices={"claude-sonnet-4-6": {"cache_read": 0.5}})
    info = provider.model_info("claude-sonnet-4-6")
    assert info.cache_read_usd_per_mtok == 0.5 and info.cache_write_usd_per_mtok == 3.75
