"""The planner: walk a playbook (probes as data) against what the turn already gathered.

A probe names the tool it calls (the first one available of several), the probes it needs
first, and how it builds its arguments from the question and the results of those needs.
Every round re-reads the history from scratch: a probe whose call already happened is
``done`` (or ``pending``), one whose builder declines or whose tools are all unavailable is
``skipped``, one whose needs are unsettled is ``blocked``; the rest are called now. Builders
see only the results of the probes they need, so re-reading gives the same arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kortex.llm.offline.question import Intent
from kortex.messages import ToolCall, ToolResult


@dataclass(frozen=True, slots=True)
class Evidence:
    """One probe's call and its result."""

    call: ToolCall
    result: ToolResult

    @property
    def ok(self) -> bool:
        return not self.result.is_error and isinstance(self.result.content, dict)

    @property
    def content(self) -> dict[str, Any]:
        return self.result.content if self.ok else {}


@dataclass
class View:
    """What the planner knows: results by probe key, in playbook order."""

    by_key: dict[str, Evidence] = field(default_factory=dict)

    def get(self, key: str) -> Evidence | None:
        return self.by_key.get(key)

    def content(self, key: str) -> dict[str, Any]:
        found = self.by_key.get(key)
        return found.content if found else {}

    def cite(self, key: str) -> str:
        found = self.by_key.get(key)
        return f"[{found.call.id}]" if found else ""


Builder = Callable[[Intent, View], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class Probe:
    key: str
    tools: tuple[str, ...]
    build: Builder
    needs: tuple[str, ...] = ()


def _signature(name: str, arguments: dict[str, Any]) -> str:
    return name + json.dumps(arguments, sort_keys=True, default=str)


@dataclass
class PlanState:
    calls: list[ToolCall]              # every call made in this turn so far
    results: dict[str, ToolResult]     # by call id


def walk(probes: Sequence[Probe], intent: Intent, state: PlanState,
         available: set[str]) -> tuple[list[ToolCall], View]:
    """The calls to make now (empty: time to answer) and the evidence gathered so far."""
    made = {_signature(c.name, c.arguments): c for c in state.calls}
    status: dict[str, str] = {}
    view = View()
    ready: list[ToolCall] = []
    seen: set[str] = set()
    for probe in probes:
        if any(status.get(n) in ("pending", "blocked", "ready") for n in probe.needs):
            status[probe.key] = "blocked"
            continue
        tool = next((t for t in probe.tools if t in available), None)
        args = probe.build(intent, view) if tool else None
        if tool is None or args is None:
            status[probe.key] = "skipped"
            continue
        signature = _signature(tool, args)
        call = made.get(signature)
        if call is not None:
            result = state.results.get(call.id)
            status[probe.key] = "done" if result is not None else "pending"
            if result is not None:
                view.by_key[probe.key] = Evidence(call, result)
            continue
        status[probe.key] = "ready"
        if signature not in seen:
            seen.add(signature)
            ready.append(ToolCall(id="", name=tool, arguments=args))
    return ready, view
