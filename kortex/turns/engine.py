"""The step engine of one process: LLM steps stream concurrently on its event loop, bounded,
taken fairly across tenants, with one batched lease renewal for all of them.

A step spends almost all its life waiting on the model. Holding a worker slot (a process or a
thread) for that wait caps a host at a handful of turns; here the Celery task only hands the
step over and returns, and the step waits on the loop, where a thousand waits cost nothing.

    Celery task ──submit──▶ waiting (per tenant, in this process) ──slot──▶ in flight (the loop)
                               │ touched: the watchdog sees a live holder     │ lease renewed, one
                               ▼                                              ▼ statement for all
                        lost with the process:                         lost with the process:
                        re-enqueued after requeue_after                lease lapses, run again

Blocking work (SQL, the closing writes, handing on to the queues) runs on the container's I/O
threads, never on the loop. Nothing here knows Celery: what a step hands on goes to the
``done`` callback it was submitted with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kortex.errors import KortexError, StorageError
from kortex.storage import turns
from kortex.storage.records import TurnRecord
from kortex.turns.governor import LagGovernor, TenantMix
from kortex.turns.handoff import Handoff, StepDispatch

if TYPE_CHECKING:
    from kortex.container import Kortex
    from kortex.turns.spendguard import Reservation

log = logging.getLogger(__name__)
T = TypeVar("T")

#: what a submitted step reports: what to hand on, or the exception that stopped it
StepOutcome = Handoff | BaseException
RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0)  # a step whose claim hit a database error is tried again
LAG_TICK = 0.025  # seconds between two samples of the loop's lag
MIX_EVERY = 10    # lag samples between two looks at the tenant mix (tenants gone quiet drop out)
#: how far back the governor looks at the most steps each tenant held (kortex/turns/governor.py)
TENANT_HORIZON = 60.0


class EngineBusy(KortexError):
    """The process holds as many waiting steps as it may (or its tenant's share of them): the
    caller gives the step back to its queue for a while instead of waiting in a worker slot."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="engine_busy")


class StepHold:
    """One running step's link to the engine: its lease, the I/O threads, and ``ended``, a
    future that resolves to the exception to stop the step with (lease lost, released)."""

    def __init__(self, engine: StepEngine, tenant_id: str) -> None:
        self._engine = engine
        self._tenant_id = tenant_id
        self.turn: TurnRecord | None = None
        self.ended: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        #: what the step holds of its tenant's day while its calls run (kortex/turns/spendguard.py)
        self.reservation: Reservation | None = None

    async def io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # In the step's context: its log records carry the turn's ids (kortex/logcontext.py).
        # Queued under the step's tenant: the I/O threads take tenants in turn, so another
        # tenant's burst of claims does not queue ahead of this step (kortex/fairthreads.py).
        context = contextvars.copy_context()
        return await asyncio.wrap_future(self._engine.k.io.submit_for(
            self._tenant_id, lambda: context.run(fn, *args, **kwargs)))

    def attach(self, turn: TurnRecord) -> None:
        """The step is claimed: its lease is renewed from now on."""
        self.turn = turn
        self._engine._holds[turn.id] = self

    def detach(self) -> None:
        if self.turn is not None and self._engine._holds.get(self.turn.id) is self:
            del self._engine._holds[self.turn.id]

    def lose(self) -> None:
        from kortex.turns.step import LeaseLost

        self._end(LeaseLost())

    def release(self) -> None:
        from kortex.turns.step import Released

        self._end(Released())

    def _end(self, exc: BaseException) -> None:
        if not self.ended.done():
            self.ended.set_result(exc)


@dataclass(eq=False)
class _Job:
    step: StepDispatch
    done: Callable[[StepOutcome], None]
    tries: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class StepEngine:
    """Create one per process (``Kortex.engine``); ``submit`` from any thread but the loop."""

    def __init__(self, k: Kortex) -> None:
        cfg = k.settings.turn
        self.k = k
        self.max_inflight = cfg.max_inflight_steps
        self.max_per_tenant = cfg.max_inflight_per_tenant or max(1, self.max_inflight * 3 // 4)
        self.max_waiting = cfg.max_waiting_steps
        # One tenant may fill at most this share of the waiting room, so another tenant's step
        # always finds a place to wait for its fair pick.
        self.max_waiting_per_tenant = max(1, self.max_waiting * 3 // 4)
        self.weights = dict(cfg.tenant_weights)
        # Below the hard bound, the loop's measured lag sets how many steps stream at once while
        # the tenants served are unequal (kortex/turns/governor.py).
        self.governor = (LagGovernor(self.max_inflight, cfg.loop_lag_target_ms / 1000, floor=cfg.min_inflight_steps)
                         if cfg.loop_lag_target_ms else None)
        self._mix = TenantMix(TENANT_HORIZON) if self.governor is not None else None
        self._contended = False              # a light tenant to protect from a heavy one (the mix is unequal)
        self._cv = threading.Condition()
        self._waiting: dict[str, deque[_Job]] = {}
        self._ring: deque[str] = deque()     # tenants with waiting steps, in turn order
        self._credit: dict[str, int] = {}    # picks left in a weighted tenant's turn
        self._n_waiting = 0
        self._busy: dict[str, int] = {}      # steps in flight per tenant
        self._inflight: set[_Job] = set()
        self._retrying: set[_Job] = set()    # waiting out a database error before trying again
        # Refused for room, kept here and offered again shortly (``defer``): touched like the
        # waiting ones, handed back with them at close. A countdown retry through Celery kept
        # them in the worker's timer instead, where the watchdog saw an untouched turn and an
        # empty queue (a duplicate every requeue_after) and a warm shutdown lost them.
        self._deferred: set[_Job] = set()
        self._reporting: set[asyncio.Future[None]] = set()
        self._holds: dict[str, StepHold] = {}
        # The lease renewal has a thread (and so a database connection) of its own: behind a
        # burst of step SQL on the shared I/O threads, leases would lapse under live steps.
        self._lease_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kortex-leases")
        # Handing on (publishing to the broker) must not wait behind step SQL either.
        self._handoff_threads = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="kortex-handoff")
        self._renewer: asyncio.Task[None] | None = None
        self._lag_watch: asyncio.Task[None] | None = None
        self._stop_watch: asyncio.Task[None] | None = None
        self._released: list[StepDispatch] = []  # given back by steps stopped at close()
        self._closing = False
        self._started = False

    # ---- any thread -------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return self._n_waiting

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    @property
    def limit(self) -> int:
        """How many steps may stream at once now: the governor's limit while the tenants served
        are unequal, otherwise the hard bound."""
        if self.governor is not None and self._contended:
            return self.governor.limit
        return self.max_inflight

    def submit(self, step: StepDispatch, done: Callable[[StepOutcome], None], *, block: bool = True) -> None:
        """Take ``step``; ``done`` gets what it hands on, on a hand-off thread, exactly once.

        The waiting room is bounded (``max_waiting_steps``, and ¾ of it per tenant): past it,
        ``block`` waits for room (tests, the inline driver) and otherwise ``EngineBusy`` is
        raised at once, so a worker slot is never held by a step that cannot start."""
        job = _Job(step, done)
        tenant = step.tenant_id
        with self._cv:
            while not self._closing and not self._has_room_locked(tenant):
                if not block:
                    raise EngineBusy(f"this process already holds {self._n_waiting} waiting steps")
                self._cv.wait(1.0)
            if self._closing:
                raise KortexError("the step engine is stopping", code="shutting_down")
            self._enqueue_locked(job)
            start, self._started = not self._started, True  # one lease renewer, however many threads submit
        loop = self.k.loop.loop
        if start:
            loop.call_soon_threadsafe(self._start)
        loop.call_soon_threadsafe(self._pump)

    def defer(self, step: StepDispatch, done: Callable[[StepOutcome], None], delay: float) -> None:
        """Keep a step ``submit`` had no room for, and offer it again every ``delay`` seconds
        until it finds room; ``done`` as for ``submit``. Raises ``EngineBusy`` when as many are
        deferred as may wait (``max_waiting_steps``): the caller gives it back to the queue."""
        job = _Job(step, done)
        with self._cv:
            if self._closing:
                raise KortexError("the step engine is stopping", code="shutting_down")
            if len(self._deferred) >= self.max_waiting:
                raise EngineBusy(f"this process already holds {len(self._deferred)} deferred steps")
            self._deferred.add(job)
            start, self._started = not self._started, True
        loop = self.k.loop.loop
        if start:
            loop.call_soon_threadsafe(self._start)
        loop.call_soon_threadsafe(loop.call_later, delay, self._offer, job, delay)

    def _offer(self, job: _Job, delay: float) -> None:
        with self._cv:
            if self._closing or job not in self._deferred:
                return  # close() took it
            if not self._has_room_locked(job.step.tenant_id):
                asyncio.get_running_loop().call_later(delay, self._offer, job, delay)
                return
            self._deferred.discard(job)
            self._enqueue_locked(job)
        self._pump()

    @property
    def deferred(self) -> int:
        return len(self._deferred)

    def _has_room_locked(self, tenant: str) -> bool:
        if self._n_waiting >= self.max_waiting:
            return False
        queue = self._waiting.get(tenant)
        return queue is None or len(queue) < self.max_waiting_per_tenant

    def run(self, step: StepDispatch, timeout: float | None = None) -> Handoff:
        """Submit and wait (tests, the inline driver, the CLI)."""
        future: concurrent.futures.Future[Handoff] = concurrent.futures.Future()

        def done(outcome: StepOutcome) -> None:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        self.submit(step, done)
        return future.result(timeout)

    def close(self, grace: float | None = None) -> list[StepDispatch]:
        """Stop taking steps; let those in flight finish for ``grace`` seconds, then give the
        rest back (their claims are released). Returns every step this process will not run,
        for the caller to hand back to the queue; their ``done`` callbacks hear
        ``shutting_down``, so nobody waits on them."""
        grace = self.k.settings.turn.shutdown_grace if grace is None else grace
        with self._cv:
            self._closing = True
            dropped = [job for q in self._waiting.values() for job in q] + list(self._retrying) + list(self._deferred)
            self._waiting.clear()
            self._ring.clear()
            self._retrying.clear()
            self._deferred.clear()
            self._n_waiting = 0
            self._cv.notify_all()
        for job in dropped:
            self._report(job, KortexError("the step engine stopped before the step started", code="shutting_down"))
        left = [job.step for job in dropped]
        if self._started and self.k.loop.started:
            try:
                left += self.k.loop.run(self._drain(grace), timeout=grace + 30)
            except Exception:  # stopping anyway; leases lapse and the watchdog hands them on
                log.warning("step engine did not drain", exc_info=True)
        self._lease_thread.shutdown(wait=False, cancel_futures=True)
        self._handoff_threads.shutdown(wait=False)  # _drain waited for them (10 s at most)
        return left

    # ---- the loop ---------------------------------------------------------------------------

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._renewer = loop.create_task(self._renew_forever(), name="kortex-leases")
        self._stop_watch = loop.create_task(self._watch_stops(), name="kortex-step-stops")
        if self.governor is not None:
            self._lag_watch = loop.create_task(self._watch_lag(self.governor), name="kortex-loop-lag")

    def _enqueue_locked(self, job: _Job) -> None:
        tenant = job.step.tenant_id
        queue = self._waiting.get(tenant)
        if queue is None:
            queue = self._waiting[tenant] = deque()
            self._ring.append(tenant)
        queue.append(job)
        self._n_waiting += 1
        if self._mix is not None:
            now = time.monotonic()
            if self._mix.held(tenant, len(queue) + self._busy.get(tenant, 0), now):
                self._contended = self._mix.unequal(now)  # at once: a flood is cut as it arrives

    def _next_locked(self, at_limit: bool = False) -> _Job | None:
        """Round robin over tenants with waiting steps, skipping those at their share (¾ of
        ``max_inflight_steps`` while another tenant has steps waiting: a tenant alone may use
        them all); a tenant of weight w is taken up to w times in a row. ``at_limit``: the loop holds all the steps
        the governor allows, and only a tenant below its fair share of that limit (the limit
        over the tenants holding or waiting for steps) is taken: a newcomer does not wait for
        a flood's steps to end."""
        fair = 0
        if at_limit:
            active = len(self._busy.keys() | self._waiting.keys())
            fair = max(1, self.limit // max(1, active))
        others = len(self._ring) > 1  # another tenant has steps waiting for a place
        for _ in range(len(self._ring)):
            tenant = self._ring[0]
            busy = self._busy.get(tenant, 0)
            if (others and busy >= self.max_per_tenant) or (at_limit and busy >= fair):
                self._ring.rotate(-1)
                continue
            queue = self._waiting[tenant]
            job = queue.popleft()
            self._n_waiting -= 1
            credit = self._credit.get(tenant, self.weights.get(tenant, 1)) - 1
            if not queue:
                del self._waiting[tenant]
                self._ring.popleft()
                self._credit.pop(tenant, None)
            elif credit <= 0:
                self._ring.rotate(-1)
                self._credit.pop(tenant, None)
            else:
                self._credit[tenant] = credit
            return job
        return None

    def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while len(self._inflight) < self.max_inflight:
            with self._cv:
                if self._closing:
                    return
                job = self._next_locked(at_limit=len(self._inflight) >= self.limit)
                if job is None:
                    return
                self._busy[job.step.tenant_id] = self._busy.get(job.step.tenant_id, 0) + 1
                self._cv.notify()
            self._inflight.add(job)
            job.task = loop.create_task(self._run(job))

    async def _run(self, job: _Job) -> None:
        from kortex.turns.step import step_async

        s = job.step
        hold = StepHold(self, s.tenant_id)
        outcome: StepOutcome
        try:
            outcome = await step_async(self.k, s.tenant_id, s.turn_id, s.step, hold, trace=s.trace)
        except StorageError as exc:
            # Before the claim the database did not answer: try again. After it, the lease
            # lapses and the watchdog runs the step again.
            with self._cv:  # close() takes the retrying steps under this lock
                again = hold.turn is None and job.tries < len(RETRIES) and not self._closing
                if again:
                    self._retrying.add(job)
            if again:
                delay = RETRIES[job.tries]
                job.tries += 1
                log.warning("step %s of turn %s could not start (%s); trying again in %.1fs",
                            s.step, s.turn_id, exc.code, delay)
                self._finished(job)
                asyncio.get_running_loop().call_later(delay, self._retry, job)
                return
            outcome = exc
        except asyncio.CancelledError:
            outcome = KortexError("the step engine stopped", code="shutting_down")
        except BaseException as exc:
            log.exception("step %s of turn %s broke the engine", s.step, s.turn_id)
            outcome = exc
        finally:
            hold.detach()  # whatever happened, this process stops renewing the step's lease
        self._finished(job)
        if self._closing and isinstance(outcome, Handoff) and outcome.steps and not outcome.tools:
            # Given back while stopping: the caller of close() re-enqueues it with the rest.
            self._released.extend(outcome.steps)
            outcome = KortexError("the step was given back to the queue", code="shutting_down")
        report = asyncio.get_running_loop().run_in_executor(self._handoff_threads, self._report, job, outcome)
        self._reporting.add(report)
        report.add_done_callback(self._reporting.discard)

    def _finished(self, job: _Job) -> None:
        self._inflight.discard(job)
        tenant = job.step.tenant_id
        busy = self._busy.get(tenant, 1) - 1
        if busy > 0:
            self._busy[tenant] = busy
        else:
            self._busy.pop(tenant, None)
        self._pump()

    def _retry(self, job: _Job) -> None:
        with self._cv:
            if self._closing or job not in self._retrying:
                return  # close() took it
            self._retrying.discard(job)
            self._enqueue_locked(job)
        self._pump()

    @staticmethod
    def _report(job: _Job, outcome: StepOutcome) -> None:
        try:
            job.done(outcome)
        except Exception:  # the step's state is committed; the watchdog re-enqueues what was lost
            log.exception("could not hand on what step %s of turn %s produced", job.step.step, job.step.turn_id)

    async def _watch_lag(self, governor: LagGovernor) -> None:
        """Sample how late the loop wakes; let waiting steps in when the governor allows more."""
        loop = asyncio.get_running_loop()
        ticks = 0
        while True:
            asked = loop.time()
            await asyncio.sleep(LAG_TICK)
            ticks += 1
            released = False
            if ticks % MIX_EVERY == 0 and self._mix is not None:
                with self._cv:
                    was, self._contended = self._contended, self._mix.unequal(time.monotonic())
                # The light tenant went quiet: the governor's limit no longer applies, and the
                # steps it held back start now, not when some step next ends (minutes, for a
                # long answer).
                released = was and not self._contended
            if governor.observe(loop.time() - asked - LAG_TICK, len(self._inflight), self._n_waiting,
                                contended=self._contended) or released:
                self._pump()

    async def _renew_forever(self) -> None:
        """Every third of a lease: renew the leases of every step in flight in one statement,
        stop those whose lease was taken, and mark the waiting ones as held."""
        lease = self.k.settings.turn.step_lease
        while True:
            await asyncio.sleep(lease / 3)
            holds = {h.turn.id: h for h in list(self._holds.values()) if h.turn is not None}
            held = [(t.id, t.tenant_id, t.attempt) for t in (h.turn for h in holds.values()) if t is not None]
            with self._cv:
                waiting = [job.step.turn_id for q in self._waiting.values() for job in q]
                waiting += [job.step.turn_id for job in self._deferred]
            if not held and not waiting:
                continue
            started = time.monotonic()
            try:
                kept = await asyncio.get_running_loop().run_in_executor(
                    self._lease_thread, self._renew, held, waiting, lease)
            except Exception:  # a database blip: the leases still run; the next tick tries again
                log.warning("could not renew %d step leases", len(held), exc_info=True)
                continue
            for turn_id, hold in holds.items():
                if turn_id not in kept:
                    hold.lose()
            took = time.monotonic() - started
            if took > lease / 3:
                log.warning("renewing %d leases took %.1fs", len(held), took)

    async def _watch_stops(self) -> None:
        """A step whose attempt was stopped (a cancel: ``EventStore.stop``) ends at once, as if
        its lease were lost, wherever it is: one whose model is silent writes nothing, so the
        fence would stop it only at the lease's next renewal (every 20 s), its vendor call open
        and its place in flight held until then."""
        async for turn_id, attempt in self.k.events.stops():
            hold = self._holds.get(turn_id)
            if hold is not None and hold.turn is not None and hold.turn.attempt <= attempt:
                hold.lose()

    def _renew(self, held: list[tuple[str, str, int]], waiting: list[str], lease: float) -> set[str]:
        kept: set[str] = set()
        with self.k.db.begin() as conn:
            for i in range(0, len(held), 500):
                kept |= turns.renew_leases(conn, held[i:i + 500], lease=lease)
            for i in range(0, len(waiting), 1000):
                turns.touch_queued(conn, waiting[i:i + 1000])
        return kept

    async def _drain(self, grace: float) -> list[StepDispatch]:
        tasks = {job.task for job in self._inflight if job.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        unfinished = [job for job in self._inflight if job.task is not None and not job.task.done()]
        for hold in list(self._holds.values()):
            hold.release()
        # A released step gives its claim back (running -> queued) before it ends; wait for that.
        pending = {job.task for job in unfinished if job.task is not None}
        if pending:
            await asyncio.wait(pending, timeout=10)
        stuck = {job.task for job in unfinished if job.task is not None and not job.task.done()}
        for task in stuck:
            task.cancel()
        if stuck:  # wait() does not raise what they raise, and a cancel of this drain still propagates
            await asyncio.wait(stuck, timeout=5)
        if self._reporting:  # what finished steps hand on reaches the broker before we stop
            await asyncio.wait(set(self._reporting), timeout=10)
        for background in (self._renewer, self._lag_watch, self._stop_watch):
            if background is not None:
                background.cancel()
        released, self._released = self._released, []
        return released
