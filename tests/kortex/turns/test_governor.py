"""The loop-lag governor: the limit falls to a share of what is in flight when the loop lags,
grows only while it is what holds steps back, and stays between its floor and the ceiling."""

from __future__ import annotations

from kortex.turns.governor import LagGovernor, TenantMix


def _feed(g: LagGovernor, lag: float, inflight: int, waiting: int, ticks: int | None = None) -> list[bool]:
    return [g.observe(lag, inflight, waiting) for _ in range(ticks or g.window)]


def test_it_starts_at_its_floor_and_grows_while_the_loop_keeps_up_and_steps_wait() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32)
    assert g.limit == 32
    rose = _feed(g, 0.001, inflight=32, waiting=500)
    assert rose[-1] and not any(rose[:-1])  # one adjustment per window, at its end
    assert g.limit == 40
    for _ in range(40):
        _feed(g, 0.001, inflight=g.limit, waiting=500)
    assert g.limit == 1000  # and no further


def test_a_limit_that_holds_nothing_back_does_not_grow() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32)
    _feed(g, 0.0, inflight=5, waiting=0)
    _feed(g, 0.0, inflight=32, waiting=0)  # at the limit, but nobody waits
    _feed(g, 0.0, inflight=10, waiting=7)  # steps wait, but for their tenant's share, not the limit
    assert g.limit == 32


def test_lag_over_the_target_cuts_the_limit_to_a_share_of_what_is_in_flight() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32, limit=600)
    assert not any(_feed(g, 0.2, inflight=400, waiting=100))
    assert g.limit == 300  # 3/4 of the 400 in flight, not of the old limit
    _feed(g, 0.2, inflight=300, waiting=100)
    _feed(g, 0.2, inflight=225, waiting=100)
    assert g.limit == 168
    for _ in range(20):
        _feed(g, 0.5, inflight=g.limit, waiting=100)
    assert g.limit == 32  # the floor: a starved host still makes progress


def test_lag_between_half_the_target_and_the_target_holds_the_limit() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32, limit=100)
    _feed(g, 0.015, inflight=100, waiting=50)
    assert g.limit == 100


def test_the_window_averages_so_one_late_wake_does_not_cut() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32, limit=100)
    for lag in [0.1] + [0.001] * (g.window - 1):  # a collection pause, then a quiet loop
        g.observe(lag, 100, 50)
    assert g.limit == 100  # mean 10.9 ms: held, neither cut nor grown


def test_bounds_follow_a_small_ceiling() -> None:
    g = LagGovernor(ceiling=4, target=0.02, floor=32)
    assert (g.floor, g.limit) == (4, 4)
    _feed(g, 0.0, inflight=4, waiting=9)
    assert g.limit == 4


def test_uncontended_the_limit_follows_what_is_in_flight_and_is_cut_from_there() -> None:
    g = LagGovernor(ceiling=1000, target=0.02, floor=32)
    assert not g.observe(0.3, inflight=500, waiting=0, contended=False)
    assert g.limit == 500  # one tenant: nothing held back, whatever the lag
    _feed(g, 0.3, inflight=500, waiting=40)  # a second tenant arrives: cut from what runs
    assert g.limit == 375


def test_the_mix_is_unequal_when_one_tenant_held_eight_times_the_steps_of_another() -> None:
    mix = TenantMix(horizon=60, ratio=8)
    looks = [mix.held("a", n, 0.0) for n in range(1, 10)]
    assert looks == [True, True, False, True, False, False, False, True, False]  # peaks 1, 2, 4, 8
    assert not mix.held("a", 3, 0.0)  # below its peak: nothing new
    assert not mix.unequal(0.0)  # one tenant: nobody to protect
    for _ in range(50):
        mix.held("b", 1, 1.0)  # many short turns, one at a time
    assert mix.unequal(1.0)  # 9 to 1
    mix.held("b", 2, 2.0)
    assert not mix.unequal(2.0)  # 9 to 2: alike enough


def test_the_mix_forgets_a_tenant_after_its_horizon() -> None:
    mix = TenantMix(horizon=60, ratio=8)
    mix.held("b", 1, 0.0)
    mix.held("a", 20, 1.0)
    assert mix.unequal(1.0)
    mix.held("a", 1, 31.0)  # a new bucket: b's peak is in the one before, still counted
    assert mix.unequal(31.0)
    mix.held("a", 1, 62.0)  # b's bucket is gone
    assert not mix.unequal(62.0)
    assert not mix.unequal(200.0)  # nothing for a whole horizon: both buckets empty
