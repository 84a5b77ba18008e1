"""The offline analyst: a deterministic, rule-based provider (no LLM, no API key).

It reads the question, walks a playbook of probes (``service`` for a product's telemetry,
``platform`` for the LLM platform) over the tools the session allows, round after round, and
writes an answer grounded in their results, citing each result by its tool call id. Every
answer says plainly that it comes from rules, not from a language model.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

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
from kortex.llm.offline import platform, postmortem, report, service
from kortex.llm.offline import subject as subjects
from kortex.llm.offline.plan import PlanState, Probe, View, walk
from kortex.llm.offline.question import Intent, read_question
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.prompts import REGROUND_MARK

LABEL = "Offline analyst (rule-based, no LLM)"
MAX_ROUNDS = 6  # survey, metrics, logs split at the onset, one hop further, a proposal


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


def _asked(message: Message) -> bool:
    """A user's question; the strict grounding check's re-ask (REGROUND_MARK) continues the turn."""
    return isinstance(message, UserMessage) and not message.content.startswith(REGROUND_MARK)


def read_turn(messages: Sequence[Message]) -> TurnState:
    last_user = max((i for i, m in enumerate(messages) if _asked(m)), default=-1)
    question = messages[last_user].content if last_user >= 0 else ""  # type: ignore[union-attr]
    state = TurnState(question=question, turn_index=sum(_asked(m) for m in messages))
    for message in messages[last_user + 1:]:
        if isinstance(message, AssistantMessage):
            state.rounds += 1
            state.calls.extend(message.tool_calls)
        elif isinstance(message, ToolMessage):
            state.results[message.result.call_id] = message.result
    return state


def playbook(intent: Intent) -> list[Probe]:
    return platform.probes(intent) if intent.domain == "llm" else service.probes(intent)


def investigate(intent: Intent, state: TurnState, available: set[str]) -> tuple[list[ToolCall], View]:
    return walk(playbook(intent), intent, PlanState(calls=state.calls, results=state.results), available)


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
        offered = {t.name for t in request.tools}
        # A request with no tools (the grounding check's re-ask, a turn's last allowed step) is
        # answered from the turn's results: the playbook re-reads them under the tools they came
        # from, and calls nothing new.
        available = offered or {c.name for c in state.calls}
        if postmortem.SUBMIT in available:  # a post-mortem turn: its answer is a submitted document
            async for chunk in self._postmortem(state, available, can_call=bool(offered)):
                yield chunk
            return
        intent = read_question(state.question)
        if _lookup_first(intent) and "list_products" in available:
            found = subjects.listed(state.done_calls())
            if found is None and offered and state.rounds < MAX_ROUNDS:  # first learn what exists
                call = self._with_id(ToolCall(id="", name="list_products", arguments={}), state, 0)
                yield ToolCallChunk(call=call)
                yield DoneChunk(stop_reason="tool_use", usage=TokenUsage(input_tokens=1, output_tokens=10),
                                model="analyst")
                return
            if found is not None:
                intent = _placed(intent, found[1])
        in_tokens = max(1, sum(len(_text_of(m)) for m in request.messages) // 4)
        calls, view = investigate(intent, state, available)
        if state.rounds >= MAX_ROUNDS or not offered:
            calls = []
        if calls:
            calls = [self._with_id(c, state, i) for i, c in enumerate(calls)]
            for call in calls:
                yield ToolCallChunk(call=call)
            yield DoneChunk(stop_reason="tool_use", usage=TokenUsage(input_tokens=in_tokens, output_tokens=20),
                            model="analyst")
            return
        answer = write_answer(intent, state, available, view)
        for piece in _pieces(answer, self.chunk_chars):
            yield TextChunk(text=piece)
        yield DoneChunk(stop_reason="end_turn",
                        usage=TokenUsage(input_tokens=in_tokens, output_tokens=max(1, len(answer) // 4)),
                        model="analyst")

    async def _postmortem(self, state: TurnState, available: set[str], *, can_call: bool = True
                          ) -> AsyncIterator[StreamChunk]:
        usage = TokenUsage(input_tokens=max(1, len(state.question) // 4), output_tokens=20)
        wanted = postmortem.read_request(state.question)
        submitted = [(c, r) for c, r in state.done_calls() if c.name == postmortem.SUBMIT]
        calls: list[ToolCall] = []
        if wanted is not None and not submitted:
            calls, view = investigate(postmortem.intent_of(wanted), state, available)
            record = postmortem.record_call(wanted)
            made = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in state.calls}
            if record.name in available and (record.name, json.dumps(record.arguments, sort_keys=True)) not in made:
                calls.append(record)
            if not calls or state.rounds >= MAX_ROUNDS:  # investigated: submit what it shows
                document = postmortem.document(wanted, view, state.done_calls())
                calls = [ToolCall(id="", name=postmortem.SUBMIT, arguments=document)]
        elif wanted is not None and _lost(submitted[-1][1]) and len(submitted) < MAX_SUBMITS:
            # The submission never ran to a verdict (its worker died, it timed out): the same
            # document again. A refusal of the document itself is the answer and stands.
            calls = [submitted[-1][0].model_copy(update={"id": ""})]
        if calls and can_call:
            for i, call in enumerate(calls):
                yield ToolCallChunk(call=self._with_id(call, state, i))
            yield DoneChunk(stop_reason="tool_use", usage=usage, model="analyst")
            return
        if wanted is None:
            text = f"**{LABEL}**: the request names no incident (an `incident: {{...}}` line), so there is nothing to write."
        elif submitted and not submitted[-1][1].is_error:
            text = f"**{LABEL}**: the post-mortem of {wanted.ref} is submitted [{submitted[-1][0].id}]."
        else:
            error = submitted[-1][1].content if submitted else None
            text = f"**{LABEL}**: the post-mortem of {wanted.ref} was refused: {json.dumps(error)[:1000]}"
        for piece in _pieces(text, self.chunk_chars):
            yield TextChunk(text=piece)
        yield DoneChunk(stop_reason="end_turn", usage=usage, model="analyst")

    def _with_id(self, call: ToolCall, state: TurnState, index: int) -> ToolCall:
        # Random, as a vendor's are: ids derived from the question repeated across sessions.
        return call.model_copy(update={"id": "call_" + secrets.token_hex(8)})


MAX_SUBMITS = 3


_MODEL_NAME = re.compile(r"^[a-z]+-?\d")  # gpt-4, llama-70b: a model's family and size, no product's name


def _lookup_first(intent: Intent) -> bool:
    """Whether what exists decides the subject: a question that names no product, or one that
    names a product where words of the LLM platform decided the domain ("why is the tokens
    service failing?": a product called tokens outranks the word)."""
    if intent.trace_id or intent.request_id:
        return False
    if intent.domain != "llm":
        return not intent.product
    return intent.product is not None and not _MODEL_NAME.match(intent.product)


def _placed(intent: Intent, names: Sequence[str]) -> Intent:
    """The question's subject resolved against the products list_products named."""
    if intent.domain == "llm":
        # A product the telemetry knows, named in the question, outranks words of the platform.
        named = [n for n in names if intent.mentions(n)]
        return replace(intent, domain="service", product=max(named, key=len)) if named else intent
    product = subjects.resolve(intent.text, names)
    return replace(intent, product=product) if product is not None else intent


def _lost(result: ToolResult) -> bool:
    return result.is_error and result.error_code in ("timeout", "upstream", "internal", "cancelled")


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


def _proposal_line(view: View) -> list[str]:
    proposed = view.get("propose")
    if proposed is None:
        return []
    if not proposed.ok:
        message = (proposed.result.content or {}).get("message") if isinstance(proposed.result.content, dict) else None
        # A failed call is named, not cited: it is no evidence (kortex/turns/grounding.py).
        return [f"- propose_action {proposed.call.arguments.get('action')} failed (call {proposed.call.id}): {message}"]
    args = proposed.call.arguments
    return [f"- [{proposed.call.id}] propose_action: proposed {args.get('action')} of {args.get('product')} "
            f"({', '.join(f'{k}={v}' for k, v in (args.get('params') or {}).items())}) as proposal "
            f"{proposed.content.get('proposal_id')}; it waits for an operator to confirm it (until "
            f"{proposed.content.get('expires_at')})."]


def _failures(view: View, state: TurnState) -> list[str]:
    cited = {e.call.id for e in view.by_key.values() if e.ok}
    out = []
    for call, result in state.done_calls():
        if call.id in cited or call.name in ("propose_action", "list_products"):  # read elsewhere
            continue
        if not result.is_error:
            out.append(f"- [{call.id}] {call.name}: returned data these rules do not read.")
            continue
        content = result.content if isinstance(result.content, dict) else {}
        reason = content.get("message") or content.get("error") or "no usable result"
        out.append(f"- {call.name} failed (call {call.id}): {reason}")  # named, not cited: no evidence
    return out


def write_answer(intent: Intent, state: TurnState, available: set[str], view: View | None = None) -> str:
    head = f"**{LABEL}**"
    view = view or View()
    if intent.domain != "llm" and not intent.product and not intent.trace_id:
        known = subjects.listed(state.done_calls())
        names = (f" The telemetry names these products: {', '.join(known[1][:20])} [{known[0].id}]."
                 if known is not None and known[1] else "")
        return (f"{head}: I could not tell which product or service the question is about.{names} "
                "Name it, for example: \"Why is checkout slow?\" or \"Is payments failing since 14:30?\"")
    if not state.done_calls():
        if not available:
            return (f"{head}: no investigation tools are enabled for this session, so I cannot look at the "
                    "telemetry. Ask an administrator to allow get_logs, get_metrics and get_recent_deploys.")
        subject = intent.product or "the LLM platform"
        return f"{head}: I have no evidence about {subject} yet."
    if intent.domain == "llm":
        found_p = platform.analyse(intent, view)
        summary = platform.summary(intent, view, found_p, subjects.listed(state.done_calls()))
        evidence = platform.evidence_lines(intent, view, found_p)
        steps = platform.next_steps(intent, found_p)
    elif service.product_of(intent, view) is None:
        return "\n".join([f"{head}: I could not find trace {intent.trace_id!r}, and the question names no product.",
                          "", "**Evidence**", *_failures(view, state)])
    else:
        found_s = service.analyse(intent, view)
        summary = report.summary(intent, view, found_s)
        evidence = report.evidence_lines(intent, view, found_s)
        steps = report.next_steps(intent, found_s)
    parts = [f"{head} — investigation of \"{state.question.strip()}\"", "", f"**Summary.** {summary}", "",
             "**Evidence**", *evidence, *_proposal_line(view), *_failures(view, state)]
    if steps:
        parts += ["", "**Suggested next steps** (nothing has been changed; a human decides)"]
        parts += [f"{i}. {s}" for i, s in enumerate(steps, 1)]
    return "\n".join(parts)


def create(name: str, config: ProviderSettings, settings: Settings) -> Provider:
    return OfflineAnalyst()
