"""The composition root: builds every domain object of one process from its settings.

One ``Kortex`` per process. Its database pool and Redis client are thread-safe; provider HTTP
clients belong to its streaming loop. Workers, the API and the CLI each build one and pass it
down.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis import BlockingConnectionPool, Redis
from redis.asyncio import BlockingConnectionPool as AsyncBlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis

from kortex.aio import LoopThread
from kortex.config import Settings
from kortex.fairthreads import FairThreadPool
from kortex.llm.providers import BUILTIN_PROVIDERS
from kortex.llm.registry import ProviderFactory, ProviderRegistry
from kortex.proposals import ActionExecutor, ProposalService
from kortex.storage.db import Database
from kortex.storage.invocations import TurnCalls
from kortex.stream.store import EventStore
from kortex.telemetry.factory import build_sources
from kortex.telemetry.sources import TelemetrySources
from kortex.tools.builtin import BUILTIN_TOOLS
from kortex.tools.cursor import CursorCodec, derive_key
from kortex.tools.pipeline import ToolPipeline
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry
from kortex.tools.spec import ToolSpec
from kortex.turns.routed import Router

if TYPE_CHECKING:
    from kortex.turns.admission import TurnSlots
    from kortex.turns.engine import StepEngine
    from kortex.turns.handoff import StepDispatch
    from kortex.turns.spendguard import SpendGuard

log = logging.getLogger(__name__)

#: tools that ship enabled although they are not read-only (they only record, never act)
DEFAULT_ENABLED_EXTRA: tuple[str, ...] = ("propose_action",)


#: seconds a Redis command may wait for its reply (a blocking read waits its block time on top)
REDIS_READ_TIMEOUT = 10.0
REDIS_CONNECT_TIMEOUT = 5.0


def redis_factory(settings: Settings) -> Callable[[], AsyncRedis]:
    """Makes single-connection asyncio clients (one per blocking reader, e.g. the SSE hub)."""
    if settings.embedded:
        from kortex.stream.embedded import embedded_async_redis

        return embedded_async_redis
    url = settings.redis_url or ""
    name = f"{settings.redis_prefix}:hub"  # visible in CLIENT LIST
    # The socket timeout is well above the hub's XREAD block time (5 s), which an idle read
    # legitimately waits out; it only fires when Redis stops answering (a paused or cut-off
    # server), and the hub reconnects instead of waiting forever.
    return lambda: AsyncRedis.from_url(url, decode_responses=True, single_connection_client=True,
                                       client_name=name, socket_timeout=REDIS_READ_TIMEOUT * 3,
                                       socket_connect_timeout=REDIS_CONNECT_TIMEOUT, socket_keepalive=True)


def _stream_redis(settings: Settings) -> Callable[[], AsyncRedis]:
    """Makes the asyncio client the step engine publishes with (made on its loop, on first use).
    A blocking pool: past its size a write waits for a connection instead of failing."""
    if settings.embedded:
        from kortex.stream.embedded import embedded_async_redis

        return embedded_async_redis
    url = settings.redis_url or ""

    def make() -> AsyncRedis:
        # Timeouts bound a write to a Redis that stopped answering: the publisher retries, and
        # a step never hangs on it past the retries.
        pool = AsyncBlockingConnectionPool.from_url(
            url, decode_responses=True, max_connections=settings.pools.redis_max_connections, timeout=20,
            health_check_interval=30, socket_timeout=REDIS_READ_TIMEOUT,
            socket_connect_timeout=REDIS_CONNECT_TIMEOUT, socket_keepalive=True)
        return AsyncRedis(connection_pool=pool)

    return make


def _shared_redis(settings: Settings) -> Redis:
    if settings.embedded:
        from kortex.stream.embedded import embedded_redis

        return embedded_redis()
    pools = settings.pools
    # A blocking pool: a burst past the cap waits for a connection (up to the timeout) instead
    # of raising "Too many connections" into a request or a step.
    pool = BlockingConnectionPool.from_url(settings.redis_url or "", decode_responses=True,
                                           max_connections=pools.redis_max_connections,
                                           timeout=pools.redis_pool_timeout, health_check_interval=30,
                                           socket_timeout=REDIS_READ_TIMEOUT,
                                           socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
                                           socket_keepalive=True, retry_on_timeout=True)
    return Redis(connection_pool=pool)


def cursor_key(settings: Settings) -> bytes:
    """The key that signs paging cursors. Every process of a deployment must share it."""
    if settings.secret_key:
        return derive_key(settings.secret_key.get_secret_value(), "")
    if settings.embedded:
        # One machine: keep a random key next to the database, readable by its owner only.
        path = settings.home / "secret.key"
        if not path.exists():
            settings.home.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f".secret.key.{os.getpid()}")
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32))
            try:
                os.link(staged, path)  # atomic, and the first process to get there wins
            except FileExistsError:
                pass
            finally:
                staged.unlink()
        return derive_key(path.read_text().strip(), "")
    log.warning("KORTEX_SECRET_KEY is not set: cursors are signed with a key derived from the "
                "database URL; set a secret in production")
    return derive_key(None, settings.effective_database_url)


def tool_specs(settings: Settings) -> list[ToolSpec]:
    specs = list(BUILTIN_TOOLS)
    if settings.testing.enable_test_tools:
        from kortex.testing.tools import TEST_TOOLS

        specs.extend(TEST_TOOLS)
    return specs


@dataclass
class Kortex:
    settings: Settings
    db: Database
    redis: Redis
    events: EventStore
    providers: ProviderRegistry
    tools: ToolRegistry
    policy: ToolPolicy
    pipeline: ToolPipeline
    sources: TelemetrySources
    cursors: CursorCodec
    proposals: ProposalService
    #: what tools receive besides their sources (ToolContext.services)
    services: dict[str, object] = field(default_factory=dict)
    #: where LLM responses are streamed (asyncio); started on first use
    loop: LoopThread = field(default_factory=lambda: LoopThread("kortex-stream"))
    #: threads for the blocking work of steps (SQL, hand-offs), so the loop never waits on it;
    #: taken tenant by tenant (kortex/fairthreads.py)
    io: FairThreadPool = field(default_factory=lambda: FairThreadPool(16, name="kortex-io"))
    _engine: StepEngine | None = field(default=None, repr=False)
    _router: Router | None = field(default=None, repr=False)
    _slots: TurnSlots | None = field(default=None, repr=False)
    _spend: SpendGuard | None = field(default=None, repr=False)
    _engine_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def engine(self) -> StepEngine:
        """This process's step engine (kortex/turns/engine.py), made on first use."""
        with self._engine_lock:
            if self._engine is None:
                from kortex.turns.engine import StepEngine

                self._engine = StepEngine(self)
            return self._engine

    @property
    def router(self) -> Router:
        """``model: "auto"``: the configured strategy (loaded on first use, so a deployment that
        never routes never imports one) and the per-tenant latency figures."""
        if self._router is None:
            self._router = Router(self.settings)
        return self._router

    @property
    def slots(self) -> TurnSlots:
        """The per-tenant count of live chat turns (kortex/turns/admission.py)."""
        if self._slots is None:
            from kortex.turns.admission import TurnSlots

            # A slot outlives no turn: a turn past its deadline is failed by the watchdog.
            self._slots = TurnSlots(self.redis, self.settings.redis_prefix, self.settings.turn.deadline + 120)
        return self._slots

    @property
    def spend(self) -> SpendGuard:
        """Reservations of the tenants' days for LLM calls in flight (kortex/turns/spendguard.py)."""
        if self._spend is None:
            from kortex.turns.spendguard import SpendGuard

            turn = self.settings.turn
            # A reservation outlives its step: a crashed holder's lapses once the step's time
            # limit, and the lease that hands it on, are past.
            self._spend = SpendGuard(self.redis, self.settings.redis_prefix,
                                     ttl=turn.step_time_limit + turn.step_lease + 60)
        return self._spend

    def close_engine(self, grace: float | None = None) -> list[StepDispatch]:
        """Stop the step engine; returns the steps it will not run (to hand back to a queue)."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        return engine.close(grace) if engine is not None else []

    @classmethod
    def create(
        cls,
        settings: Settings,
        *,
        providers: dict[str, ProviderFactory] | None = None,
        extra_tools: list[ToolSpec] | None = None,
        db_pool_size: int | None = None,
        executor: ActionExecutor | None = None,
    ) -> Kortex:
        pools = settings.pools
        if db_pool_size is None:  # the budget from settings (README "Sizing")
            db = Database(settings.effective_database_url, pool_size=pools.db_pool_size,
                          max_overflow=pools.db_max_overflow)
        else:
            db = Database(settings.effective_database_url, pool_size=db_pool_size)
        redis = _shared_redis(settings)
        turn = settings.turn
        events = EventStore(redis, prefix=settings.redis_prefix, maxlen=turn.stream_maxlen,
                            active_ttl=int(turn.deadline + 600), done_ttl=int(turn.stream_ttl),
                            async_redis=_stream_redis(settings))
        registry = ToolRegistry([*tool_specs(settings), *(extra_tools or [])])
        policy = ToolPolicy.build(settings.tools.allowed, registry, default_extra=DEFAULT_ENABLED_EXTRA)
        unknown = sorted(policy.allowed - {s.name for s in registry})
        if settings.tools.allowed is not None and unknown:
            log.warning("tools.allowed names tools that do not exist: %s", ", ".join(unknown))
        for setting in settings.llm.unenforced():
            log.warning("%s is accepted but not enforced yet", setting)
        timeouts = {name: o.timeout for name, o in settings.llm.tools.items() if o.timeout is not None}
        for name, seconds in sorted(timeouts.items()):
            spec = registry.get(name)
            if spec is None:
                log.warning("[llm.tools.%s] configures a tool that does not exist; ignored", name)
            elif seconds > spec.limits.max_timeout:
                log.warning("[llm.tools.%s] timeout %.0fs is above its category's ceiling; %.0fs applies",
                            name, seconds, spec.limits.max_timeout)
        pipeline = ToolPipeline(registry, policy, result_cap_bytes=settings.tools.result_cap_bytes,
                                timeouts=timeouts, progress_after=settings.tools.progress_after_s)
        cursors = CursorCodec(cursor_key(settings))
        proposals = ProposalService(db, executor)
        # Tool queries run on their own small pool whose statements stop at the longest tool
        # timeout: a call the pipeline abandoned must not keep a query (and a connection) busy.
        longest = max((pipeline.timeout_for(spec) for spec in registry), default=30.0)
        telemetry_db = Database(settings.effective_database_url,
                                pool_size=pools.telemetry_pool_size if db_pool_size is None else max(4, db_pool_size // 2),
                                max_overflow=pools.telemetry_max_overflow if db_pool_size is None else None,
                                statement_timeout=longest + 1)
        return cls(
            settings=settings, db=db, redis=redis, events=events,
            providers=ProviderRegistry(settings, providers or BUILTIN_PROVIDERS),
            tools=registry, policy=policy, pipeline=pipeline, sources=build_sources(settings, telemetry_db), cursors=cursors,
            proposals=proposals, services={"cursors": cursors, "proposals": proposals, "calls": TurnCalls(db)},
            # As many I/O threads as the pool has connections, but one: a thread never waits
            # for a connection, and the step engine's lease renewal always finds one.
            io=FairThreadPool(max(1, db.max_connections - 1), name="kortex-io"),
        )

    async def aclose(self) -> None:
        """Release what belongs to the streaming loop (provider HTTP clients, the stream client)."""
        try:
            await self.providers.aclose()
        finally:
            await self.events.aclose()

    def close(self) -> None:
        """Release everything; call once, from a thread that is not the streaming loop. Steps
        the engine still held are left to the watchdog: call ``close_engine`` first to hand
        them back at once."""
        lost = self.close_engine()
        if lost:
            log.warning("%d steps were left to the watchdog at shutdown", len(lost))
        if self.loop.started:
            try:
                self.loop.run(self.aclose(), timeout=10)
            finally:
                self.loop.stop()
        self.io.shutdown(wait=False, cancel_futures=True)
        self.pipeline.close()
        self.sources.close()
        try:
            self.redis.close()
        finally:
            self.db.dispose()
