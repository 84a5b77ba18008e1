"""The checks run on each step (a detection policy with thresholds in ``[llm.anomalies]``) and
what recovery does about each kind (policy as data).

Detection is pure: the step hands in what happened and gets back ``Anomaly`` records. The step
carries out the recommended action (kortex/turns/step.py): ``continue`` records it; ``retry``
runs the model again (at most once per step and three times per turn), announced, so text the
client already has is never repeated silently; ``fallback`` hands the step to the routing
decision's fallback model (a slow first token, before any text); ``rollback`` reruns the step
from its parent checkpoint (the boundary before it) on the same model, its tools offered again,
replacing what the step produced (its tool calls too); ``escalate`` ends the turn with a clear
error. A deployment maps a kind to another action in ``[llm.anomalies] actions``, among those
the kind can take (``ACTIONS``); by default no kind recommends ``rollback``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kortex.config import AnomalySettings
from kortex.messages import AssistantMessage, Message, ToolCall, UserMessage

Severity = Literal["low", "medium", "high", "critical"]
Action = Literal["continue", "retry", "fallback", "rollback", "escalate"]

#: kind -> (severity, recommended action)
POLICY: dict[str, tuple[Severity, Action]] = {
    "cost_overrun": ("medium", "continue"),
    "latency_spike": ("high", "fallback"),
    "empty_answer": ("high", "retry"),
    "short_answer": ("medium", "retry"),
    "uncited_answer": ("low", "continue"),
    "repeated_tool_call": ("medium", "continue"),
    "looping_tool_calls": ("critical", "escalate"),
    "context_degradation": ("medium", "continue"),
    "chain_depth": ("medium", "continue"),
}
_ANY: frozenset[Action] = frozenset({"continue", "retry", "fallback", "rollback", "escalate"})
_NOTE_OR_STOP: frozenset[Action] = frozenset({"continue", "escalate"})
#: kind -> the actions recovery can carry out for it. A cost overrun, an uncited answer and the
#: last step with tools are found once the answer is out (running it again would only say it
#: twice, and cost more), a cut history before any call: those are noted or end the turn. A slow
#: first token is met by the fallback before any text, or waited out.
ACTIONS: dict[str, frozenset[Action]] = {
    "cost_overrun": _NOTE_OR_STOP,
    "latency_spike": frozenset({"continue", "fallback"}),
    "empty_answer": _ANY,
    "short_answer": _ANY,
    "uncited_answer": _NOTE_OR_STOP,
    "repeated_tool_call": _ANY,
    "looping_tool_calls": _ANY,
    "context_degradation": _NOTE_OR_STOP,
    "chain_depth": _NOTE_OR_STOP,
}
#: actions that run the model again: what ``max_retries_per_turn`` counts
RERUNS: tuple[Action, ...] = ("retry", "fallback", "rollback")


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    message: str
    #: what recovery does about it: the policy's recommendation, or the deployment's own
    #: (``[llm.anomalies] actions``)
    action: Action = "continue"

    @property
    def severity(self) -> Severity:
        return POLICY[self.kind][0]


class Escalated(Exception):
    """A recovery that ends the turn (an anomaly whose action is ``escalate``)."""

    def __init__(self, anomaly: Anomaly) -> None:
        super().__init__(anomaly.message)
        self.anomaly = anomaly


def action_for(kind: str, policy: AnomalySettings) -> Action:
    """What recovery does about ``kind``: the deployment's mapping, else the recommendation."""
    return policy.actions.get(kind, POLICY[kind][1])


def found(kind: str, message: str, policy: AnomalySettings) -> Anomaly:
    return Anomaly(kind, message, action_for(kind, policy))


def _signature(call: ToolCall) -> tuple[str, str]:
    import json

    return call.name, json.dumps(call.arguments, sort_keys=True, default=str)


def this_turn(history: Sequence[Message]) -> Sequence[Message]:
    last_user = max((i for i, m in enumerate(history) if isinstance(m, UserMessage)), default=-1)
    return history[last_user + 1:]


def check_calls(history: Sequence[Message], calls: Sequence[ToolCall], policy: AnomalySettings) -> list[Anomaly]:
    """The step's tool calls against the turn's earlier ones: the same call again is odd; the
    same call ``repeated_calls_escalate`` times is a loop that only ends by stopping the turn."""
    seen = Counter(_signature(c) for m in this_turn(history) if isinstance(m, AssistantMessage) for c in m.tool_calls)
    out = []
    for call in calls:
        times = seen[_signature(call)] + 1
        if times >= policy.repeated_calls_escalate:
            out.append(found("looping_tool_calls", f"{call.name} was called {times} times with the same arguments "
                                                   "in this turn; the turn stops rather than loop", policy))
        elif times > 1:
            out.append(found("repeated_tool_call", f"{call.name} was called again with the same arguments; "
                                                   "its earlier result is already in the conversation", policy))
    return out


def check_answer(text: str, *, had_results: bool, cited: int | None, policy: AnomalySettings) -> list[Anomaly]:
    """A final answer: empty or very short, or uncited although tools answered."""
    out = []
    stripped = text.strip()
    if not stripped:
        out.append(found("empty_answer", "the model answered with no text", policy))
    elif len(stripped) < policy.min_answer_chars:
        out.append(found("short_answer", f"the answer has {len(stripped)} characters "
                                         f"(fewer than {policy.min_answer_chars})", policy))
    elif had_results and cited == 0:
        out.append(found("uncited_answer", "the answer cites none of this turn's tool calls", policy))
    return out


def check_cost(estimated_usd: float | None, actual_usd: float, policy: AnomalySettings) -> list[Anomaly]:
    if not estimated_usd or actual_usd <= policy.cost_overrun_ratio * estimated_usd:
        return []
    return [found("cost_overrun", f"the step cost ${actual_usd:.4f}, {actual_usd / estimated_usd:.1f}x the "
                                  f"router's estimate of ${estimated_usd:.4f}", policy)]


def check_context(loaded: int, total: int, policy: AnomalySettings) -> list[Anomaly]:
    if total <= 0 or loaded >= total or (total - loaded) / total <= policy.context_cut_ratio:
        return []
    return [found("context_degradation", f"the conversation was cut from {total} to {loaded} messages to fit",
                  policy)]


def check_depth(step: int, depth: int, calls: Sequence[ToolCall], policy: AnomalySettings) -> list[Anomaly]:
    if calls and step == depth - 1:
        return [found("chain_depth", f"step {step + 1} of at most {depth} called tools: the next step must answer "
                                     "without them", policy)]
    return []


__all__ = ["ACTIONS", "POLICY", "RERUNS", "Action", "Anomaly", "Escalated", "action_for", "check_answer", "check_calls",
           "check_context", "check_cost", "check_depth", "found"]
