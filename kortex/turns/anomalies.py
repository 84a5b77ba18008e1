"""The checks run on each step (a detection policy with thresholds in ``[llm.anomalies]``) and
what recovery does about each kind (policy as data).

Detection is pure: the step hands in what happened and gets back ``Anomaly`` records. The step
carries out the recommended action (kortex/turns/step.py): ``continue`` records it; ``retry``
runs the model again (at most once per step and three times per turn), announced, so text the
client already has is never repeated silently; ``fallback`` hands the step to the routing
decision's fallback model (a slow first token, before any text); ``escalate`` ends the turn with
a clear error. ``rollback`` (rerun from the parent checkpoint) is an action a deployment can map
a kind to; by default no kind recommends it, because a step's parent checkpoint is where the
step itself starts, which ``retry`` already reruns.
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


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    message: str

    @property
    def severity(self) -> Severity:
        return POLICY[self.kind][0]

    @property
    def action(self) -> Action:
        return POLICY[self.kind][1]


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
            out.append(Anomaly("looping_tool_calls", f"{call.name} was called {times} times with the same arguments "
                                                     "in this turn; the turn stops rather than loop"))
        elif times > 1:
            out.append(Anomaly("repeated_tool_call", f"{call.name} was called again with the same arguments; "
                                                     "its earlier result is already in the conversation"))
    return out


def check_answer(text: str, *, had_results: bool, cited: int | None, policy: AnomalySettings) -> list[Anomaly]:
    """A final answer: empty or very short, or uncited although tools answered."""
    out = []
    stripped = text.strip()
    if not stripped:
        out.append(Anomaly("empty_answer", "the model answered with no text"))
    elif len(stripped) < policy.min_answer_chars:
        out.append(Anomaly("short_answer", f"the answer has {len(stripped)} characters "
                                           f"(fewer than {policy.min_answer_chars})"))
    elif had_results and cited == 0:
        out.append(Anomaly("uncited_answer", "the answer cites none of this turn's tool calls"))
    return out


def check_cost(estimated_usd: float | None, actual_usd: float, policy: AnomalySettings) -> list[Anomaly]:
    if not estimated_usd or actual_usd <= policy.cost_overrun_ratio * estimated_usd:
        return []
    return [Anomaly("cost_overrun", f"the step cost ${actual_usd:.4f}, {actual_usd / estimated_usd:.1f}x the "
                                    f"router's estimate of ${estimated_usd:.4f}")]


def check_context(loaded: int, total: int, policy: AnomalySettings) -> list[Anomaly]:
    if total <= 0 or loaded >= total or (total - loaded) / total <= policy.context_cut_ratio:
        return []
    return [Anomaly("context_degradation", f"the conversation was cut from {total} to {loaded} messages to fit")]


def check_depth(step: int, depth: int, calls: Sequence[ToolCall]) -> list[Anomaly]:
    if calls and step == depth - 1:
        return [Anomaly("chain_depth", f"step {step + 1} of at most {depth} called tools: the next step must answer "
                                       "without them")]
    return []


__all__ = ["POLICY", "Anomaly", "check_answer", "check_calls", "check_context", "check_cost", "check_depth"]
