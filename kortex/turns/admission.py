"""At most ``max_concurrent_turns_per_tenant`` chat turns of a tenant at once, admitted
atomically in Redis, together with its ``turns_per_minute``.

Each tenant has a sorted set of its live chat turns (member: the turn's id; score: when it
was admitted). Admitting is one Lua script: forget members older than any turn can live,
count, then, if there is room, count the turn in this minute's window and add it, or refuse
it past the minute's limit with nothing counted. One round trip where the slot and the rate
were two: in a burst of posts each trip from the API's thread waits for the GIL again (3-4 ms
apiece, measured under 1,000 posts at once). Nothing waits on anything else: before this, the
count was read under the tenant's row lock, held across the POST's round trips to
PostgreSQL, so one tenant's posts queued on each other (1,000 posts at once took 33 s to
answer, and the API's database connections were held by posts waiting for the lock, so
streams could not open either).

A turn's slot is given back by ``announce`` (kortex/turns/closing.py), the one place every
ending passes, just after the transaction that ends the turn has committed (a slot is never
held long past the turn's end). The watchdog makes each set match
the database (``reconcile``), for the members older than ``GRACE``: a slot whose release
was lost (Redis down at that moment, a killed process) is freed, a running turn Redis lost
(a restart without AOF) is counted again. Until then, and at worst, a lost slot stays taken
until the turn's deadline has passed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import cast

from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy.engine import Connection

from kortex.budget import rate_refused
from kortex.errors import RateLimited, StorageError
from kortex.storage import sweeps
from kortex.stream.keys import active_turns, rate_window

log = logging.getLogger(__name__)

#: how long after its admission a slot is left alone by ``reconcile``: its turn's row may not
#: be committed yet (the POST admits, then inserts)
GRACE = 30.0

# KEYS[1] the tenant's set, KEYS[2] its count of turns this minute; ARGV: now, turn id,
# forget-before, cap, key ttl, turns a minute (-1: not counted), the count's ttl.
# Returns {1, live} when admitted (or already in: counted then), {0, live} when full, {2, n}
# past the minute's n: a refused turn is neither in the set nor counted.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return {1, redis.call('ZCARD', KEYS[1])}
end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[4]) then
  return {0, n}
end
if tonumber(ARGV[6]) >= 0 then
  local count = redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ARGV[7])
  if count > tonumber(ARGV[6]) then
    redis.call('DECR', KEYS[2])
    return {2, count - 1}
  end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {1, n + 1}
"""
#: seconds a minute's count outlives its minute
_WINDOW_TTL = 120


def past_busy_mark(live: int, above: int) -> bool:
    """A tenant with ``live`` turns is busy: more than ``above`` (``turn.busy_tenant_turns``;
    0: never). Its next steps then queue behind other tenants' (``StepDispatch.busy``)."""
    return 0 < above < live


@dataclass(frozen=True, slots=True)
class Admitted:
    """A turn let in: the tenant's live turns now, this one included, and the minute it was
    counted in (None when no rate was counted), which ``refund`` takes back."""

    live: int
    window: int | None


class TurnSlots:
    """The per-tenant count of live chat turns. ``lifetime`` bounds how long a slot can stay
    taken whatever happens (a turn's deadline plus the watchdog's lag)."""

    def __init__(self, redis: Redis, prefix: str, lifetime: float) -> None:
        self.redis, self.prefix, self.lifetime = redis, prefix, lifetime
        self._take = redis.register_script(_TAKE)

    def take(self, tenant_id: str, turn_id: str, cap: int, per_minute: int | None = None) -> Admitted:
        """Count ``turn_id`` among the tenant's live turns and, given ``per_minute``, in this
        minute's turns; raise ``RateLimited`` when ``cap`` are live or ``per_minute`` were
        counted this minute (then nothing is counted). Redis down is ``StorageError``: a cap
        is a gate, not a guard."""
        now = time.time()
        window = int(now // 60)
        try:
            status, n = self._take(
                keys=[active_turns(self.prefix, tenant_id), rate_window(self.prefix, tenant_id, window)],
                args=[now, turn_id, now - self.lifetime, cap, int(self.lifetime) + 60,
                      -1 if per_minute is None else per_minute, _WINDOW_TTL])
        except RedisError as exc:
            raise StorageError("the turn admission store is unavailable") from exc
        if int(status) == 0:
            raise RateLimited(f"at most {cap} turns may run at once for this tenant",
                              details={"limit": "max_concurrent_turns_per_tenant", "live": int(n)})
        if int(status) == 2:
            raise rate_refused(int(cast(int, per_minute)), now)
        return Admitted(live=int(n), window=None if per_minute is None else window)

    def refund(self, tenant_id: str, window: int) -> None:
        """Take back the minute's count of a turn admitted, then not created. Redis trouble
        leaves it counted: the window ends within the minute."""
        key = rate_window(self.prefix, tenant_id, window)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.decr(key)
            pipe.expire(key, _WINDOW_TTL)  # a window that expired meanwhile is not made again for good
            pipe.execute()
        except RedisError:
            log.warning("could not take back a count of tenant %s's turns this minute", tenant_id)

    def busy(self, tenant_id: str, above: int) -> bool:
        """``past_busy_mark`` for the tenant's live turns now. Redis trouble says no: the step
        is queued as any other, never held back."""
        if above <= 0:
            return False  # no need to ask
        try:
            return past_busy_mark(int(cast(int, self.redis.zcard(active_turns(self.prefix, tenant_id)))), above)
        except RedisError:
            return False

    def give_back(self, tenant_id: str, turn_id: str) -> None:
        """The turn is over (or was never created). Redis trouble is logged: ``reconcile`` frees
        the slot later."""
        try:
            self.redis.zrem(active_turns(self.prefix, tenant_id), turn_id)
        except RedisError:
            log.warning("could not free the admission slot of turn %s; the watchdog will", turn_id)

    def live(self, tenant_id: str) -> set[str]:
        return set(cast(list[str], self.redis.zrange(active_turns(self.prefix, tenant_id), 0, -1)))

    def reconcile(self, conn: Connection) -> tuple[int, int]:
        """Make each tenant's set match its live chat turns in the database, for members and
        turns older than ``GRACE``; returns (slots freed, turns counted again)."""
        now = time.time()
        settled_before = now - GRACE
        live_db = {tenant: {t: at.timestamp() for t, at in turns_of.items()}
                   for tenant, turns_of in sweeps.live_chat_turns(conn).items()}
        tenants = set(live_db) | self._tenants_with_sets()
        freed = recounted = 0
        for tenant in tenants:
            key = active_turns(self.prefix, tenant)
            held = dict(cast(list[tuple[str, float]], self.redis.zrange(key, 0, -1, withscores=True)))
            in_db = live_db.get(tenant, {})
            stale = [m for m, admitted in held.items() if m not in in_db and admitted < settled_before]
            missing = {t: at for t, at in in_db.items() if t not in held and at < settled_before}
            if stale:
                freed += cast(int, self.redis.zrem(key, *stale))
            if missing:
                recounted += cast(int, self.redis.zadd(key, missing, nx=True))
                self.redis.expire(key, int(self.lifetime) + 60)
        return freed, recounted

    def _tenants_with_sets(self) -> set[str]:
        head = active_turns(self.prefix, "")
        return {key[len(head):] for key in self.redis.scan_iter(match=f"{head}*", count=500)}


__all__ = ["GRACE", "Admitted", "TurnSlots"]
