"""Recovery as ``[llm.anomalies]`` configures it, over the vendor's real wire format (the fake LLM
answers as Anthropic): the turn's limit on reruns covers every action that runs the model again,
a slow first token is abandoned only when the deployment says so, a mapped action is the one
that runs (or is refused at startup), and the action announced is the action taken."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kortex.config import Settings
from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config
from tests.kortex.turns.test_routing import _measured

FAST, BALANCED, STRONG = "claude-haiku-4-6", "claude-sonnet-4-6", "claude-opus-4-6"
SIMPLE, COMPLEX = "Is checkout up?", "Why did checkout's p99 regress after the deploy, and what caused it?"
CALL = {"name": "get_logs", "arguments": {"product": "checkout", "time_range": "last 1h"}}


def _stack(harness_factory: Any, fake: FakeLLM, anomalies: dict[str, Any] | None = None, *,
           depth: int | None = None, **routing: Any) -> Harness:
    llm: dict[str, Any] = {
        "providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
        "default_provider": "anthropic",
        "routing": {"candidates": [f"anthropic::{m}" for m in (FAST, BALANCED, STRONG)], **routing}}
    if anomalies is not None:
        llm["anomalies"] = anomalies
    if depth is not None:
        llm["max_tool_depth"] = depth
    h: Harness = harness_factory(llm=llm)
    return h


def _events(h: Harness, turn_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, json.loads(e.data)) for e in h.events(turn_id)]


def _answer(words: str, **step: Any) -> dict[str, Any]:
    return {"steps": [{"text": [w + " " for w in words.split()], **step}]}


@pytest.mark.parametrize("action", ["retry", "rollback", "fallback"])
def test_the_turn_s_rerun_limit_covers_rollbacks_and_fallbacks_too(harness_factory: Any, fake: FakeLLM,
                                                                    action: str) -> None:
    # Every model calls the same tool at every step: each step from the second is a repeated call.
    looping = {"steps": [{"text": ["Looking."], "tool_calls": [{**CALL, "id": f"toolu_{i}"}]} for i in range(20)],
               "loop": True}
    for model in (FAST, BALANCED, STRONG):
        fake.add(model, looping)
    h = _stack(harness_factory, fake, {"actions": {"repeated_tool_call": action}, "max_retries_per_turn": 1,
                                       "repeated_calls_escalate": 50}, depth=6)
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, COMPLEX, model="auto")
    reruns = [(d["step"], d["action"]) for t, d in _events(h, turn.id) if t == "recovery" and d["action"] != "continue"]
    assert reruns == [(1, action)]  # once a turn: later steps' repeats are noted, not run again
    assert len(fake.requests) == 7 + 1  # steps 0-6, and the one rerun


@pytest.mark.parametrize("anomalies", [{"scope": "off"}, {"actions": {"latency_spike": "continue"}}])
def test_a_slow_first_token_is_waited_out_when_the_deployment_does_not_check_or_map_it_to_fallback(
        harness_factory: Any, fake: FakeLLM, anomalies: dict[str, Any]) -> None:
    fake.add(STRONG, _answer("Slow but fine answer from the strong model.", first_token_ms=1500))
    fake.add(FAST, _answer("The fallback answers promptly with the findings."))
    h = _stack(harness_factory, fake, anomalies, min_latency_samples=3, first_token_floor_ms=300,
               first_token_factor=2.0)
    tenant = h.tenant("acme")
    _measured(h, tenant, STRONG, first_token_ms=100)  # usually quick: 1.5 s would be a spike
    turn = h.ask(tenant, COMPLEX, model="auto")
    kinds = [t for t, _ in _events(h, turn.id)]
    assert turn.status == "done" and [r.body["model"] for r in fake.requests] == [STRONG]
    assert "anomaly" not in kinds and "recovery" not in kinds
    assert h.messages(tenant, turn.session_id)[-1].content.startswith("Slow but fine")


def test_a_cost_overrun_mapped_to_escalate_ends_the_turn(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(FAST, _answer("Checkout is up and serving normally today.",
                           usage={"input_tokens": 200_000, "output_tokens": 5000}))
    h = _stack(harness_factory, fake, {"actions": {"cost_overrun": "escalate"}})
    turn = h.ask(h.tenant("acme"), SIMPLE, model="auto")
    events = _events(h, turn.id)
    anomaly = next(d for t, d in events if t == "anomaly")
    assert anomaly["kind"] == "cost_overrun" and anomaly["recommended"] == "escalate"
    assert [d["action"] for t, d in events if t == "recovery"] == ["escalate"]
    assert turn.status == "failed" and turn.error["code"] == "cost_overrun"
    done = next(d for t, d in events if t == "done")
    assert done["status"] == "failed" and done["usage"]["input_tokens"] == 200_000  # the call is still billed


def test_the_last_step_with_tools_mapped_to_escalate_ends_the_turn_before_the_answer_step(
        harness_factory: Any, fake: FakeLLM) -> None:
    script = {"steps": [{"text": ["Looking."], "tool_calls": [{**CALL, "id": "toolu_1"}]}]}
    for model in (FAST, BALANCED, STRONG):
        fake.add(model, script)
    h = _stack(harness_factory, fake, {"actions": {"chain_depth": "escalate"}}, depth=1)
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, COMPLEX, model="auto")
    assert turn.status == "failed" and turn.error["code"] == "chain_depth" and len(fake.requests) == 1
    assert [(d["kind"], d["recommended"]) for t, d in _events(h, turn.id) if t == "anomaly"] == [
        ("chain_depth", "escalate")]


def test_an_uncited_answer_mapped_to_escalate_ends_the_turn(harness_factory: Any, fake: FakeLLM) -> None:
    script = {"steps": [
        {"text": ["Reading."], "tool_calls": [{"id": "toolu_1", "name": "get_recent_deploys",
                                               "arguments": {"product": "checkout", "time_range": "last 24h"}}]},
        {"text": ["The deploy shrank the pool, which caused the regression."]}]}
    for model in (FAST, BALANCED, STRONG):  # whichever the router picks for reading the result
        fake.add(model, script)
    h = _stack(harness_factory, fake, {"actions": {"uncited_answer": "escalate"}})
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, COMPLEX, model="auto")
    events = _events(h, turn.id)
    assert [(d["kind"], d["recommended"]) for t, d in events if t == "anomaly"] == [("uncited_answer", "escalate")]
    assert [d["action"] for t, d in events if t == "recovery"] == ["escalate"]
    assert turn.status == "failed" and turn.error["code"] == "uncited_answer"


def test_what_an_anomaly_announces_is_what_recovery_does(harness_factory: Any, fake: FakeLLM) -> None:
    # The default: a cost overrun is noted, and said to be.
    fake.add(FAST, _answer("Checkout is up and serving normally today.",
                           usage={"input_tokens": 200_000, "output_tokens": 5000}))
    h = _stack(harness_factory, fake)
    turn = h.ask(h.tenant("acme"), SIMPLE, model="auto")
    events = _events(h, turn.id)
    recommended = [d["recommended"] for t, d in events if t == "anomaly"]
    assert recommended == [d["action"] for t, d in events if t == "recovery"] == ["continue"]
    assert turn.status == "done"


@pytest.mark.parametrize("kind,action", [
    ("cost_overrun", "retry"), ("chain_depth", "rollback"), ("context_degradation", "fallback"),
    ("uncited_answer", "retry"), ("latency_spike", "escalate"),
])
def test_an_action_a_kind_cannot_take_is_refused_at_startup(kind: str, action: str) -> None:
    with pytest.raises(ValueError, match=f"{kind} cannot {action}"):
        Settings(llm={"anomalies": {"actions": {kind: action}}})
    # What each can take is accepted.
    Settings(llm={"anomalies": {"actions": {kind: "continue"}}})
