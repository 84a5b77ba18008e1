"""Which provider and model answer an LLM step, and what happens when one fails (rfc-005 §5.2).

- **normal**: the requested (or default) provider, then ``fallback_providers`` in order.
- **frugal**: each provider's fast model first; its answer is held back and, if it stopped at
  ``max_tokens`` or said ``<<NEED_MORE_CONTEXT>>``, the full model answers instead.
- **local-only** (or ``[llm.privacy] local_only``): a model whose requests leave the network
  (``Provider.leaves_network``: a cloud provider's, an Ollama ``:cloud`` model) is refused when
  a caller names it; a configured default that is one is skipped for the local provider.

Only a model the caller named is pinned (frugal mode leaves it alone); the configured default
is not. Failover happens only while no text has reached the client: a provider that fails
after it streamed text ends the step with that error, so nothing is ever said twice. Every call
made along the way is kept as an ``Attempt`` with what it was billed, also when it failed or
was cancelled (for the audit trail and the turn's cost). With ``redact_secrets`` the
conversation is scrubbed of credentials before it goes to a model whose requests leave the
network, decided per model: a local Ollama hands its ``:cloud`` models to ollama.com.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from kortex import tracing
from kortex.config import LLMSettings, ProviderSettings
from kortex.errors import InvalidInput, ProviderError, ProviderUnavailable
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    Provider,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
    UsageChunk,
    WarningChunk,
)
from kortex.llm.convert import scrubbed
from kortex.llm.registry import LOCAL_PROVIDER, ProviderRegistry
from kortex.messages import Message

NEED_MORE_CONTEXT = "<<NEED_MORE_CONTEXT>>"
FRUGAL_HINT = (
    "\n\nIf the question needs deeper analysis than you can give with confidence, reply with exactly "
    f"{NEED_MORE_CONTEXT} and nothing else; a stronger model will take over."
)
#: statuses after which another provider may well succeed (bad key, unknown model)
_FAILOVER_STATUS = frozenset({401, 403, 404})
#: a 400 that refuses the model, not the request (Ollama's "\"all-minilm\" does not support
#: chat" for an embedding model, a model id the server does not know): another model may well
#: answer. A 400 about the request itself (a prompt too long, a bad tool schema) is not one.
_MODEL_REFUSED = re.compile(r"does not support (chat|generate|completions?)\b|not a chat model|unknown model|"
                            r"model_not_(found|supported)|\bmodel\b[^.]{0,200}?\b(not found|does not exist|"
                            r"is not supported|not supported)", re.I)
#: warnings said once per step, however many calls (retries, frugal escalation) repeat them
_ONCE_PER_STEP = frozenset({"pseudo_tools"})


@dataclass(frozen=True, slots=True)
class Candidate:
    """One provider in the failover chain, with the model it answers with."""

    provider: Provider
    model: ModelInfo
    fast: ModelInfo | None = None  # frugal mode: tried first

    @property
    def spec(self) -> str:
        return f"{self.provider.name}:{self.model.id}"

    @property
    def first_spec(self) -> str:
        return f"{self.provider.name}:{(self.fast or self.model).id}"


@dataclass(slots=True)
class Attempt:
    """One LLM call: what was asked of whom, and how it went."""

    provider: str
    model: ModelInfo
    fast: bool = False
    started: float = field(default_factory=time.monotonic)
    latency_ms: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    stop_reason: str | None = None  # None while running
    error: ProviderError | None = None
    retries: int = 0  # failed tries the provider made again before this call's outcome
    first_token_ms: int | None = None  # when the first text or tool call arrived (metrics)
    text_chars: int = 0  # of text received: what a call cut before its usage came is billed by

    @property
    def spec(self) -> str:
        return f"{self.provider}:{self.model.id}"

    @property
    def cost_usd(self) -> float:
        return self.model.cost_of(self.usage)

    def end(self, *, done: DoneChunk | None = None, error: ProviderError | None = None) -> None:
        """``usage`` holds what the call reported while it ran; a failure keeps it (the vendor
        billed the prompt) and adds what the error says it cost."""
        self.latency_ms = int((time.monotonic() - self.started) * 1000)
        if done is not None:
            self.usage, self.stop_reason = done.usage.most(self.usage), done.stop_reason
        else:
            self.stop_reason, self.error = "error", error
            self.usage = self.usage.most(error.usage if error is not None else None)
            # Vendors report output tokens at the end of a stream (OpenAI only in its last chunk),
            # so a call cut short (a runaway answer stopped at llm.max_answer_chars, a step's time
            # limit) has reported little of what it produced. It is billed at least for the text
            # it sent, at about four characters a token, so budgets see a runaway's spend.
            self.usage = self.usage.most(TokenUsage.estimate(output_chars=self.text_chars))


def is_cloud(provider: Provider) -> bool:
    """A vendor's cloud rather than a server the operator runs (its catalogue is the vendor's).
    Whether a request leaves the network is a model's question: ``Provider.leaves_network``."""
    return not (provider.local or provider.synthetic)


def can_fail_over(exc: ProviderError) -> bool:
    # A 5xx is that provider's own trouble, also when trying it again is pointless (501, 505).
    server_error = exc.status is not None and exc.status >= 500
    model_refused = exc.status == 400 and bool(_MODEL_REFUSED.search(f"{exc.detail} {exc.message}"))
    return (exc.retryable or server_error or isinstance(exc, ProviderUnavailable) or exc.status in _FAILOVER_STATUS
            or model_refused or exc.code == "provider_quota")  # another account may well have credit


def plan(registry: ProviderRegistry, spec: str | None) -> list[Candidate]:
    """The failover chain for a turn's model ``spec`` (None: the configured default).

    A model the caller named is pinned on its provider (frugal mode leaves it alone); the
    configured ``default_model`` is where the chain starts, not a pin. Fallbacks answer with
    their configured model. Unavailable providers are skipped, and so is a configured default
    that local-only mode forbids; if none is left, the error says why each was skipped.
    """
    llm = registry.settings.llm
    explicit = bool(spec)
    spec = spec or llm.default_model or llm.default_provider
    name, sep, model_id = spec.partition(":")
    if not sep and name not in registry.names():
        resolved = registry.find(spec)  # a bare model id some provider offers
        name, model_id = resolved.provider.name, resolved.model.id
    chain = [name, *(f for f in llm.fallback_providers if f != name)]
    if llm.local_only and LOCAL_PROVIDER not in chain:
        chain.append(LOCAL_PROVIDER)  # local-only forces the local provider in
    out: list[Candidate] = []
    skipped: list[str] = []
    for index, candidate in enumerate(chain):
        head = index == 0
        named = head and explicit  # the caller chose this provider: its failures are the answer
        try:
            provider = registry.get(candidate)
            # Asked of the provider first (no model needed to refuse a vendor's cloud), then of
            # the model: a local server may hand some models on (Ollama's ":cloud" ones).
            if llm.local_only and provider.leaves_network():
                _refuse_off_network(registry, spec, named, candidate, skipped)
                continue
            model = provider.model_info((model_id if head else None) or _configured(llm, candidate))
            if llm.local_only and provider.leaves_network(model.id):
                _refuse_off_network(registry, spec, named, f"{candidate}:{model.id}", skipped)
                continue
        except ProviderError as exc:
            if named:
                raise
            skipped.append(f"{candidate}: {exc.message}")
            continue
        fast = None
        if llm.mode == "frugal" and not (named and model_id):
            try:
                fast = provider.fast_model()
            except ProviderError:  # a fast model that cannot be used means none, not no provider
                fast = None
        out.append(Candidate(provider, model, fast if fast and fast.id != model.id else None))
    if not out:
        raise ProviderUnavailable("no provider can answer: " + "; ".join(skipped), provider=name)
    return out


def _refuse_off_network(registry: ProviderRegistry, spec: str, named: bool, what: str, skipped: list[str]) -> None:
    """Local-only mode and a candidate whose requests leave the network: the caller's own choice
    is refused (with the registry's words), another is skipped."""
    if named:
        registry.resolve(spec)  # raises the local-only refusal
        raise ProviderUnavailable(f"{what} is served off this network, which local-only mode forbids",
                                  provider=what.partition(":")[0], code="local_only")
    skipped.append(f"{what}: not local (mode local-only)")


def _configured(llm: LLMSettings, name: str) -> str | None:
    config = llm.providers.get(name)
    return config.model if config else None


def _end_span(span: Any, attempt: Attempt, error: str | None = None) -> None:
    tracing.finish(span, error=error, **{
        "llm.input_tokens": attempt.usage.input_tokens, "llm.output_tokens": attempt.usage.output_tokens,
        "llm.stop_reason": attempt.stop_reason, "llm.first_token_ms": attempt.first_token_ms,
        "llm.retries": attempt.retries})


async def _first_token_within(chunks: AsyncIterator[StreamChunk], seconds: float) -> AsyncIterator[StreamChunk]:
    """``chunks``, but a stream that has sent no text or tool call after ``seconds`` fails as a
    retryable ``latency_spike`` (nothing has reached the client, so another model may answer).
    Each read waits under the deadline; the yields do not, so the consumer's own awaits are
    never cut by it."""
    iterator = chunks.__aiter__()
    deadline = time.monotonic() + seconds
    while True:
        try:
            chunk = await asyncio.wait_for(iterator.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ProviderError(f"no first token within {seconds:.1f} s", retryable=True, code="latency_spike") \
                from None
        yield chunk
        if isinstance(chunk, TextChunk | ToolCallChunk):
            break
    async for chunk in iterator:
        yield chunk


class RoutedStream:
    """Streams one step through the chain. Text is yielded live (held back only for a frugal
    fast attempt); tool calls and the final chunk come once an attempt has succeeded."""

    def __init__(self, candidates: Sequence[Candidate], request: CompletionRequest, llm: LLMSettings, *,
                 first_token_deadline: float | None = None) -> None:
        if not candidates:
            raise InvalidInput("no candidate providers")
        self.candidates = list(candidates)
        # A routed step: a candidate with another behind it that sends nothing (no text, no
        # tool call) for this many seconds is a latency spike, and the next one answers.
        self.first_token_deadline = first_token_deadline
        self.request = request
        self.llm = llm
        self.attempts: list[Attempt] = []
        self.answered: Attempt | None = None
        self.text_streamed = False
        self._warned: set[str] = set()
        self._scrubbed: tuple[Message, ...] | None = None  # the conversation for off-network models, made once

    def request_for(self, provider: Provider, model: ModelInfo, *, fast: bool) -> CompletionRequest:
        config = self.llm.providers.get(provider.name) or ProviderSettings()
        system = self.request.system + (FRUGAL_HINT if fast else "")
        update = {"model": model.id, "max_tokens": config.max_tokens, "temperature": config.temperature,
                  "system": system}
        if self.llm.privacy.redact_secrets and provider.leaves_network(model.id):
            if self._scrubbed is None:
                self._scrubbed = scrubbed(self.request.messages)
            update["messages"] = self._scrubbed
        return self.request.model_copy(update=update)

    async def stream(self) -> AsyncIterator[StreamChunk]:
        """The step's answer. Three layers, each a small wrapper around the one below, the way
        a fallback model wraps models: ``stream`` fails over across the candidates, ``_frugal``
        tries a candidate's fast model before its full one, ``_call`` is one LLM call."""
        error: ProviderError | None = None
        for index, candidate in enumerate(self.candidates):
            if error is not None:
                yield WarningChunk(code="latency_spike" if error.code == "latency_spike" else "provider_failover",
                                   message=(f"{self.attempts[-1].spec} failed ({error.message}); "
                                            f"{candidate.first_spec} answers instead"))
            guarded = self.first_token_deadline is not None and index < len(self.candidates) - 1
            try:
                async for chunk in self._frugal(candidate, guarded=guarded):
                    yield chunk
                return
            except ProviderError as exc:
                if self.text_streamed or not can_fail_over(exc):
                    raise
                error = exc  # the next provider; a failing fast model says little good of its sibling
        assert error is not None
        raise error

    async def _frugal(self, candidate: Candidate, *, guarded: bool) -> AsyncIterator[StreamChunk]:
        """A candidate's answer: in frugal mode its fast model first, held back, then its full
        model when the fast one fails, runs out of tokens or asks for a stronger model."""
        if candidate.fast is not None:
            fast = _Call()
            try:
                async for chunk in self._call(candidate, candidate.fast, fast, held=True):
                    yield chunk
            except ProviderError as exc:  # the full model may well manage (a longer context, another pool)
                yield WarningChunk(code="frugal_escalation", message=(
                    f"{self.attempts[-1].spec} failed ({exc.message}); {candidate.spec} answers instead"))
            else:
                assert fast.done is not None
                text = "".join(fast.held)
                if fast.done.stop_reason != "max_tokens" and NEED_MORE_CONTEXT not in text:
                    if text:
                        self.text_streamed = True
                        yield TextChunk(text=text)
                    for chunk in fast.finish():
                        yield chunk
                    self.answered = fast.attempt
                    return
                why = "ran out of tokens" if fast.done.stop_reason == "max_tokens" else "asked for a stronger model"
                yield WarningChunk(code="frugal_escalation",
                                   message=f"{self.attempts[-1].spec} {why}; {candidate.spec} answers instead")
        full = _Call()
        async for chunk in self._call(candidate, candidate.model, full, guarded=guarded):
            yield chunk
        for chunk in full.finish():
            yield chunk
        self.answered = full.attempt

    async def _call(self, candidate: Candidate, model: ModelInfo, into: _Call, *, held: bool = False,
                    guarded: bool = False) -> AsyncIterator[StreamChunk]:
        """One LLM call: its text live (or ``held`` in ``into``, a frugal attempt), its tool calls
        and final chunk kept in ``into`` for the caller; billed and audited (an ``Attempt``)
        however it ends, cancelled included."""
        attempt = into.attempt = Attempt(provider=candidate.provider.name, model=model, fast=held)
        self.attempts.append(attempt)
        call_span = tracing.start("llm.call", {"llm.provider": attempt.provider, "llm.model": model.id,
                                               "llm.fast": held})
        try:
            stream = candidate.provider.stream(self.request_for(candidate.provider, model, fast=held))
            async with aclosing(stream) as chunks:  # type: ignore[type-var]
                if guarded and not held:
                    assert self.first_token_deadline is not None
                    chunks = _first_token_within(chunks, self.first_token_deadline)
                async for chunk in chunks:
                    if isinstance(chunk, UsageChunk):
                        attempt.usage = chunk.usage  # kept should the call fail or be cancelled
                        continue
                    if isinstance(chunk, TextChunk | ToolCallChunk) and attempt.first_token_ms is None:
                        attempt.first_token_ms = int((time.monotonic() - attempt.started) * 1000)
                    if isinstance(chunk, TextChunk):
                        attempt.text_chars += len(chunk.text)
                        if held:
                            if attempt.text_chars > self.llm.max_answer_chars:
                                # Held text is memory the step's own cap (kortex/turns/consume.py)
                                # never sees: a fast model that runs on escalates, like one that fails.
                                raise ProviderError(
                                    f"the answer passed {self.llm.max_answer_chars} characters (llm.max_answer_chars)",
                                    provider=attempt.provider, model=model.id, code="stream_invalid")
                            into.held.append(chunk.text)
                        else:
                            self.text_streamed = True
                            yield chunk
                    elif isinstance(chunk, ToolCallChunk):
                        into.calls.append(chunk)
                    elif isinstance(chunk, DoneChunk):
                        into.done = chunk
                    elif isinstance(chunk, WarningChunk) and chunk.code == "provider_retry":
                        attempt.retries += 1
                        yield chunk
                    elif isinstance(chunk, WarningChunk) and chunk.code in _ONCE_PER_STEP:
                        if chunk.code not in self._warned:
                            self._warned.add(chunk.code)
                            yield chunk
                    else:
                        yield chunk
            if into.done is None:
                raise ProviderError("the stream ended without a final chunk", retryable=True, code="stream_truncated")
        except ProviderError as exc:
            exc.provider, exc.model = exc.provider or attempt.provider, exc.model or model.id
            attempt.end(error=exc)
            _end_span(call_span, attempt, error=exc.code)
            raise
        except BaseException:  # cancelled (a step timeout, a lost lease): billed all the same
            attempt.end(error=ProviderError("cancelled", provider=attempt.provider, model=model.id, code="cancelled"))
            _end_span(call_span, attempt, error="cancelled")
            raise
        attempt.end(done=into.done)
        _end_span(call_span, attempt)


@dataclass(slots=True)
class _Call:
    """What one call leaves its caller: held text (frugal), tool calls and the final chunk,
    which come out only once the call has succeeded."""

    attempt: Attempt | None = None
    held: list[str] = field(default_factory=list)
    calls: list[ToolCallChunk] = field(default_factory=list)
    done: DoneChunk | None = None

    def finish(self) -> list[StreamChunk]:
        assert self.done is not None
        return [*self.calls, self.done]
