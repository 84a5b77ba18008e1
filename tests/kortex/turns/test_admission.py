"""How many chat turns a tenant runs at once: admitted atomically in Redis, given back by
every ending, and made to match the database by the watchdog."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from kortex.errors import RateLimited
from kortex.storage.schema import turns as turns_table
from kortex.stream.keys import active_turns, rate_window
from kortex.testing.inline import drive
from kortex.timeparse import utcnow
from kortex.turns import chat
from kortex.turns.admission import GRACE
from kortex.turns.cancel import cancel
from kortex.turns.watchdog import sweep
from tests.conftest import Harness


@pytest.fixture
def capped(harness_factory) -> Harness:  # type: ignore[no-untyped-def]
    return harness_factory(llm={"budget": {"max_concurrent_turns_per_tenant": 2, "turns_per_minute": 5}})


def _sessions(h: Harness, tenant: str, n: int, model: str = "scripted:slow_text") -> list[str]:
    return [chat.create_session(h.k, tenant, f"s{i}", model).id for i in range(n)]


def _rate_count(h: Harness, tenant: str) -> int:
    window = int(time.time() // 60)
    return int(h.k.redis.get(f"{h.settings.redis_prefix}:rate:{tenant}:{window}") or 0)


def test_the_cap_refuses_the_turn_past_it_without_using_up_the_rate(capped: Harness) -> None:
    h = capped
    tenant = h.tenant("acme")
    s = _sessions(h, tenant, 3)
    first = chat.post_message(h.k, tenant, s[0], "one", idempotency_key="a")
    chat.post_message(h.k, tenant, s[1], "two")
    assert _rate_count(h, tenant) == 2
    with pytest.raises(RateLimited) as refused:
        chat.post_message(h.k, tenant, s[2], "three")
    assert refused.value.details["limit"] == "max_concurrent_turns_per_tenant"
    assert _rate_count(h, tenant) == 2  # a refused request is not a turn
    # A replay of an admitted request is the same turn: no slot, no refusal.
    again = chat.post_message(h.k, tenant, s[0], "one", idempotency_key="a")
    assert again.turn.id == first.turn.id and not again.created
    assert len(h.k.slots.live(tenant)) == 2
    # Another tenant has slots of its own.
    other = h.tenant("other")
    chat.post_message(h.k, other, _sessions(h, other, 1)[0], "mine")


def test_the_slot_and_the_minutes_count_are_taken_together_or_not_at_all(harness: Harness) -> None:
    slots, prefix = harness.k.slots, harness.settings.redis_prefix
    if time.time() % 60 > 58:  # the minute's window is named by the clock: not across its turn
        time.sleep(2.5)
    window = int(time.time() // 60)
    count = rate_window(prefix, "acme", window)
    harness.k.redis.set(count, 2)
    with pytest.raises(RateLimited) as refused:
        slots.take("acme", "turn-1", cap=5, per_minute=2)
    assert refused.value.details == {"limit": "turns_per_minute"} and refused.value.retry_after
    assert slots.live("acme") == set() and int(harness.k.redis.get(count)) == 2  # neither taken
    admitted = slots.take("acme", "turn-2", cap=5, per_minute=3)
    assert admitted.live == 1 and admitted.window == window
    assert slots.live("acme") == {"turn-2"} and int(harness.k.redis.get(count)) == 3  # both
    with pytest.raises(RateLimited) as full:  # at the cap: not counted either
        slots.take("acme", "turn-3", cap=1, per_minute=10)
    assert full.value.details["limit"] == "max_concurrent_turns_per_tenant" and int(harness.k.redis.get(count)) == 3
    slots.refund("acme", window)
    assert int(harness.k.redis.get(count)) == 2 and harness.k.redis.ttl(count) > 0


def test_every_ending_gives_the_slot_back(capped: Harness) -> None:
    h = capped
    tenant = h.tenant("acme")
    s = _sessions(h, tenant, 4, model="scripted:text_only")
    a = chat.post_message(h.k, tenant, s[0], "one")
    b = chat.post_message(h.k, tenant, s[1], "two")
    cancel(h.k, tenant, a.turn.id, by="test")  # cancelled
    assert h.k.slots.live(tenant) == {b.turn.id}
    drive(h.k, b.handoff)  # done
    assert h.k.slots.live(tenant) == set()
    c = chat.post_message(h.k, tenant, s[2], "three")
    d = chat.post_message(h.k, tenant, s[3], "four")
    assert h.k.slots.live(tenant) == {c.turn.id, d.turn.id}
    # Expired by the watchdog: its deadline passed.
    with h.k.db.begin() as conn:
        conn.execute(update(turns_table).where(turns_table.c.id == c.turn.id)
                     .values(deadline_at=utcnow() - timedelta(seconds=1)))
    sweep(h.k)
    assert h.k.slots.live(tenant) == {d.turn.id}


def test_a_failed_post_gives_back_what_it_took(capped: Harness) -> None:
    h = capped
    tenant = h.tenant("acme")
    s = _sessions(h, tenant, 1)
    chat.post_message(h.k, tenant, s[0], "one")
    with pytest.raises(Exception) as busy:  # the session already has a turn running
        chat.post_message(h.k, tenant, s[0], "again")
    assert getattr(busy.value, "code", None) == "turn_in_progress"
    assert len(h.k.slots.live(tenant)) == 1 and _rate_count(h, tenant) == 1


def test_the_watchdog_frees_lost_slots_and_counts_lost_turns(capped: Harness) -> None:
    h = capped
    tenant = h.tenant("acme")
    s = _sessions(h, tenant, 2)
    live = chat.post_message(h.k, tenant, s[0], "one")
    key = active_turns(h.settings.redis_prefix, tenant)
    # A slot whose release was lost (its turn is over, or never was), admitted long ago ...
    h.k.redis.zadd(key, {"turn_gone": time.time() - GRACE - 5})
    # ... and one admitted a moment ago, whose turn may not be committed yet: left alone.
    h.k.redis.zadd(key, {"turn_being_posted": time.time()})
    # Redis lost the live turn's slot (a restart without AOF): counted again once it is settled.
    h.k.redis.zrem(key, live.turn.id)
    with h.k.db.begin() as conn:
        conn.execute(update(turns_table).where(turns_table.c.id == live.turn.id)
                     .values(created_at=utcnow() - timedelta(seconds=GRACE + 5)))
    sweep(h.k)
    assert h.k.slots.live(tenant) == {live.turn.id, "turn_being_posted"}
    with pytest.raises(RateLimited):  # both count
        chat.post_message(h.k, tenant, s[1], "two")


def test_a_slot_is_forgotten_once_no_turn_could_still_be_running(capped: Harness) -> None:
    h = capped
    tenant = h.tenant("acme")
    key = active_turns(h.settings.redis_prefix, tenant)
    old = time.time() - h.k.slots.lifetime - 1
    h.k.redis.zadd(key, {"ancient1": old, "ancient2": old})
    posted = chat.post_message(h.k, tenant, _sessions(h, tenant, 1)[0], "one")
    assert h.k.slots.live(tenant) == {posted.turn.id}


def test_a_tenant_past_its_busy_mark_has_its_steps_queued_behind_other_tenants(harness_factory) -> None:  # type: ignore[no-untyped-def]
    from kortex.turns.step import run_step
    from kortex.turns.toolrun import run_tool

    h = harness_factory(turn={"busy_tenant_turns": 2})
    flood, calm = h.tenant("flood"), h.tenant("calm")
    posted = [chat.post_message(h.k, flood, sid, "go") for sid in _sessions(h, flood, 3, "scripted:slow_tool")]
    assert [p.handoff.steps[0].busy for p in posted] == [False, False, True]  # the third is past the mark
    mine = chat.post_message(h.k, calm, _sessions(h, calm, 1, "scripted:slow_tool")[0], "go")
    assert not mine.handoff.steps[0].busy  # another tenant's count is its own

    def after_the_tool(tenant: str, turn_id: str) -> bool:
        (tool,) = run_step(h.k, tenant, turn_id, 0).tools
        (step,) = run_tool(h.k, tenant, tool.invocation_id, tool.tool, tool.hard_limit).steps
        return step.busy

    # The step after a tool call is marked by the tenant's live turns then, not at its post.
    assert after_the_tool(flood, posted[0].turn.id)
    assert not after_the_tool(calm, mine.turn.id)
    assert not h.k.slots.busy(flood, 0)  # 0: one priority for every tenant
