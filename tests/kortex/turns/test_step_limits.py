"""A model that asks for more calls than a step runs, every step, for ever (from a bounds audit):
the step runs its limit and refuses the rest, and the turn ends at max_tool_depth."""

from __future__ import annotations

import json
from typing import Any

from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

MODEL = "openai:gpt-4o"  # 128k tokens of context, $2.5 / $10 per million tokens


def _harness(harness_factory: Any, fake: FakeLLM, **overrides: Any) -> Harness:
    llm = overrides.pop("llm", {})
    providers = {v: vendor_config(v, fake.url, max_retries=0) for v in ("openai", "ollama")}
    return harness_factory(llm={"providers": providers, **llm}, **overrides)  # type: ignore[no-any-return]


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def test_steps_and_calls_per_step_stop_at_their_limits(harness_factory: Any, fake: FakeLLM) -> None:
    """Checked and holding: a model that asks for 17 calls every step forever gets 16 run and the
    17th refused per step, and the turn ends after max_tool_depth (8) + 1 model calls."""
    calls = [{"id": f"call_{n}", "name": "debug_echo", "arguments": {"text": str(n)}} for n in range(17)]
    fake.add("gpt-4o", {"steps": [{"text": ["again"], "tool_calls": calls}], "loop": True})
    h = _harness(harness_factory, fake)
    tenant = h.tenant("loop")
    turn = h.ask(tenant, "why?", model=MODEL)
    assert turn.status == "done" and turn.error["code"] == "tool_depth_exceeded"
    assert len(fake.requests) == h.settings.llm.max_tool_depth + 1
    results = [e for e in _events(h, turn.id) if e["type"] == "tool_result"]
    refused = [e for e in results if e["error_code"] == "too_many_calls"]
    assert (len(results), len(refused)) == (17 * 8, 8)
