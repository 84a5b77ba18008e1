"""Budgets and rate limits, checked when a turn is asked for and again before every LLM call.

- daily USD per tenant: the cost of every LLM call audited since midnight UTC;
- tokens per session: every turn of the session, all its steps;
- turns per minute per tenant: a fixed window counted in Redis.

Limits come from ``[llm.budget]`` and may be narrowed per tenant in the tenant's settings
(``{"budget": {"daily_usd_limit": 5}}``): policy as data, never widened past the deployment's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

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


def check_spend(budget: BudgetSettings, current: Spent) -> None:
    """Raise BudgetExceeded when the tenant's day or the session is spent."""
    limits = Limits.of(budget, current.tenant_settings)
    if current.usd_today >= limits.daily_usd:
        raise BudgetExceeded(
            f"the tenant's daily LLM budget of ${limits.daily_usd:.2f} is spent "
            f"(${current.usd_today:.4f} today); it resets at midnight UTC", details={"limit": "daily_usd"})
    if current.session_tokens >= limits.session_tokens:
        raise BudgetExceeded(
            f"this session has used its {limits.session_tokens} tokens; start a new session",
            details={"limit": "session_tokens"})


def rate_refused(limit: int, now: float | None = None) -> RateLimited:
    """A turn past the tenant's ``turns_per_minute``: counted with the turn's admission, in the
    same round trip (kortex/turns/admission.py); a refused turn is not counted."""
    return RateLimited(f"at most {limit} turns a minute for this tenant; retry in a minute",
                       details={"limit": "turns_per_minute"}, retry_after=_window_left(now))


def _window_left(now: float | None = None) -> float:
    now = time.time() if now is None else now
    return 60 - now % 60


class Quota:
    """A per-tenant, per-minute fixed-window quota counted in Redis (``sessions``,
    ``ingest_items``, ...). ``take`` counts ``amount`` or refuses it whole, uncounted; ``give_back``
    returns a count whose work then failed. Redis trouble lets requests through: a quota is a
    guard, not a gate."""

    def __init__(self, redis: Redis, prefix: str, name: str, limit: int, what: str) -> None:
        self.redis, self.prefix, self.name, self.limit, self.what = redis, prefix, name, limit, what

    def take(self, tenant_id: str, amount: int = 1) -> int | None:
        """The window counted in (for ``give_back``), or None when Redis could not count."""
        window = int(time.time() // 60)
        key = quota_window(self.prefix, tenant_id, self.name, window)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.incrby(key, amount)
            pipe.expire(key, 120)
            count = int(pipe.execute()[0])
            if count > self.limit:
                self.redis.decrby(key, amount)
        except RedisError:
            return None
        if count > self.limit:
            raise RateLimited(f"at most {self.limit} {self.what} a minute for this tenant",
                              details={"limit": self.name}, retry_after=_window_left())
        return window

    def give_back(self, tenant_id: str, window: int | None, amount: int = 1) -> None:
        if window is None:
            return
        try:
            self.redis.decrby(quota_window(self.prefix, tenant_id, self.name, window), amount)
        except RedisError:
            pass


