"""The queue port: how the domain hands work to a transport and asks how much is waiting,
without knowing it is Celery (workers/dispatch.py) or anything else."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol

from kortex.turns.handoff import Handoff

if TYPE_CHECKING:
    from kortex.container import Kortex

#: the kinds of queued work the watchdog polices: chat steps, chat tool calls, and the batch
#: lane (batch turns' steps and tools, and batch items, on one queue)
Work = Literal["steps", "tools", "batch"]

#: a kind of batch work's own sweep, run by the watchdog each pass: (container, now, whether
#: the batch queue is empty) -> work to re-send. Registered by the module that owns the work
#: (kortex/postmortems/jobs.py), so the watchdog does not import it.
JobSweep = Callable[["Kortex", datetime, bool], Handoff]
JOB_SWEEPS: list[JobSweep] = []


class QueuePort(Protocol):
    def dispatch(self, handoff: Handoff) -> None:
        """Enqueue every step and tool call of ``handoff`` (after the transaction committed)."""

    def backlog(self, work: Work) -> int | None:
        """Messages of this kind waiting in the broker for a worker; None when it cannot tell."""


class Leadership(Protocol):
    """Held by one watchdog process of a deployment at a time."""

    def ensure(self) -> bool:
        """Take the lead if it is free, or confirm it is still ours; False: someone else leads.
        Raises when it could not ask (the database is unreachable)."""

    def release(self) -> None: ...


__all__ = ["JOB_SWEEPS", "JobSweep", "Leadership", "QueuePort", "Work"]
