"""The offline analyst: a deterministic, rule-based provider (no LLM, no API key).

It reads the question, calls the investigation tools the session allows, and writes an
answer grounded in their results, citing each result by its tool call id. Every answer says
plainly that it comes from rules, not from a language model.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kortex.config import ProviderSettings, Settings
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    Provider,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
)
from kortex.llm.offline.evidence import (
    Shift,
    change_point,
    classify,
    clock,
    fmt_value,
    nearest_deploy,
    parse_ts,
    top_pattern,
)
from kortex.llm.offline.question import Intent, read_question
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage

LABEL = "Offline analyst (rule-based, no LLM)"
MAX_ROUNDS = 3
METRIC_FOR = {
    "latency": "http_request_duration_seconds_p99",
    "errors": "http_requests_error_ratio",
}
METRIC_HINTS = {"latency": ("duration", "latency", "p99"), "errors": ("error", "5xx", "fail")}


@dataclass
class TurnState:
    """What happened so far in the current turn, as the message history shows it."""

    question: str
    turn_index: int
    rounds: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    results: dict[str, ToolResult] = field(default_factory=dict)

    def done_calls(self) -> list[tuple[ToolCall, ToolResult]]:
        return [(c, self.results[c.id]) for c in self.calls if c.id in self.results]


def read_turn(messages: Sequence[Message]) -> TurnState:
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    question = messages[last_user].content if last_user >= 0 else ""  # type: ignore[union-attr]
    state = TurnState(question=question, turn_index=sum(isinstance(m, UserMessage) for m in messages))
    for message in messages[last_user + 1:]:
        if isinstance(message, AssistantMessage):
            state.rounds += 1
            state.calls.extend(message.tool_calls)
        elif isinstance(message, ToolMessage):
            state.results[message.result.call_id] = message.result
    return state


class OfflineAnalyst(Provider):
    name = "offline"
    local = True
    synthetic = True

    def __init__(self, chunk_chars: int = 48) -> None:
        self.chunk_chars = chunk_chars

    def models(self) -> Sequence[ModelInfo]:
        return [ModelInfo(id="analyst", display_name=LABEL, context_tokens=1_000_000, tier="fast")]

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        state = read_turn(request.messages)
        available = {t.name for t in request.tools}
        intent = read_question(state.question)
        in_tokens = max(1, sum(len(_text_of(m)) for m in request.messages) // 4)
        calls: list[ToolCall] = []
        if state.rounds < MAX_ROUNDS and intent.product:
            calls = (self._first_round(intent, available) if not state.calls
                     else self._follow_ups(intent, state, available))
        if calls:
            calls = [self._with_id(c, state, i) for i, c in enumerate(calls)]
            for call in calls:
                yield ToolCallChunk(call=call)
            yield DoneChunk(stop_reason="tool_use", usage=TokenUsage(input_tokens=in_tokens, output_tokens=20),
                            model="analyst")
            return
        answer = write_answer(intent, state, available)
        for piece in _pieces(answer, self.chunk_chars):
            yield TextChunk(text=piece)
        yield DoneChunk(stop_reason="end_turn",
                        usage=TokenUsage(input_tokens=in_tokens, output_tokens=max(1, len(answer) // 4)),
                        model="analyst")

    def _with_id(self, call: ToolCall, state: TurnState, index: int) -> ToolCall:
        seed = f"{state.turn_index}|{state.rounds}|{index}|{call.name}|{state.question}"
        return call.model_copy(update={"id": "call_" + hashlib.sha256(seed.encode()).hexdigest()[:16]})

    def _first_round(self, intent: Intent, available: set[str]) -> list[ToolCall]:
        product, window = intent.product, intent.window
        plan: list[tuple[str, dict[str, Any]]] = [
            ("get_recent_deploys", {"product": product, "time_range": window}),
        ]
        for symptom in intent.symptoms:
            plan.append(("get_metrics", {"product": product, "metric_name": METRIC_FOR[symptom],
                                         "time_range": window}))
        plan.append(("get_logs", {"product": product, "time_range": window, "level": "error"}))
        return [ToolCall(id="", name=name, arguments=args) for name, args in plan if name in available]

    def _follow_ups(self, intent: Intent, state: TurnState, available: set[str]) -> list[ToolCall]:
        """A metric that had no data lists the ones that exist: try the closest one, once."""
        if "get_metrics" not in available:
            return []
        tried = {c.arguments.get("metric_name") for c in state.calls if c.name == "get_metrics"}
        out = []
        for call, result in state.done_calls():
            if call.name != "get_metrics" or result.is_error or not isinstance(result.content, dict):
                continue
            if result.content.get("samples"):
                continue
            symptom = next((s for s, m in METRIC_FOR.items() if m == call.arguments.get("metric_name")), None)
            hints = METRIC_HINTS.get(symptom or "", ())
            for name in result.content.get("available_metrics") or []:
                if name not in tried and any(h in name for h in hints):
                    tried.add(name)
                    out.append(ToolCall(id="", name="get_metrics",
                                        arguments={**call.arguments, "metric_name": name}))
                    break
        return out


def _text_of(message: Message) -> str:
    if isinstance(message, ToolMessage):
        return str(message.result.content)
    return message.content


def _pieces(text: str, size: int) -> list[str]:
    """Split on spaces into chunks of about ``size`` characters, as a model would stream."""
    out, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if len(candidate) > size and current:
            out.append(current + " ")
            current = word
        else:
            current = candidate
    if current:
        out.append(current)
    return out


# ---- writing the answer -------------------------------------------------------------------


def write_answer(intent: Intent, state: TurnState, available: set[str]) -> str:
    head = f"**{LABEL}**"
    if not intent.product:
        return (f"{head}: I could not tell which product or service the question is about. "
                "Name it, for example: \"Why is checkout slow?\" or \"Is payments failing since 14:30?\"")
    done = state.done_calls()
    if not done:
        if not available:
            return (f"{head}: no investigation tools are enabled for this session, so I cannot look at "
                    f"{intent.product}'s telemetry. Ask an administrator to allow get_logs, get_metrics "
                    "and get_recent_deploys.")
        return f"{head}: I have no evidence about {intent.product} yet."

    evidence: list[str] = []
    shifts: list[tuple[ToolCall, Shift, str | None]] = []
    deploys: list[dict[str, Any]] = []
    deploy_call: ToolCall | None = None
    log_call: ToolCall | None = None
    log_total = 0
    pattern: tuple[str, int, str] | None = None
    failed: list[str] = []

    for call, result in done:
        cite = f"[{call.id}]"
        content = result.content if isinstance(result.content, dict) else {}
        if result.is_error:
            failed.append(f"- {cite} {call.name} failed: {content.get('message') or content.get('error')}")
            continue
        if call.name == "get_metrics":
            metric = call.arguments.get("metric_name", "?")
            samples = content.get("samples") or []
            unit = content.get("unit")
            shift = change_point(samples)
            if not samples:
                evidence.append(f"- {cite} get_metrics {metric} ({call.arguments.get('time_range')}): no data.")
            elif shift and shift.significant:
                shifts.append((call, shift, unit))
                evidence.append(
                    f"- {cite} get_metrics {metric}: {fmt_value(shift.before, unit)} before "
                    f"{clock(shift.onset)}, {fmt_value(shift.after, unit)} after ({shift.ratio:.1f}x).")
            else:
                stats = content.get("stats") or {}
                evidence.append(f"- {cite} get_metrics {metric}: steady, mean "
                                f"{fmt_value(float(stats.get('mean', 0)), unit)}, no step change.")
        elif call.name == "get_recent_deploys":
            deploy_call = call
            deploys = content.get("deploys") or []
            listed = ", ".join(f"{d['version']} at {clock(_ts(d))}" for d in deploys[:5]) or "none"
            evidence.append(f"- {cite} get_recent_deploys ({call.arguments.get('time_range')}): {listed}.")
        elif call.name == "get_logs":
            log_call = call
            lines = content.get("lines") or []
            log_total = int(content.get("total_matches") or len(lines))
            pattern = top_pattern(lines)
            level = call.arguments.get("level")
            scope = f"level >= {level}" if level else "all levels"
            if pattern:
                evidence.append(f"- {cite} get_logs ({scope}, {call.arguments.get('time_range')}): "
                                f"{log_total} matching lines; most common ({pattern[1]} of the {len(lines)} "
                                f"shown): \"{pattern[2]}\".")
            else:
                evidence.append(f"- {cite} get_logs ({scope}): no matching lines.")

    summary = _summary(intent, shifts, deploys, deploy_call, log_call, log_total, pattern)
    parts = [f"{head} — investigation of \"{state.question.strip()}\"", "", f"**Summary.** {summary}", "",
             "**Evidence**", *evidence, *failed]
    steps = _next_steps(intent, shifts, deploys, pattern)
    if steps:
        parts += ["", "**Suggested next steps** (nothing has been changed; a human decides)"]
        parts += [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    return "\n".join(parts)


def _ts(deploy: dict[str, Any]) -> datetime:
    return parse_ts(deploy["ts"])


def _summary(
    intent: Intent,
    shifts: list[tuple[ToolCall, Shift, str | None]],
    deploys: list[dict[str, Any]],
    deploy_call: ToolCall | None,
    log_call: ToolCall | None,
    log_total: int,
    pattern: tuple[str, int, str] | None,
) -> str:
    product = intent.product
    sentences = []
    cause = classify(pattern[2]) if pattern else None
    linked = None
    if shifts:
        call, shift, unit = max(shifts, key=lambda s: s[1].ratio)
        metric = call.arguments.get("metric_name", "the metric")
        sentences.append(
            f"{product}'s {metric} went from {fmt_value(shift.before, unit)} to {fmt_value(shift.after, unit)} "
            f"({shift.ratio:.1f}x) at {clock(shift.onset)} [{call.id}].")
        linked = nearest_deploy(deploys, shift.onset)
        if linked and deploy_call is not None:
            deploy, gap = linked
            minutes = int(gap.total_seconds() // 60)
            when = f"{minutes} minutes after" if minutes > 0 else "right after"
            sentences.append(
                f"That is {when} deploy {deploy['version']} (commit {deploy.get('commit') or 'unknown'}, "
                f"by {deploy.get('actor') or 'unknown'}) landed at {clock(_ts(deploy))} [{deploy_call.id}].")
        elif deploy_call is not None:
            sentences.append(f"No deploy of {product} landed near that change [{deploy_call.id}].")
    else:
        sentences.append(f"I found no step change in {product}'s metrics over the window.")
    if pattern and log_call is not None:
        sentences.append(f"{log_total} error lines since; the dominant one reads \"{pattern[2]}\" [{log_call.id}].")
    if cause and linked:
        sentences.append(f"Most likely cause: {cause[0]}, introduced by deploy {linked[0]['version']}.")
    elif cause:
        sentences.append(f"Most likely cause: {cause[0]}.")
    elif linked:
        sentences.append(f"Most likely cause: a change shipped in deploy {linked[0]['version']}.")
    return " ".join(sentences)


def _next_steps(
    intent: Intent,
    shifts: list[tuple[ToolCall, Shift, str | None]],
    deploys: list[dict[str, Any]],
    pattern: tuple[str, int, str] | None,
) -> list[str]:
    steps = []
    cause = classify(pattern[2]) if pattern else None
    linked = nearest_deploy(deploys, max(shifts, key=lambda s: s[1].ratio)[1].onset) if shifts else None
    if linked:
        steps.append(f"Consider rolling back {intent.product} {linked[0]['version']} and watch whether the "
                     "metric returns to its earlier level.")
    if cause:
        steps.append(cause[1][0].upper() + cause[1][1:] + ".")
    if not steps:
        steps.append(f"Widen the time window or look at {intent.product}'s dependencies.")
    return steps


def create(name: str, config: ProviderSettings, settings: Settings) -> Provider:
    return OfflineAnalyst()
