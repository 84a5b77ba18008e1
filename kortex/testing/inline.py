"""Run a turn's hand-offs in-process, without a broker: for unit tests and the no-queue baseline.

Tool calls of one step run concurrently on threads, as they would on several workers."""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

from kortex.container import Kortex
from kortex.postmortems.jobs import start_item
from kortex.turns.handoff import Handoff
from kortex.turns.step import run_step
from kortex.turns.toolrun import run_tool


def drive(k: Kortex, handoff: Handoff, *, max_handoffs: int = 1000) -> int:
    """Carry out ``handoff`` and everything it leads to; returns how many tasks ran."""
    pending: deque[Handoff] = deque([handoff])
    ran = 0
    with ThreadPoolExecutor(8, thread_name_prefix="inline-tool") as pool:
        while pending:
            current = pending.popleft()
            if current.tools:
                futures = [pool.submit(run_tool, k, t.tenant_id, t.invocation_id, t.tool, t.hard_limit, t.trace)
                           for t in current.tools]
                pending.extend(f.result() for f in futures)
                ran += len(current.tools)
            for step in current.steps:
                pending.append(run_step(k, step.tenant_id, step.turn_id, step.step, step.trace))
                ran += 1
            for item in current.items:  # a batch job's item: its task creates the item's turn
                pending.append(start_item(k, item.tenant_id, item.item_id))
                ran += 1
            if ran > max_handoffs:
                raise RuntimeError("runaway turn: too many hand-offs")
    return ran
