"""``model: "auto"``: each step's model is chosen by the router, over the vendor's real wire
format (the fake LLM answers as Anthropic, one script per model): a cheap fast model for a
simple question, the strong one for a complex question, constraints that filter, a slow first
token that falls back, an empty answer retried once, a pinned model left alone, a looping model
stopped; every decision, anomaly and recovery on the stream and in the audit."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kortex.errors import InvalidInput
from kortex.llm.routing import (
    HeuristicRoutingStrategy,
    RouteModel,
    RoutingDecision,
    TaskSpec,
    canonical,
    complexity_of,
)
from kortex.storage import audit
from kortex.storage.audit import AuditEntry
from kortex.testing.fakellm import FakeLLM
from kortex.turns import chat
from kortex.turns.chat import turn_with_models
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

FAST, BALANCED, STRONG = "claude-haiku-4-6", "claude-sonnet-4-6", "claude-opus-4-6"
SIMPLE, COMPLEX = "Is checkout up?", "Why did checkout's p99 regress after the deploy, and what caused it?"


def _stack(harness_factory: Any, fake: FakeLLM, **routing: Any) -> Harness:
    h: Harness = harness_factory(llm={
        "providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
        "default_provider": "anthropic",
        "routing": {"candidates": [f"anthropic::{m}" for m in (FAST, BALANCED, STRONG)], **routing}})
    return h


def _events(h: Harness, turn_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, json.loads(e.data)) for e in h.events(turn_id)]


def _answer(words: str) -> dict[str, Any]:
    return {"steps": [{"text": [w + " " for w in words.split()]}]}


def test_auto_picks_the_fast_model_for_a_simple_question_and_the_strong_one_for_a_complex_one(
        harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(FAST, _answer("Checkout is up and serving normally today."))
    fake.add(STRONG, _answer("The deploy shrank the connection pool, which caused the regression."))
    h = _stack(harness_factory, fake)
    tenant = h.tenant("acme")
    simple = h.ask(tenant, SIMPLE, model="auto")
    complex_ = h.ask(tenant, COMPLEX, model="auto")
    assert simple.status == complex_.status == "done"
    assert [r.body["model"] for r in fake.requests] == [FAST, STRONG]
    route = next(d for t, d in _events(h, complex_.id) if t == "route")
    assert route["model"] == f"anthropic:{STRONG}" and route["tier"] == "powerful"
    assert route["complexity"] == "complex" and route["position"] == "plan" and route["fallback"]
    assert route["estimated_cost_usd"] > 0
    # GET /v1/turns/{id}'s view: the model of each step, and that the router chose it.
    assert turn_with_models(h.k, tenant, simple.id)[1] == [(0, f"anthropic:{FAST}", True)]
    with h.k.db.connect() as conn:
        rows = audit.list_for_turn(conn, tenant, complex_.id)
    assert [r["kind"] for r in rows if r["kind"] in ("route", "llm_call")] == ["route", "llm_call"]


def test_a_cost_ceiling_and_a_latency_sla_filter_the_candidates(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(FAST, _answer("Cheap answer from the small model here."))
    fake.add(BALANCED, _answer("Balanced answer from the middle model here."))
    # About $0.008 for the small model's step (~5,400 input tokens, mostly the system prompt and the
    # tool schemas, at $1 per million; 600 output tokens at $5), $0.025 and more for the others.
    h = _stack(harness_factory, fake, cost_ceiling_usd=0.012)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, COMPLEX, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == f"anthropic:{FAST}" and "nearest tier" in route["reason"]  # the strong one costs too much
    with h.k.db.connect() as conn:
        row = next(r for r in audit.list_for_turn(conn, tenant, turn.id) if r["kind"] == "route")
    assert f"anthropic::{STRONG}" in row["payload"]["excluded"]

    h2 = _stack(harness_factory, fake, latency_sla_ms=1000, min_latency_samples=3)
    tenant2 = h2.tenant("globex")
    _measured(h2, tenant2, STRONG, first_token_ms=4000)  # the strong model has been slow for this tenant
    _measured(h2, tenant2, BALANCED, first_token_ms=200)
    turn2 = h2.ask(tenant2, COMPLEX, model="auto")
    route2 = next(d for t, d in _events(h2, turn2.id) if t == "route")
    assert route2["model"] == f"anthropic:{BALANCED}", route2


def _measured(h: Harness, tenant: str, model: str, *, first_token_ms: int, n: int = 12) -> None:
    """Audit rows as earlier calls of ``model`` would have left them: what latency is measured from."""
    with h.k.db.begin() as conn:
        audit.write_entries(conn, [AuditEntry(
            tenant_id=tenant, kind="llm_call", subject=f"anthropic:{model}", ok=True, latency_ms=first_token_ms + 800,
            output_tokens=100, payload={"step": 0, "stop_reason": "end_turn", "first_token_ms": first_token_ms})
            for _ in range(n)])
    h.k.router.latency.forget()


def test_a_slow_first_token_is_a_latency_anomaly_and_the_fallback_answers(harness_factory: Any,
                                                                         fake: FakeLLM) -> None:
    fake.add(STRONG, {"steps": [{"text": ["too ", "late"], "first_token_ms": 3000}]})
    fake.add(FAST, _answer("The fallback answers promptly with the findings."))
    h = _stack(harness_factory, fake, min_latency_samples=3, first_token_floor_ms=300, first_token_factor=2.0)
    tenant = h.tenant("acme")
    _measured(h, tenant, STRONG, first_token_ms=100)  # usually quick: 3 s is a spike
    turn = h.ask(tenant, COMPLEX, model="auto")
    events = _events(h, turn.id)
    kinds = [t for t, _ in events]
    assert kinds.index("route") < kinds.index("anomaly") < kinds.index("recovery") < kinds.index("text")
    anomaly = next(d for t, d in events if t == "anomaly")
    recovery = next(d for t, d in events if t == "recovery")
    assert anomaly["kind"] == "latency_spike" and anomaly["recommended"] == "fallback"
    assert recovery["action"] == "fallback" and recovery["model"] == f"anthropic:{FAST}"
    text = "".join(d["delta"] for t, d in events if t == "text")
    assert text.startswith("The fallback answers") and "too" not in text  # nothing of the slow model shown
    assert turn_with_models(h.k, tenant, turn.id)[1] == [(0, f"anthropic:{FAST}", True)]
    with h.k.db.connect() as conn:
        kinds_audited = [r["kind"] for r in audit.list_for_turn(conn, tenant, turn.id)]
    assert {"route", "anomaly", "recovery"} <= set(kinds_audited)


def test_an_empty_answer_is_retried_once_as_a_new_announced_attempt(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(FAST, {"steps": [{"text": []}]})  # answers nothing at all
    fake.add(BALANCED, _answer("Checkout is up: every check passed this hour."))
    h = _stack(harness_factory, fake)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, SIMPLE, model="auto")
    events = _events(h, turn.id)
    anomaly = next(d for t, d in events if t == "anomaly")
    recovery = next(d for t, d in events if t == "recovery")
    assert anomaly["kind"] == "empty_answer" and recovery["action"] == "retry"
    assert recovery["model"] == f"anthropic:{BALANCED}"  # the decision's fallback
    assert turn.status == "done" and [r.body["model"] for r in fake.requests] == [FAST, BALANCED]
    messages = h.messages(tenant, turn.session_id)
    assert messages[-1].content == "Checkout is up: every check passed this hour. "


def test_an_empty_answer_again_after_the_retry_stands(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(FAST, {"steps": [{"text": []}]})
    fake.add(BALANCED, {"steps": [{"text": []}]})
    h = _stack(harness_factory, fake)
    turn = h.ask(h.tenant("acme"), SIMPLE, model="auto")
    assert turn.status == "done" and len(fake.requests) == 2  # once per step: no third call
    assert [d["action"] for t, d in _events(h, turn.id) if t == "recovery"] == ["retry"]


def test_a_pinned_model_is_never_rerouted_and_its_steps_are_not_checked(harness_factory: Any,
                                                                       fake: FakeLLM) -> None:
    fake.add(STRONG, {"steps": [{"text": []}]})
    h = _stack(harness_factory, fake)
    tenant = h.tenant("acme")
    turn = h.ask(tenant, SIMPLE, model=f"anthropic:{STRONG}")
    kinds = [t for t, _ in _events(h, turn.id)]
    assert "route" not in kinds and "anomaly" not in kinds and len(fake.requests) == 1
    assert turn_with_models(h.k, tenant, turn.id)[1] == [(0, f"anthropic:{STRONG}", False)]


def test_a_model_calling_the_same_tool_again_and_again_is_stopped(harness_factory: Any, fake: FakeLLM) -> None:
    call = {"name": "get_logs", "arguments": {"product": "checkout", "time_range": "last 1h"}}
    looping = {"steps": [{"text": ["Looking."], "tool_calls": [{**call, "id": f"toolu_{i}"}]} for i in range(4)]}
    for model in (FAST, BALANCED, STRONG):  # steps are routed one by one: whichever answers, it loops
        fake.add(model, looping)
    h = _stack(harness_factory, fake)
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, COMPLEX, model="auto")
    assert turn.status == "failed" and turn.error["code"] == "looping_tool_calls"
    anomalies = [d["kind"] for t, d in _events(h, turn.id) if t == "anomaly"]
    assert anomalies == ["repeated_tool_call", "looping_tool_calls"]
    assert [d["action"] for t, d in _events(h, turn.id) if t == "recovery"] == ["continue", "escalate"]


def test_frugal_mode_keeps_the_powerful_tier_out(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(BALANCED, _answer("A balanced answer, frugally made for you."))
    h: Harness = harness_factory(llm={
        "providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
        "default_provider": "anthropic", "mode": "frugal", "default_model": "auto",
        "routing": {"candidates": [f"anthropic::{m}" for m in (BALANCED, STRONG)]}})
    turn = h.ask(h.tenant("acme"), COMPLEX)  # no model named: the default, auto
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == f"anthropic:{BALANCED}" and route["fallback"] is None


def test_a_deployment_can_name_its_own_strategy(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add(BALANCED, _answer("Chosen by the deployment's own strategy class."))
    h = _stack(harness_factory, fake, strategy=f"{__name__}:AlwaysBalanced")
    turn = h.ask(h.tenant("acme"), SIMPLE, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == f"anthropic:{BALANCED}" and route["reason"] == "house rule"


class AlwaysBalanced:
    def select(self, task: TaskSpec, candidates: list[RouteModel]) -> RoutingDecision:
        chosen = next(c for c in candidates if c.tier == "balanced")
        return RoutingDecision(chosen=chosen, fallback=None, reason="house rule", estimated_cost_usd=0.0)


def test_capabilities_are_a_vocabulary_with_aliases_and_suggestions(harness_factory: Any) -> None:
    assert canonical("Coding") == "code_generation" and canonical("writing") == "content_generation"
    with pytest.raises(InvalidInput, match="did you mean 'reasoning'"):
        canonical("reasonin")
    from kortex.config import Settings

    with pytest.raises(ValueError, match="unknown capability entry 1"):
        Settings(llm={"routing": {"required_capabilities": ["telepathy"]}})
    with pytest.raises(ValueError, match="provider::model"):
        Settings(llm={"routing": {"candidates": ["claude-opus-4-6"]}})


def test_required_capabilities_filter_and_the_strategy_is_pure() -> None:
    from kortex.llm.base import ModelInfo

    small = RouteModel("p", ModelInfo(id="s", tier="fast", input_usd_per_mtok=1, output_usd_per_mtok=1), "fast",
                       frozenset({"analysis"}))
    big = RouteModel("p", ModelInfo(id="b", tier="powerful", input_usd_per_mtok=10, output_usd_per_mtok=50),
                     "powerful", frozenset({"analysis", "vision"}))
    task = TaskSpec(complexity="simple", position="plan", input_tokens=1000,
                    required_capabilities=frozenset({"vision"}))
    decision = HeuristicRoutingStrategy().select(task, [small, big])
    assert decision.chosen is big and decision.fallback is None and decision.excluded == {"p::s": "lacks vision"}
    assert complexity_of("list the products") == "simple" and complexity_of("Why is it slow?") == "complex"


def test_auto_is_accepted_as_a_session_model(harness: Harness) -> None:
    session = chat.create_session(harness.k, harness.tenant("acme"), "routed", "auto")
    assert session.model == "auto"


def test_a_tenant_s_own_cost_ceiling_tightens_the_deployment_s(harness_factory: Any, fake: FakeLLM) -> None:
    from sqlalchemy import update

    from kortex.storage.schema import tenants

    fake.add(FAST, _answer("The small model answers within the tenant's ceiling."))
    h = _stack(harness_factory, fake)
    tenant = h.tenant("acme")
    with h.k.db.begin() as conn:  # the tenant's settings, as an operator sets its budget there
        conn.execute(update(tenants).where(tenants.c.id == tenant).values(
            settings={"routing": {"cost_ceiling_usd": 0.012}}))
    turn = h.ask(tenant, COMPLEX, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == f"anthropic:{FAST}" and "excluded by constraints" in route["reason"]


class SecondThoughts:
    """A model that answers nothing the first time it is asked a step and answers well the next:
    what a rollback is for."""

    name = "second"
    local = True
    synthetic = False

    def __init__(self) -> None:
        self.calls = 0

    def models(self) -> list[Any]:
        from kortex.llm.base import ModelInfo

        return [ModelInfo(id="thinker", tier="balanced")]

    async def stream(self, request: Any) -> Any:
        from kortex.llm.base import DoneChunk, TextChunk, TokenUsage

        self.calls += 1
        if self.calls > 1:
            yield TextChunk(text="On second thought: checkout is up, every check passed.")
        yield DoneChunk(stop_reason="end_turn", usage=TokenUsage(input_tokens=5, output_tokens=5), model="thinker")


def test_a_deployment_can_map_an_anomaly_to_rollback_and_the_step_reruns_from_its_parent_checkpoint(
        tmp_path: Any, sqlite_url: str) -> None:
    from kortex.container import Kortex
    from kortex.llm.base import Provider
    from kortex.turns.checkpoints import checkpoint_id
    from tests.conftest import make_settings

    class Thinker(SecondThoughts, Provider):
        pass

    model = Thinker()
    settings = make_settings(tmp_path, sqlite_url, llm={
        "default_provider": "second", "anomalies": {"scope": "all", "actions": {"empty_answer": "rollback"}}})
    h = Harness.__new__(Harness)
    h.settings, h.k = settings, Kortex.create(settings, providers={"second": lambda *a: model})
    try:
        tenant = h.tenant("acme")
        turn = h.ask(tenant, SIMPLE, model="second:thinker")
        events = _events(h, turn.id)
        recovery = next(d for t, d in events if t == "recovery")
        assert recovery["action"] == "rollback" and recovery["model"] == "second:thinker"  # the same model
        assert checkpoint_id(turn.id, None) in recovery["message"]  # step 0's parent: the turn's start
        assert model.calls == 2 and h.messages(tenant, turn.session_id)[-1].content.startswith("On second thought")
    finally:
        h.close()


def test_an_unknown_anomaly_kind_in_the_actions_is_refused() -> None:
    from kortex.config import Settings

    with pytest.raises(ValueError, match="unknown anomaly kind"):
        Settings(llm={"anomalies": {"actions": {"slow_vibes": "retry"}}})


def test_the_step_s_cost_estimate_counts_the_system_prompt_and_the_tool_schemas(harness_factory: Any,
                                                                              fake: FakeLLM) -> None:
    fake.add(FAST, _answer("Checkout is up and serving normally today."))
    h = _stack(harness_factory, fake)
    turn = h.ask(h.tenant("acme"), SIMPLE, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    body = fake.requests[0].body  # what a vendor bills as input: all of it, not only the question
    sent = sum(len(json.dumps(body.get(part, ""))) for part in ("system", "tools", "messages"))
    assert len(body["tools"]) > 10 and sent > 20_000
    billed = (sent // 4) * 1.0e-6 + 600 * 5.0e-6  # haiku's prices; the estimate's 600 output tokens
    assert route["estimated_cost_usd"] == pytest.approx(billed, rel=0.1)

    # A ceiling the question alone fits under, but not the step's real prompt: nothing is called.
    fake.requests.clear()
    h2 = _stack(harness_factory, fake, cost_ceiling_usd=0.004)
    refused = h2.ask(h2.tenant("acme"), SIMPLE, model="auto")
    assert refused.status == "failed" and refused.error["code"] == "no_route" and not fake.requests


MODERATE = "Summarise checkout's error rate over the last hour for me please"


def _with_ollama(harness_factory: Any, fake: FakeLLM, **routing: Any) -> Harness:
    fake.ollama_models = ["all-minilm:latest", "llama3.2", "nomic-embed-text:latest"]  # what was pulled there
    h: Harness = harness_factory(llm={
        "providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0),
                      "ollama": vendor_config("ollama", fake.url, max_retries=0)},  # model = "llama3.2"
        "default_provider": "anthropic", "routing": routing})
    asyncio.run(h.k.providers.probe())  # /api/tags, as GET /v1/llm/providers asks: the pulled models are listed
    return h


def test_routing_leaves_out_what_a_local_server_pulled_but_the_deployment_did_not_name(
        harness_factory: Any, fake: FakeLLM) -> None:
    fake.add("llama3.2", _answer("Local answer from llama about checkout errors."))
    h = _with_ollama(harness_factory, fake)
    turn = h.ask(h.tenant("acme"), MODERATE, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == "ollama:llama3.2" and turn.status == "done"
    with h.k.db.connect() as conn:
        row = next(r for r in audit.list_for_turn(conn, h.tenant("acme"), turn.id) if r["kind"] == "route")
    assert not any("embed" in key or "minilm" in key for key in row["payload"]["excluded"])
    assert {r.body.get("model") for r in fake.requests if r.body} == {"llama3.2"}


def test_a_routed_model_that_refuses_chat_hands_the_step_to_the_decision_s_fallback(
        harness_factory: Any, fake: FakeLLM) -> None:
    # Named on purpose (a deployment's mistake): the server says it is no chat model.
    fake.add("all-minilm:latest", {"steps": [{"faults": [
        {"status": 400, "message": "\"all-minilm\" does not support chat"}]}]})
    fake.add(BALANCED, _answer("Sonnet answer about checkout errors this hour."))
    h = _with_ollama(harness_factory, fake, candidates=["ollama::all-minilm:latest", f"anthropic::{BALANCED}"])
    turn = h.ask(h.tenant("acme"), MODERATE, model="auto")
    route = next(d for t, d in _events(h, turn.id) if t == "route")
    assert route["model"] == "ollama:all-minilm:latest" and route["fallback"] == f"anthropic:{BALANCED}"
    assert turn.status == "done" and h.messages(h.tenant("acme"), turn.session_id)[-1].content.startswith("Sonnet")
    failover = next(d for t, d in _events(h, turn.id) if t == "error")
    assert failover["code"] == "provider_failover" and failover["fatal"] is False


def test_a_request_s_tool_schemas_are_priced_once_per_prompt_and_tool_set(harness: Harness,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # A request holds its own copy of the registry's cached tuple of schemas (pydantic builds a
    # new one): pricing must still find what it worked out for the same schemas.
    from kortex.llm.base import CompletionRequest
    from kortex.turns import routed
    from kortex.turns.profiles import CHAT

    tools = CHAT.tool_schemas(harness.k)
    copy = CompletionRequest(system="s", tools=tools).tools
    assert copy is not tools and copy == tools
    encoded: list[int] = []
    real = routed.json.dumps
    monkeypatch.setattr(routed.json, "dumps", lambda value, **kw: encoded.append(1) or real(value, **kw))
    router = harness.k.router
    first = router.prompt_chars("s", tools)
    assert router.prompt_chars("s", copy) == first == len("s") + len(real([t.model_dump() for t in tools]))
    assert router.prompt_chars("other", copy) == first - 1 + len("other")
    assert len(encoded) == 2  # once for each prompt, not once for each call
