"""Budgets and rate limits, checked when a turn is asked for and again before every LLM call.

- daily USD per tenant: the cost of every LLM call audited since midnight UTC;
- tokens per session: every turn of the session, all its steps;
- turns per minute per tenant: a fixed window counted in Redis.

Limits come from ``[llm.budget]`` and may be narrowed per tenant in the tenant's settings
(``{"budget": {"daily_usd_limit": 5}}``): policy as data, never widened past the deployment's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from redis import Redis
from redis.exceptions import RedisError

from kortex.config import BudgetSettings
from kortex.errors import BudgetExceeded, RateLimited
from kortex.storage.records import Spent
from kortex.stream.keys import quota_window


@dataclass(frozen=True, slots=True)
class Limits:
    daily_usd: float
    session_tokens: int
    turns_per_minute: int

    @classmethod
    def of(cls, budget: BudgetSettings, tenant_settings: dict[str, Any] | None) -> Limits:
        own = (tenant_settings or {}).get("budget") or {}

        def narrowed(key: str, default: float) -> Any:
            value = own.get(key)
            return default if not isinstance(value, int | float) or value < 0 else min(value, default)

        return cls(
            daily_usd=float(narrowed("daily_usd_limit", budget.daily_usd_limit)),
            session_tokens=int(narrowed("per_session_token_cap", budget.per_session_token_cap)),
            turns_per_minute=int(narrowed("turns_per_minute", budget.turns_per_minute)),
        )


def check_spend(budget: BudgetSettings, current: Spent, upcoming: int = 0) -> None:
    """Raise BudgetExceeded when the tenant's day or the session is spent. ``retry_after`` says
    when asking again can help: at midnight UTC for the day; never for the session (``inf``:
    the API sends no Retry-After), whose tokens are never given back.

    ``upcoming``: what the LLM call about to be made may add to the session (its estimated
    prompt and its max_tokens, kortex/turns/context.py): a call that would pass the session's
    cap is refused before it is made: a session passes its cap by the estimate's error at most,
    not by a whole prompt."""
    limits = Limits.of(budget, current.tenant_settings)
    if current.usd_today >= limits.daily_usd:
        raise BudgetExceeded(
            f"the tenant's daily LLM budget of ${limits.daily_usd:.2f} is spent "
            f"(${current.usd_today:.4f} today); it resets at midnight UTC", details={"limit": "daily_usd"},
            retry_after=until_midnight_utc())
    if current.session_tokens >= limits.session_tokens:
        raise BudgetExceeded(
            f"this session has used its {limits.session_tokens} tokens; start a new session",
            details={"limit": "session_tokens"}, retry_after=math.inf)
    if current.session_tokens + upcoming > limits.session_tokens:
        raise BudgetExceeded(
            f"this session has used {current.session_tokens} of its {limits.session_tokens} tokens and the next "
            f"model call may take ~{upcoming} more (its prompt and answer); start a new session",
            details={"limit": "session_tokens"}, retry_after=math.inf)


def until_midnight_utc(now: datetime | None = None) -> float:
    """Seconds until the next UTC day, when a spent daily budget starts again."""
    now = now or datetime.now(UTC)
    midnight = (now.astimezone(UTC) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now).total_seconds()


def rate_refused(limit: int, now: float | None = None) -> RateLimited:
    """A turn past the tenant's ``turns_per_minute``: counted with the turn's admission, in the
    same round trip (kortex/turns/admission.py); a refused turn is not counted."""
    return RateLimited(f"at most {limit} turns a minute for this tenant; retry in a minute",
                       details={"limit": "turns_per_minute"}, retry_after=_window_left(now))


def _window_left(now: float | None = None) -> float:
    now = time.time() if now is None else now
    return 60 - now % 60


# KEYS: windows to count in; ARGV: per key its amount and limit, then the keys' ttl. Counts
# every amount, or none when any would pass its limit (returns that key's 1-based index): a
# refused take is never in a count, not even for an instant, so it cannot crowd out a
# concurrent one that fits. (Adding, then taking back in a second command refused 1,574 of
# 2,000 one-item takes racing batches that could never fit.)
_TAKE = """
for i, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  if count + tonumber(ARGV[2 * i - 1]) > tonumber(ARGV[2 * i]) then
    return i
  end
end
for i, key in ipairs(KEYS) do
  redis.call('INCRBY', key, ARGV[2 * i - 1])
  redis.call('EXPIRE', key, ARGV[#ARGV])
end
return 0
"""
#: seconds a minute's count outlives its minute
_WINDOW_TTL = 120


class Quota:
    """A per-tenant, per-minute fixed-window quota counted in Redis (``sessions``,
    ``ingest_items``, ...). ``take`` counts ``amount`` or refuses it whole, uncounted; ``give_back``
    returns a count whose work then failed. Redis trouble lets requests through: a quota is a
    guard, not a gate."""

    def __init__(self, redis: Redis, prefix: str, name: str, limit: int, what: str) -> None:
        self.redis, self.prefix, self.name, self.limit, self.what = redis, prefix, name, limit, what

    def take(self, tenant_id: str, amount: int = 1) -> int | None:
        """The window counted in (for ``give_back``), or None when Redis could not count."""
        return take_together(tenant_id, (self, amount))

    def refused(self) -> RateLimited:
        return RateLimited(f"at most {self.limit} {self.what} a minute for this tenant",
                           details={"limit": self.name}, retry_after=_window_left())

    def give_back(self, tenant_id: str, window: int | None, amount: int = 1) -> None:
        if window is None:
            return
        try:
            self.redis.decrby(quota_window(self.prefix, tenant_id, self.name, window), amount)
        except RedisError:
            pass

    @contextmanager
    def counting(self, tenant_id: str) -> Iterator[None]:
        """Count one (RateLimited past the limit), given back if the block fails: what was not
        made costs no quota."""
        window = self.take(tenant_id)
        try:
            yield
        except BaseException:
            self.give_back(tenant_id, window)
            raise


def take_together(tenant_id: str, *wanted: tuple[Quota, int]) -> int | None:
    """Count each ``(quota, amount)`` in this minute, all or none, in one round trip (the quotas
    share one Redis): raise the first refusing quota's ``RateLimited``, with nothing counted.
    The window counted in, or None when Redis could not count (then nothing is refused)."""
    window = int(time.time() // 60)
    redis = wanted[0][0].redis
    keys = [quota_window(q.prefix, tenant_id, q.name, window) for q, _ in wanted]
    args: list[int] = [n for q, amount in wanted for n in (amount, q.limit)]
    try:
        refused = int(cast(int, redis.register_script(_TAKE)(keys=keys, args=[*args, _WINDOW_TTL])))
    except RedisError:
        return None
    if refused:
        raise wanted[refused - 1][0].refused()
    return window
