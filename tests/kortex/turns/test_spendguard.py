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
from kortex.storage import turns as turn_store
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


def test_a_cap_of_its_own_holds_calls_in_flight_apart_from_the_day(guard: SpendGuard) -> None:
    from kortex.turns.spendguard import SpendCap

    cap = SpendCap(scope="max_usd:job-1", limit=1.0, spent=0.2, what="the job's max_usd")
    first = guard.reserve_within(cap, 0.5)
    with pytest.raises(BudgetExceeded) as refused:  # 0.2 spent + 0.5 held + 0.5 > 1.0
        guard.reserve_within(cap, 0.5)
    assert refused.value.code == "budget" and "the job's max_usd ($1) cannot cover another call" in refused.value.message
    day = guard.reserve("t1", 0.5, limit=1.0, spent=0.0)  # the tenant's day is another scope
    both = day + first if day is not None and first is not None else None
    assert both is not None and len(both.holds) == 2
    guard.release(both)  # gives back every scope it held
    assert guard.reserve_within(cap, 0.5) is not None and guard.reserve("t1", 0.9, limit=1.0, spent=0.0)


def test_a_post_mortem_item_reserves_against_its_jobs_max_usd(harness) -> None:  # type: ignore[no-untyped-def]
    from kortex.postmortems import jobs
    from kortex.turns.profiles import profile_of

    tenant = harness.tenant("pm")
    harness.seed(tenant, "incident-archive")
    submitted = jobs.submit(harness.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"], max_usd=2.5), by="test")
    [item] = submitted.handoff.items
    turn_id = jobs.start_item(harness.k, tenant, item.item_id).steps[0].turn_id
    with harness.k.db.connect() as conn:
        turn = turn_store.get_turn(conn, tenant, turn_id)
        cap = profile_of(turn.profile).spend_cap(conn, turn)  # type: ignore[misc]
    assert cap is not None and (cap.limit, cap.spent, cap.code) == (2.5, 0.0, "budget")
    assert cap.scope == f"max_usd:{submitted.view.job.id}"
    uncapped = jobs.submit(harness.k, tenant, jobs.JobRequest(incident_ids=["INC-1110"]), by="test")
    other = jobs.start_item(harness.k, tenant, uncapped.handoff.items[0].item_id).steps[0].turn_id
    with harness.k.db.connect() as conn:
        assert jobs.spend_cap(conn, turn_store.get_turn(conn, tenant, other)) is None  # no max_usd: no cap


def test_an_item_whose_call_its_jobs_max_usd_cannot_cover_is_skipped_before_the_call(harness_factory) -> None:  # type: ignore[no-untyped-def]
    # $1 a token: the item's first call may cost thousands, past the job's $100 (the tenant's
    # day is left wide): refused before it is made, the item skipped for the job's budget.
    from kortex.postmortems import jobs
    from kortex.testing.inline import drive

    h = harness_factory(llm={"providers": {"scripted": {"prices": {"costly": {"input": 1_000_000, "output": 1_000_000}}}},
                             "budget": {"daily_usd_limit": 1_000_000}})
    tenant = h.tenant("pm")
    h.seed(tenant, "incident-archive")
    submitted = jobs.submit(h.k, tenant, jobs.JobRequest(incident_ids=["INC-1101"], model="scripted:costly",
                                                         max_usd=100), by="test")
    drive(h.k, submitted.handoff)
    [item] = jobs.list_items(h.k, tenant, submitted.view.job.id)
    assert item.status == "skipped" and item.error["code"] == "budget", item
    assert jobs.view(h.k, tenant, submitted.view.job.id).spend_usd == 0.0  # nothing was spent past it
