"""When and how long to wait before calling a provider again: exponential backoff with jitter,
``Retry-After`` honoured, bounded in attempts, in any single wait and in total."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from kortex.config import ProviderSettings

#: statuses that mean "never, from this server": 501 (it does not implement what was asked) and
#: 505 (it refuses our HTTP version) answer the same request the same way however often it is
#: sent. Not retried, but still failed over (``router.can_fail_over``): another provider may
#: well implement it.
NEVER_HERE_STATUS = frozenset({501, 505})
#: statuses worth trying again: timeouts, conflicts, rate limits, and every other server error:
#: the standard ones, Anthropic's 529, and those no RFC names but proxies in front of vendors
#: send (Cloudflare's 520-524: origin unreachable, timed out, answered garbage)
RETRYABLE_STATUS = frozenset({408, 409, 429, *range(500, 600)}) - NEVER_HERE_STATUS


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 3
    base: float = 0.5
    cap: float = 8.0
    max_wait: float = 30.0  # a server asking for a longer pause is given up on (failover instead)
    budget: float = 60.0    # seconds of waiting, summed over the retries of one call

    @classmethod
    def of(cls, config: ProviderSettings) -> RetryPolicy:
        return cls(max_retries=config.max_retries, base=config.retry_base, cap=max(config.retry_base, 8.0),
                   max_wait=config.retry_max_wait, budget=config.retry_budget)

    def delay(self, retry: int, retry_after: float | None, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            # The server said when; a little jitter keeps many clients from returning at once.
            return max(0.0, retry_after) * (1.0 + 0.1 * rand())
        return min(self.cap, self.base * 2.0 ** retry) * (0.5 + 0.5 * rand())

    def next_wait(self, retry: int, retry_after: float | None, waited: float) -> float | None:
        """The wait before the next try, or None when the policy says stop."""
        if retry >= self.max_retries:
            return None
        if retry_after is not None and retry_after > self.max_wait:
            return None
        wait = self.delay(retry, retry_after)
        if waited + wait > self.budget:
            return None
        return wait


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds from ``retry-after-ms`` (OpenAI) or ``Retry-After`` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
