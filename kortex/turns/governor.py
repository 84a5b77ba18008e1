"""How many steps one engine's event loop may stream at once: as many as keep it answering
on time, found by measuring the loop rather than fixed in advance.

``max_inflight_steps`` is sized for a model that mostly waits. When streams deliver faster
than one process can parse and forward them, the loop falls behind, and every step on it
waits that lag at each of its hops: a tenant's first event crosses the loop about four times,
so 200 ms of lag under another tenant's flood made it seconds late. The governor samples the
lag (how late a short sleep wakes up) and moves a limit the way a congestion window moves:
down to a share of what is in flight when the lag stays over its target, up while it stays
well under and the limit is what holds steps back. Steps over the limit wait in the engine's
waiting room, where the fair pick across tenants decides who goes next, and a tenant below
its fair share of the limit is taken even at the limit (kortex/turns/engine.py): the flood
waits, not the newcomer.

It only holds steps back while the tenants served are unequal: over the last minute one held
at least ``ratio`` times as many steps at once as another (``TenantMix``), so there is a light
tenant to protect from a heavy one. Among equals, holding steps back only delays them all: the
lag comes mostly from the other threads and processes sharing the cores (the loop itself was
busy 10-57% of the time while lagging 10-45 ms), and the limit it held cost throughput it did
not buy back. 1,000 paced turns of one tenant took 1.96x the floor's time under an always-on
governor and 1.52x without it; dealt over ten alike tenants, 2.05x under a governor acting
whenever two tenants were served and 1.27x without it. When the
tenants are not unequal the limit follows what is in flight, so a flood that arrives is cut
from there.

The target is how much headroom a light tenant is kept: the lag it measures is mostly the
cores being full, so a low target holds the heavy tenant to what leaves some of them free.
Measured with ``./dev bench --only fairness`` (tenant A floods 500 paced turns, B sends a trivial
turn every 0.25 s; B's first event p50 idle 13-27 ms; 2 cores):

    target   B's first event during the flood   A's 500 turns done after   cores busy
    20 ms    176-240 ms                         22-35 s                    ~95%
    10 ms    121-129 ms                         26-34 s                    not measured
     5 ms    77-87 ms                           35-45 s                    75-95%
     2 ms    30-50 ms                           46-54 s                    60-70%

A flood of 100 paced turns: 12-13 s at 2 ms, 10 s at 20 ms (B within 1.3-1.6x idle at both).

On a slower 2-core machine (B idle 16-18 ms), once a step's CPU was cut by a seventh, 2 ms let
the heavy tenant take what was saved: its flood finished in 54-62 s instead of 62-64, and B's
first event during it rose from 33-34 ms to 39-51 ms. At 1 ms: B 26-33 ms, the flood 72 s.
1 ms is the default: the flood is the load that waits, and an operator whose heavy tenant must
go faster raises it.

Pure arithmetic, no clock and no loop of its own: the engine feeds it one sample per tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LagGovernor:
    ceiling: int                  # the engine's hard bound (max_inflight_steps)
    target: float                 # seconds of loop lag the limit is held under
    floor: int = 32               # never below this: a busy host still makes progress
    window: int = 10              # samples averaged per adjustment
    decrease: float = 0.75        # over target: the limit becomes this share of what is in flight
    increase: float = 1.25        # well under target while the limit binds: it grows by this factor
    limit: int = 0                # 0: start at the floor (slow start)
    _samples: list[float] = field(default_factory=list, repr=False)
    _binding: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.floor = max(1, min(self.floor, self.ceiling))
        self.limit = min(self.ceiling, max(self.floor, self.limit or self.floor))

    def observe(self, lag: float, inflight: int, waiting: int, contended: bool = True) -> bool:
        """One tick's lag (seconds late) with what the engine held then; True when the limit
        rose (the caller starts waiting steps)."""
        if not contended:
            self._samples, self._binding = [], False
            self.limit = min(self.ceiling, max(self.floor, inflight))
            return False
        self._samples.append(max(0.0, lag))
        # The limit only grows when it is what holds steps back: a quiet process keeps a small
        # limit, so a burst ramps up under measurement instead of arriving all at once.
        self._binding = self._binding or (waiting > 0 and inflight >= self.limit)
        if len(self._samples) < self.window:
            return False
        mean = sum(self._samples) / len(self._samples)
        binding, self._samples, self._binding = self._binding, [], False
        if mean > self.target:
            self.limit = max(self.floor, min(self.limit, int(inflight * self.decrease)))
            return False
        if mean < self.target / 2 and binding and self.limit < self.ceiling:
            self.limit = min(self.ceiling, max(self.limit + 1, int(self.limit * self.increase)))
            return True
        return False


@dataclass
class TenantMix:
    """The most steps each tenant held in the engine at once (running and waiting) over about
    the last ``horizon`` seconds (two half-horizon buckets), and whether the tenants are
    unequal: the heaviest held at least ``ratio`` times as many as the lightest. Peaks, not
    counts of steps started: a light tenant sending many short turns one after another still
    holds one or two at a time, while a flood holds hundreds."""

    horizon: float = 60.0
    ratio: int = 8
    _now: dict[str, int] = field(default_factory=dict, repr=False)
    _before: dict[str, int] = field(default_factory=dict, repr=False)
    _since: float | None = field(default=None, repr=False)

    def held(self, tenant: str, steps: int, now: float) -> bool:
        """``tenant`` holds ``steps`` now (it just added one); True when the mix may have
        changed enough to look again (its peak reached 1, 2, 4, 8 ...: a few looks a tenant)."""
        self._roll(now)
        if steps <= self._now.get(tenant, 0):
            return False
        self._now[tenant] = steps
        return steps & (steps - 1) == 0

    def unequal(self, now: float) -> bool:
        self._roll(now)
        peaks = dict(self._before)
        for tenant, steps in self._now.items():
            peaks[tenant] = max(steps, peaks.get(tenant, 0))
        return len(peaks) > 1 and max(peaks.values()) >= self.ratio * min(peaks.values())

    def _roll(self, now: float) -> None:
        if self._since is None:
            self._since = now
        elif now - self._since >= self.horizon / 2:
            self._before = self._now if now - self._since < self.horizon else {}
            self._now, self._since = {}, now
