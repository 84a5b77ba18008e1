"""Reservations of a tenant's day for LLM calls in flight, on a real Redis: calls together never
hold more than the limit leaves, a given-back or lapsed reservation frees its room, and a Redis
that cannot be reached refuses nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from redis import Redis

from kortex.errors import BudgetExceeded
from kortex.testing.scratch import throwaway_prefix
from kortex.turns.spendguard import SpendGuard

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def guard() -> Iterator[SpendGuard]:
    with throwaway_prefix(REDIS_URL, "kxspend") as prefix:
        redis = Redis.from_url(REDIS_URL)
        yield SpendGuard(redis, prefix, ttl=60)
        redis.close()


def test_calls_in_flight_together_hold_no_more_than_the_day_leaves(guard: SpendGuard) -> None:
    # $1 left of the day: ten calls of up to $0.30 each asked for at once, four do not fit
    def ask(_: int) -> bool:
        try:
            return guard.reserve("t1", 0.30, limit=5.0, spent=4.0) is not None
        except BudgetExceeded as exc:
            assert exc.details == {"limit": "daily_usd"} and "held by calls still running" in exc.message
            return False

    with ThreadPoolExecutor(10) as pool:
        granted = list(pool.map(ask, range(10)))
    assert granted.count(True) == 3


def test_a_reservation_given_back_frees_its_room_and_tenants_are_apart(guard: SpendGuard) -> None:
    first = guard.reserve("t1", 0.6, limit=1.0, spent=0.0)
    with pytest.raises(BudgetExceeded):
        guard.reserve("t1", 0.6, limit=1.0, spent=0.0)
    assert guard.reserve("t2", 0.6, limit=1.0, spent=0.0) is not None  # another tenant's day
    guard.release(first)
    assert guard.reserve("t1", 0.6, limit=1.0, spent=0.0) is not None


def test_what_is_billed_counts_beside_what_is_held(guard: SpendGuard) -> None:
    guard.reserve("t1", 0.3, limit=1.0, spent=0.5)
    with pytest.raises(BudgetExceeded):
        guard.reserve("t1", 0.3, limit=1.0, spent=0.5)  # 0.5 billed + 0.3 held + 0.3 > 1.0
    assert guard.reserve("t1", 0.2, limit=1.0, spent=0.5) is not None


def test_a_crashed_holders_reservation_lapses(guard: SpendGuard) -> None:
    short = SpendGuard(guard.redis, guard.prefix, ttl=1)
    short.reserve("t1", 0.9, limit=1.0, spent=0.0)  # never given back: its process died
    with pytest.raises(BudgetExceeded):
        short.reserve("t1", 0.9, limit=1.0, spent=0.0)
    time.sleep(1.2)
    assert short.reserve("t1", 0.9, limit=1.0, spent=0.0) is not None


def test_a_call_that_costs_nothing_holds_nothing(guard: SpendGuard) -> None:
    assert guard.reserve("t1", 0.0, limit=0.0, spent=0.0) is None


def test_redis_out_of_reach_refuses_nothing() -> None:
    gone = SpendGuard(Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2), "kxspend-gone", ttl=60)
    assert gone.reserve("t1", 0.5, limit=1.0, spent=0.9) is None  # the billed spend is still checked elsewhere
    gone.release(None)


def test_turns_started_together_stop_within_the_day_not_past_it_by_whole_calls(harness_factory, fake) -> None:  # type: ignore[no-untyped-def]
    """(From the bounds audit.) Each call checked the day's billed spend, and calls in flight were
    not counted: five turns started together, each $0.05, spent $0.25 against a $0.06 limit. Each
    step now holds the most its call may cost (gpt-4o: the prompt and 4096 tokens at $10 a
    million, ~$0.04) until it is billed, so a second call in flight finds no room."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    from tests.kortex.llm.conftest import vendor_config

    fake.add("gpt-4o", {"steps": [{"text": ["a", "b", "c"], "delay_ms": 150,
                                   "usage": {"input_tokens": 20_000, "output_tokens": 0}}]})
    h = harness_factory(llm={"providers": {"openai": vendor_config("openai", fake.url, max_retries=0)},
                             "budget": {"daily_usd_limit": 0.06}})
    tenant = h.tenant("usd")
    with Pool(5) as pool:
        turns = list(pool.map(lambda n: h.ask(tenant, f"question {n}", model="openai:gpt-4o"), range(5)))
    spent = sum(t.cost_usd for t in turns)
    assert spent <= 0.06 + 0.05 + 1e-9, f"${spent:.2f} spent against a daily limit of $0.06"
    refused = [t for t in turns if t.status == "failed"]
    assert refused and all(t.error["code"] == "budget_exceeded" for t in refused)
    assert all(t.cost_usd == 0 for t in refused)  # refused before their call, not after
    assert not h.k.redis.keys(f"{h.settings.redis_prefix}:spend:*:reserved") or not any(
        h.k.redis.hgetall(key) for key in h.k.redis.keys(f"{h.settings.redis_prefix}:spend:*:reserved"))
