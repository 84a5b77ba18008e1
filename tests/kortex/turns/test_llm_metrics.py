"""An LLM call as the metrics count it (kortex/turns/billing.py): by provider and model, where a
model id a caller may name at will (``allow_unlisted_models``) shares one label."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from kortex import metrics
from kortex.testing.fakellm import FakeLLM
from tests.kortex.llm.conftest import vendor_config


def _models() -> set[str]:
    return {s.labels["model"] for m in metrics.LLM_CALLS.collect() for s in m.samples}


def _calls(model: str) -> float:
    return REGISTRY.get_sample_value("kortex_llm_calls_total",
                                     {"provider": "anthropic", "model": model, "outcome": "ok"}) or 0


def test_models_only_a_caller_named_share_one_label_and_configured_ones_keep_theirs(harness_factory: Any,
                                                                                     fake: FakeLLM) -> None:
    made_up = [f"made-up-model-{i}" for i in range(3)]
    for name in [*made_up, "claude-sonnet-4-6"]:
        fake.add(name, {"steps": [{"text": ["Fine."]}]})
    h = harness_factory(llm={"default_provider": "anthropic", "providers": {
        "anthropic": vendor_config("anthropic", fake.url, max_retries=0, allow_unlisted_models=True)}})
    tenant = h.tenant("acme")
    unlisted, listed = _calls("unlisted"), _calls("claude-sonnet-4-6")
    for name in made_up:
        assert h.ask(tenant, "hi", model=f"anthropic:{name}").status == "done"
    assert h.ask(tenant, "hi", model="anthropic:claude-sonnet-4-6").status == "done"
    assert _calls("unlisted") == unlisted + 3
    assert _calls("claude-sonnet-4-6") == listed + 1  # the catalogue's: bounded, so named
    assert not _models() & set(made_up)
