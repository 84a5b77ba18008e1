"""The day's USD limit held against LLM calls still running, not only against calls billed.

``check_spend`` (kortex/budget.py) compares the limit with the day's audited spend, which counts
a call once it is billed, after it ends. Every turn (and post-mortem item) of a tenant in flight
at once passed that check on the same figure, so together they could pass the limit by as many
whole calls: five turns started together spent $0.25 against a $0.06 limit (the bounds audit),
and at the default concurrency (20 chat turns, 16 batch items) the overshoot could be hundreds
of dollars on a $50 limit.

So before a step's call, the most that call may cost (its prompt, estimated, at the input price
and ``max_tokens`` at the output price, for the dearest model the step may use) is reserved in
Redis beside the tenant's day; a call that the billed spend plus the reservations of calls in
flight leave no room for is refused as the day's spent budget is. The reservation is given back
once the step has billed what it spent. One a crashed process leaves behind lapses after the
step's time limit (the watchdog bills such a call itself, ``worker_lost``).

A step's calls (fallbacks, a frugal model and then its full one, retries) run one after another,
so one reservation covers them all. The day can still be passed by the estimate's error, not by
whole calls.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from redis import Redis
from redis.exceptions import RedisError

from kortex.budget import until_midnight_utc
from kortex.errors import BudgetExceeded

log = logging.getLogger(__name__)

# KEYS: the tenant's reservations for the day (hash: id -> "usd expires_at").
# ARGV: id, usd, room (the limit less the billed spend), now, ttl (seconds).
# Lapsed reservations are dropped; returns "ok" once reserved, else the USD reserved by others.
_RESERVE = """
local now = tonumber(ARGV[4])
local held = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local usd, expires = string.match(all[i + 1], '^(%S+) (%S+)$')
  if usd == nil or tonumber(expires) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    held = held + tonumber(usd)
  end
end
if held + tonumber(ARGV[2]) > tonumber(ARGV[3]) then
  return tostring(held)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. tostring(now + tonumber(ARGV[5])))
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[5])) + 86400)
return 'ok'
"""


def reservations_key(prefix: str, tenant_id: str, day: str) -> str:
    return f"{prefix}:spend:{tenant_id}:{day}:reserved"


def cap_key(prefix: str, scope: str) -> str:
    """Reservations against a cap of a kind of work's own (a post-mortem job's ``max_usd``)."""
    return f"{prefix}:spend:cap:{scope}:reserved"


@dataclass(frozen=True, slots=True)
class SpendCap:
    """A cap of a kind of work's own beside the tenant's day (a post-mortem job's ``max_usd``):
    its steps reserve against it too. ``what`` names it in a refusal; ``code`` is the refusal's."""

    scope: str
    limit: float
    spent: float
    what: str
    code: str = "budget"


@dataclass(frozen=True, slots=True)
class Reservation:
    holds: tuple[tuple[str, str], ...]  # (key, id) of each scope held
    usd: float

    def __add__(self, other: Reservation) -> Reservation:
        return Reservation(self.holds + other.holds, max(self.usd, other.usd))


class SpendGuard:
    """Reservations of USD for LLM calls in flight, per tenant and UTC day, in Redis."""

    def __init__(self, redis: Redis, prefix: str, *, ttl: float) -> None:
        self.redis = redis
        self.prefix = prefix
        self.ttl = max(1.0, ttl)  # a step's time limit and some: a crashed holder's lapses then
        self._reserve = redis.register_script(_RESERVE)

    def reserve(self, tenant_id: str, usd: float, *, limit: float, spent: float) -> Reservation | None:
        """Hold ``usd`` of the tenant's day for a call about to be made, or raise BudgetExceeded
        when the day's ``limit``, less what is ``spent`` (billed) and what calls in flight hold,
        cannot cover it. None when nothing needs holding (a call that costs nothing). A Redis
        that cannot be reached holds nothing and refuses nothing: the billed spend is still
        checked (``check_spend``), as before there were reservations."""
        if usd <= 0:
            return None
        key = reservations_key(self.prefix, tenant_id, datetime.now(UTC).strftime("%Y-%m-%d"))
        held = self._hold(key, usd, limit - spent, f"tenant {tenant_id}'s day")
        if held is None or isinstance(held, Reservation):
            return held
        raise BudgetExceeded(
            f"the tenant's daily LLM budget of ${limit:.2f} cannot cover another call: ${spent:.4f} is spent "
            f"today and ${held:.4f} is held by calls still running (this one may cost up to ${usd:.4f}); "
            "try again once they end, or after midnight UTC",
            details={"limit": "daily_usd"}, retry_after=min(until_midnight_utc(), 60.0))

    def reserve_within(self, cap: SpendCap, usd: float) -> Reservation | None:
        """``reserve`` against ``cap`` (a job's own budget) instead of the tenant's day: refused
        with ``cap.code`` when what it has spent and what its calls in flight hold leave no room."""
        if usd <= 0:
            return None
        held = self._hold(cap_key(self.prefix, cap.scope), usd, cap.limit - cap.spent, cap.what)
        if held is None or isinstance(held, Reservation):
            return held
        raise BudgetExceeded(
            f"{cap.what} (${cap.limit:g}) cannot cover another call: ${cap.spent:.4f} is spent and ${held:.4f} is "
            f"held by calls still running (this one may cost up to ${usd:.4f})", code=cap.code,
            details={"limit": cap.scope.partition(":")[0]})

    def _hold(self, key: str, usd: float, room: float, whose: str) -> Reservation | float | None:
        """The reservation, or what others hold when ``usd`` does not fit ``room``; None when
        Redis could not be asked (nothing is refused then)."""
        rid = uuid.uuid4().hex
        try:
            answer = self._reserve(keys=[key], args=[rid, f"{usd:.6f}", f"{room:.6f}", f"{time.time():.3f}",
                                                     f"{self.ttl:.0f}"])
        except RedisError:
            log.warning("could not reserve $%.4f of %s; the call goes ahead", usd, whose, exc_info=True)
            return None
        text = answer.decode() if isinstance(answer, bytes) else str(answer)
        return Reservation(((key, rid),), usd) if text == "ok" else float(text)

    def release(self, reservation: Reservation | None) -> None:
        """Give a reservation back (its call is billed, or was never made). A failure only leaves
        it to lapse."""
        if reservation is None:
            return
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for key, rid in reservation.holds:
                    pipe.hdel(key, rid)
                pipe.execute()
        except RedisError:
            log.warning("could not give back a reservation of $%.4f; it lapses in %.0f s", reservation.usd,
                        self.ttl, exc_info=True)


__all__ = ["Reservation", "SpendCap", "SpendGuard", "cap_key", "reservations_key"]
