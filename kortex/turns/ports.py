"""The queue port: how the domain hands work to a transport and asks how much is waiting,
without knowing it is Celery (workers/dispatch.py) or anything else."""

from __future__ import annotations

from typing import Literal, Protocol

from kortex.turns.handoff import Handoff

#: the two kinds of queued work the watchdog polices
Work = Literal["steps", "tools"]


class QueuePort(Protocol):
    def dispatch(self, handoff: Handoff) -> None:
        """Enqueue every step and tool call of ``handoff`` (after the transaction committed)."""

    def backlog(self, work: Work) -> int | None:
        """Messages of this kind waiting in the broker for a worker; None when it cannot tell."""


class Leadership(Protocol):
    """Held by one watchdog process of a deployment at a time."""

    def ensure(self) -> bool:
        """Take the lead if it is free, or confirm it is still ours; False: someone else leads."""

    def release(self) -> None: ...


__all__ = ["Leadership", "QueuePort", "Work"]
