"""Budgets and rate limits: refused before the turn, and before every LLM call within it."""

from __future__ import annotations

import json

import pytest

from kortex.errors import BudgetExceeded, RateLimited
from kortex.storage.schema import tenant_spend, tenants
from kortex.storage.schema import turns as turns_table
from kortex.timeparse import utcnow
from kortex.turns import chat

PRICED = {"providers": {"scripted": {"prices": {"costly": {"input": 1_000_000, "output": 1_000_000}}}}}


def test_a_call_the_day_cannot_cover_is_not_made(harness_factory) -> None:
    # $1 a token: what the first call may cost (its prompt and max_tokens) is far past a $1000
    # day, so it is refused before it is made (kortex/turns/spendguard.py), not billed past it.
    h = harness_factory(llm={**PRICED, "budget": {"daily_usd_limit": 1000}})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "go", model="scripted:costly")
    assert turn.status == "failed" and turn.error["code"] == "budget_exceeded"
    assert turn.cost_usd == 0.0
    errors = [json.loads(e.data) for e in h.events(turn.id) if e.type == "error"]
    assert "daily LLM budget of $1000.00 cannot cover another call" in errors[0]["message"]
    other = h.tenant("other")  # another tenant's day is its own
    assert h.ask(other, "hi", model="scripted:text_only").status == "done"


def test_a_spent_day_refuses_new_turns(harness_factory) -> None:
    h = harness_factory(llm={"budget": {"daily_usd_limit": 1000}})
    tenant = h.tenant("acme")
    with h.k.db.begin() as conn:  # the day's calls were billed $1000.50
        conn.execute(tenant_spend.insert().values(tenant_id=tenant, day=utcnow().date(), cost_usd=1000.5))
    with pytest.raises(BudgetExceeded) as refused:
        h.ask(tenant, "again", model="scripted:text_only")
    assert "daily LLM budget" in refused.value.message


def test_a_call_that_would_pass_the_session_cap_is_not_made(harness_factory) -> None:
    # What the call may add (its prompt, estimated, and max_tokens) counts before it is made: the
    # session never passes its cap by a whole call (kortex/turns/context.py).
    h = harness_factory(llm={"budget": {"per_session_token_cap": 1000}})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:costly")
    turn = h.ask(tenant, "go", session_id=session.id)
    assert turn.status == "failed" and turn.error["code"] == "budget_exceeded"
    assert (turn.input_tokens, turn.output_tokens) == (0, 0)  # refused before the call, not after it


def test_a_session_past_its_token_cap_takes_no_more_turns(harness_factory) -> None:
    h = harness_factory(llm={"budget": {"per_session_token_cap": 100_000}})
    tenant = h.tenant("acme")
    session = chat.create_session(h.k, tenant, "s", "scripted:text_only")
    turn = h.ask(tenant, "go", session_id=session.id)
    assert turn.status == "done"
    with h.k.db.begin() as conn:  # the session has spent its tokens (a long conversation, say)
        conn.execute(turns_table.update().where(turns_table.c.id == turn.id).values(input_tokens=100_001))
    with pytest.raises(BudgetExceeded):
        chat.post_message(h.k, tenant, session.id, "more")
    fresh = chat.create_session(h.k, tenant, "s2", "scripted:text_only")
    assert h.ask(tenant, "hello", session_id=fresh.id).status == "done"


def test_a_tenant_can_be_held_to_a_lower_budget_never_a_higher_one(harness_factory) -> None:
    h = harness_factory(llm={**PRICED, "budget": {"daily_usd_limit": 5000}})
    tenant = h.tenant("acme")
    with h.k.db.begin() as conn:
        conn.execute(tenants.update().where(tenants.c.id == tenant)
                     .values(settings={"budget": {"daily_usd_limit": 100, "per_session_token_cap": 10**9}}))
    turn = h.ask(tenant, "go", model="scripted:costly")
    assert turn.status == "failed" and turn.error["code"] == "budget_exceeded"
    data = [json.loads(e.data) for e in h.events(turn.id) if e.type == "error"]
    assert "$100.00" in data[0]["message"]


def test_turns_per_minute_are_limited_per_tenant(harness_factory) -> None:
    h = harness_factory(llm={"budget": {"turns_per_minute": 2}})
    tenant = h.tenant("acme")
    for i in range(2):
        assert h.ask(tenant, f"q{i}", model="scripted:text_only").status == "done"
    with pytest.raises(RateLimited) as limited:
        h.ask(tenant, "q3", model="scripted:text_only")
    assert not isinstance(limited.value, BudgetExceeded)
    assert h.ask(h.tenant("other"), "q", model="scripted:text_only").status == "done"


def test_the_day_of_spend_matches_the_audit_trail(harness_factory) -> None:
    from sqlalchemy import func, select

    from kortex.storage.schema import decisions, tenant_spend

    h = harness_factory(llm={**PRICED, "budget": {"daily_usd_limit": 10**9}})
    tenant = h.tenant("acme")
    for i in range(2):
        h.ask(tenant, f"go {i}", model="scripted:costly")
    with h.k.db.connect() as conn:
        audited = conn.scalar(select(func.sum(decisions.c.cost_usd))
                              .where(decisions.c.tenant_id == tenant, decisions.c.kind == "llm_call"))
        day = conn.execute(select(tenant_spend).where(tenant_spend.c.tenant_id == tenant)).one()
    assert day.cost_usd == pytest.approx(audited) == pytest.approx(2 * (1200 + 1050))
    assert day.llm_calls == 4


def test_quotas_count_all_or_nothing_in_the_embedded_store() -> None:
    from kortex.budget import Quota, take_together
    from kortex.stream.embedded import embedded_redis

    redis = embedded_redis()
    requests = Quota(redis, "budget-test", "ingest_requests", 2, "ingest requests")
    items = Quota(redis, "budget-test", "ingest_items", 3, "ingested items")
    with pytest.raises(RateLimited) as refused:
        take_together("acme", (requests, 1), (items, 4))  # past the items: neither counted
    assert refused.value.details == {"limit": "ingest_items"} and refused.value.retry_after
    take_together("acme", (requests, 1), (items, 2))
    take_together("acme", (requests, 1), (items, 1))
    with pytest.raises(RateLimited) as refused:
        take_together("acme", (requests, 1), (items, 0))
    assert refused.value.details == {"limit": "ingest_requests"}
    window = items.take("other", 3)  # per tenant
    items.give_back("other", window, 3)
    assert items.take("other", 3) == window
