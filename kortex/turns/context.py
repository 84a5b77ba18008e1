"""What a step's LLM calls carry: the conversation so far once the budget allows another call
(``load``), and for each call the history cut to fit its model's context window, with the
session's token cap checked against what the call may add (``Window``, ``FittedStream``).

Only what is sent is cut; the stored conversation keeps everything. The oldest goes first, a
message or a tool call with its result at a time (vendors refuse a call without its result, and
a result without its call); the system prompt and the latest user message always stay, and a
note in place of what was left out tells the model. ``max_history_messages`` counts messages;
this counts tokens, with the routing estimator (kortex/llm/routing.py): newest first and only
until the window is full, each tool result serialised once however often the step asks (routing,
the fit of each call, a re-ask)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlalchemy.engine import Connection

from kortex import budget
from kortex.config import ProviderSettings
from kortex.container import Kortex
from kortex.errors import BudgetExceeded, ConfigError, KortexError, ProviderError, ProviderUnavailable
from kortex.llm.base import CompletionRequest, ModelInfo, Provider
from kortex.llm.router import Candidate, RoutedStream
from kortex.llm.routing import call_tokens, message_tokens, text_tokens, tokens_of
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from kortex.prompts import CONTEXT_CUT
from kortex.storage import chats
from kortex.storage.records import Spent, TurnRecord
from kortex.turns.profiles import profile_of
from kortex.turns.spendguard import Reservation

log = logging.getLogger(__name__)

#: share of a model's context window left free for the estimate's error (JSON of bare ids comes
#: to ~18% more tokens than estimated; see kortex/llm/routing.py). A setting to add one day:
#: ``llm.context_margin``.
CONTEXT_MARGIN = 0.1
#: the least of a small window kept for the answer (see ``Window.fitted``)
MIN_ANSWER_TOKENS = 1024
#: the note's estimate, what it names filled in
_NOTE_TOKENS = text_tokens(CONTEXT_CUT) + 16


def load(k: Kortex, conn: Connection, turn: TurnRecord, spent: Spent,
         read: list[Message] | None = None) -> list[Message] | KortexError:
    """The conversation so far (``read`` when the claim read it already), once the budget
    allows another LLM call (it is checked before every call, not only when the turn began)."""
    try:
        budget.check_spend(k.settings.llm.budget, spent)
    except BudgetExceeded as exc:
        return exc
    history = read if read is not None else chats.load_history(
        conn, turn.tenant_id, turn.session_id, limit=k.settings.llm.max_history_messages)
    try:
        gate = profile_of(turn.profile).before_call
    except ConfigError:
        gate = None  # the step fails the turn as unknown_profile before any call
    refusal = gate(conn, turn, history) if gate is not None else None
    return refusal if refusal is not None else history  # refused: the kind of turn's own limit


@dataclass(slots=True)
class _Unit:
    """What is left out together: a message, or one tool call with its result."""

    parts: list[Message | ToolCall]
    text: int = 0  # tokens of the text of an assistant message whose calls these are (its last call)
    protected: bool = False
    kept: bool = True

    def tokens(self) -> int:
        return self.text + sum(call_tokens(p) if isinstance(p, ToolCall) else message_tokens(p) for p in self.parts)


def cut(messages: Sequence[Message], room: int, keep: Sequence[Message] = (),
        sent: Sequence[Message] | None = None) -> tuple[tuple[Message, ...] | None, int]:
    """``sent`` (``messages`` as they go out, e.g. scrubbed: one for one; by default ``messages``)
    with the oldest left out until the estimate of ``messages`` fits ``room`` tokens, and a note
    in their place; and that estimate. The latest user message, the newest tool call of the turn
    with its result (a model that no longer saw the result it just asked for would ask for it
    again, step after step: a result too large for the window fails the step instead) and those
    in ``keep`` stay: when even they do not fit, None and the estimate of that minimum.

    Measured newest first, and only until the room is full: what is left out is never measured
    (nor serialised), so a long history costs what the window holds, not what the session holds."""
    sent = messages if sent is None else sent
    units: list[_Unit] = []
    where: list[int | list[int]] = []  # per message its unit; an assistant message's calls, one each
    last_user = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    open_calls: dict[str, int] = {}
    for i, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            index = open_calls.pop(message.result.call_id, None)
            if index is None:  # answers no open call: a vendor never sees it (convert.paired)
                units.append(_Unit([]))
                index = len(units) - 1
            units[index].parts.append(message)
            where.append(index)
            continue
        open_calls = {}
        if isinstance(message, AssistantMessage) and message.tool_calls:
            first = len(units)
            units += [_Unit([c]) for c in message.tool_calls]
            units[-1].text = text_tokens(message.content)  # the text goes with its last call
            open_calls = {c.id: first + n for n, c in enumerate(message.tool_calls)}
            where.append(list(range(first, len(units))))
        else:
            protected = i == last_user or any(message is m for m in keep)
            units.append(_Unit([message], protected=protected))
            where.append(len(units) - 1)
    newest = where[-1] if messages and isinstance(messages[-1], ToolMessage) and len(messages) - 1 > last_user \
        else None
    if isinstance(newest, int):
        units[newest].protected = True
    total = sum(u.tokens() for u in units if u.protected)
    kept: list[tuple[_Unit, int]] = []  # newest first
    for unit in reversed(units):
        if unit.protected:
            continue
        if total > room:  # past the room already: the older are left out, unmeasured
            unit.kept = False
            continue
        tokens = unit.tokens()
        kept.append((unit, tokens))
        total += tokens
    if total <= room:  # nothing was left out
        return tuple(sent), total
    total += _NOTE_TOKENS
    while kept and total > room:  # the one that passed the room, and room for the note: the oldest kept
        unit, tokens = kept.pop()
        unit.kept = False
        total -= tokens
    if total > room:
        return None, total
    return _rebuild(sent, where, units), total


def _rebuild(sent: Sequence[Message], where: list[int | list[int]], units: list[_Unit]) -> tuple[Message, ...]:
    out: list[Message] = []
    note_at: int | None = None
    messages = calls = 0  # left out
    for message, place in zip(sent, where, strict=True):
        if isinstance(place, list):
            assert isinstance(message, AssistantMessage)
            kept = tuple(c for c, u in zip(message.tool_calls, place, strict=True) if units[u].kept)
            if len(kept) < len(place):
                note_at = len(out) if note_at is None else note_at
                calls += len(place) - len(kept)
                messages += not kept
            if kept:
                out.append(message if len(kept) == len(place) else message.model_copy(update={"tool_calls": kept}))
        elif units[place].kept:
            out.append(message)
        else:
            note_at = len(out) if note_at is None else note_at
            messages += not isinstance(message, ToolMessage)  # a result goes with its call
    what = " and ".join([*([f"{messages} earlier messages"] if messages else []),
                         *([f"{calls} tool calls with their results"] if calls else [])])
    out.insert(len(out) if note_at is None else note_at, UserMessage(content=CONTEXT_CUT.format(what=what)))
    return tuple(out)


class Window:
    """One step's LLM calls: each request cut to fit its model's context window, and refused
    before it is made when it would take the session past its token cap."""

    def __init__(self, k: Kortex, history: Sequence[Message], spent: Spent | None,
                 turn: TurnRecord | None = None) -> None:
        self.llm = k.settings.llm
        self.turn = turn
        self.prompt_chars = k.router.prompt_chars  # cached per system prompt and tool set
        self.spent = spent
        # The turn's question stays also in a request that asks something after it (a re-ask).
        self.question = next((m for m in reversed(history) if isinstance(m, UserMessage)), None)
        self.streams: list[FittedStream] = []

    def stream(self, candidates: Sequence[Candidate], request: CompletionRequest, *,
               first_token_deadline: float | None = None) -> FittedStream:
        stream = FittedStream(self, candidates, request, first_token_deadline=first_token_deadline)
        self.streams.append(stream)
        return stream

    def refusal(self, stream: FittedStream) -> KortexError | None:
        """Why the step's first call cannot be made, said before any is: it would take the session
        past its token cap (BudgetExceeded, as when the session is spent), or no candidate's window
        holds even the question (context_too_long; one that cannot is failed over when another
        may)."""
        head = stream.candidates[0]
        try:
            stream.prepared(head.provider, head.fast or head.model, fast=head.fast is not None)
        except ProviderUnavailable as exc:  # another model may hold it: a frugal full model, a fallback
            return exc if len(stream.candidates) == 1 and head.fast is None else None
        except BudgetExceeded as exc:
            return exc
        return None

    def fitted(self, messages: Sequence[Message], request: CompletionRequest, provider: Provider,
               model: ModelInfo) -> tuple[CompletionRequest, int]:
        """``request`` (as the router made it for ``model``) with its history cut to fit, and its
        estimated input tokens. ``messages``: the history as stored, which is what is measured.

        The answer keeps ``max_tokens`` of the window (vendors refuse a prompt plus max_tokens past
        it), but never more than an eighth of a small window (at least MIN_ANSWER_TOKENS): an 8k
        local model with 5k of instructions and tool schemas would hold no history at all. There
        ``max_tokens`` is lowered to what the window leaves."""
        prompt = tokens_of(self.prompt_chars(request.system, request.tools))
        space = int(model.context_tokens * (1 - CONTEXT_MARGIN)) - prompt
        reserve = min(request.max_tokens, max(MIN_ANSWER_TOKENS, model.context_tokens // 8))
        if provider.synthetic:  # not an LLM (the offline analyst): no window, but billed all the same
            space, reserve = sys.maxsize, 0
        kept, tokens = cut(messages, space - reserve, (self.question,) if self.question is not None else (),
                           sent=request.messages)
        if kept is None:
            raise ProviderUnavailable(
                f"the question and the instructions alone come to ~{tokens + prompt} tokens, more than "
                f"{model.id}'s context window of {model.context_tokens} holds with {reserve} left for the "
                f"answer and a {CONTEXT_MARGIN:.0%} margin; shorten the question or use a model with a larger "
                "window", provider=provider.name, model=model.id, code="context_too_long")
        update: dict[str, object] = {}
        if kept is not request.messages:
            update["messages"] = kept
        if space - tokens < request.max_tokens:
            update["max_tokens"] = space - tokens
        if update:
            log.info("the request to %s:%s is cut to fit its context window (~%d tokens and %d for the answer)",
                     provider.name, model.id, tokens + prompt, update.get("max_tokens", request.max_tokens))
            request = request.model_copy(update=update)
        return request, tokens + prompt

    def most_cost(self, stream: FittedStream) -> float:
        """The most the step's first call may cost in USD: its prompt as fitted for the first
        candidate whose window holds it and every candidate's ``max_tokens``, at the dearest of
        their prices (a failover or a frugal model's full one runs after it, never beside it)."""
        tokens = 0
        for candidate in stream.candidates:
            try:
                tokens = stream.estimate(candidate.provider, candidate.fast or candidate.model,
                                         fast=candidate.fast is not None)
                break
            except (ProviderUnavailable, BudgetExceeded):  # too small a window: the next one answers
                continue
        most = 0.0
        for candidate in stream.candidates:
            answer = (self.llm.providers.get(candidate.provider.name) or ProviderSettings()).max_tokens
            for model in (candidate.fast, candidate.model):
                if model is not None:
                    most = max(most, model.cost(tokens, answer))
        return most

    def admit(self, k: Kortex, stream: FittedStream) -> tuple[KortexError | None, Reservation | None]:
        """Why the step's first call cannot be made (``refusal``), or the day's room held for
        its calls (``reserve``, given back once they are billed). For an I/O thread: fitting
        measures the history (milliseconds for a long one), which would stall every stream of
        the event loop the steps share."""
        refused = self.refusal(stream)
        if refused is not None:
            return refused, None
        try:
            return None, self.reserve(k, stream)
        except BudgetExceeded as exc:
            return exc, None

    def reserve(self, k: Kortex, stream: FittedStream) -> Reservation | None:
        """Hold the most the step's calls may cost of the tenant's day, and of the kind of
        work's own budget if it has one (a job's ``max_usd``): BudgetExceeded when either, less
        what is billed and what calls in flight hold, cannot cover it."""
        if self.spent is None or self.turn is None:
            return None
        usd = self.most_cost(stream)
        limit = budget.Limits.of(self.llm.budget, self.spent.tenant_settings).daily_usd
        day = k.spend.reserve(self.turn.tenant_id, usd, limit=limit, spent=self.spent.usd_today)
        try:
            capped = profile_of(self.turn.profile).spend_cap
        except ConfigError:
            capped = None
        if capped is None:
            return day
        try:
            with k.db.connect() as conn:
                cap = capped(conn, self.turn)
            own = k.spend.reserve_within(cap, usd) if cap is not None else None
        except BaseException:
            k.spend.release(day)
            raise
        return own if day is None else day if own is None else day + own

    def check(self, upcoming: int) -> None:
        """BudgetExceeded when a call that may add ``upcoming`` tokens would pass the session's
        cap, counting what the step's calls so far were billed."""
        if self.spent is None:
            return
        billed = sum(a.usage.input_tokens + a.usage.output_tokens for s in self.streams for a in s.attempts)
        spent = replace(self.spent, session_tokens=self.spent.session_tokens + billed)
        budget.check_spend(self.llm.budget, spent, upcoming=upcoming)


class FittedStream(RoutedStream):
    """A routed stream whose every call (each candidate, a frugal fast model, a failover) sends
    its history cut to that model's window, and is refused when the session's cap would pass."""

    def __init__(self, window: Window, candidates: Sequence[Candidate], request: CompletionRequest, *,
                 first_token_deadline: float | None = None) -> None:
        super().__init__(candidates, request, window.llm, first_token_deadline=first_token_deadline)
        self.window = window
        self._fitted: dict[tuple[str, str, bool], tuple[CompletionRequest, int]] = {}

    def prepared(self, provider: Provider, model: ModelInfo, *, fast: bool) -> CompletionRequest:
        """The request for one call, fitted once per model; raises ProviderUnavailable
        (context_too_long) or BudgetExceeded."""
        key = (provider.name, model.id, fast)
        fitted = self._fitted.get(key)
        if fitted is None:
            made = super().request_for(provider, model, fast=fast)
            fitted = self._fitted[key] = self.window.fitted(self.request.messages, made, provider, model)
        request, tokens = fitted
        self.window.check(tokens + request.max_tokens)
        return request

    def estimate(self, provider: Provider, model: ModelInfo, *, fast: bool) -> int:
        """The estimated input tokens of the call to ``model``, as fitted."""
        self.prepared(provider, model, fast=fast)
        return self._fitted[(provider.name, model.id, fast)][1]

    def request_for(self, provider: Provider, model: ModelInfo, *, fast: bool) -> CompletionRequest:
        try:
            return self.prepared(provider, model, fast=fast)
        except BudgetExceeded as exc:  # a later call of the step (a failover, a re-ask): it ends the step
            raise ProviderError(exc.message, code=exc.code) from exc


__all__ = ["CONTEXT_MARGIN", "FittedStream", "Window", "cut", "load"]
