"""The provider interface every LLM backend implements, and the types it speaks.

A provider turns a ``CompletionRequest`` into a stream of typed chunks: text deltas, whole
tool calls (fragments are assembled inside the adapter), warnings, running usage as the vendor
reports it, and one final ``DoneChunk`` with the stop reason and usage. Failures raise
``ProviderError``; nothing vendor-shaped leaks out.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kortex.errors import ProviderError
from kortex.messages import Message, ToolCall

Tier = Literal["fast", "balanced", "powerful"]
StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence", "error"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


#: characters of text a token comes to, roughly, where a vendor has not said (English prose and JSON)
CHARS_PER_TOKEN = 4

_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _tokens(chars: int) -> int:
    return -(-max(0, chars) // CHARS_PER_TOKEN)  # rounded up: a call that said anything cost something


class TokenUsage(_Frozen):
    """Billed tokens of one call. The cache counts are parts of ``input_tokens`` (vendors bill
    prompt-cache reads and writes at their own prices). ``estimated``: some count is our guess
    (``estimate``), not the vendor's, e.g. from a server that reported no usage."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    estimated: bool = False

    @classmethod
    def estimate(cls, *, input_chars: int = 0, output_chars: int = 0) -> TokenUsage:
        """What a call the vendor reported no usage for is billed: its characters at
        ``CHARS_PER_TOKEN``, so budgets and cost ceilings see it instead of a free call."""
        return cls(input_tokens=_tokens(input_chars), output_tokens=_tokens(output_chars), estimated=True)

    def most(self, other: TokenUsage | None) -> TokenUsage:
        """The larger count of each kind (running counts only grow; a retry's are added elsewhere)."""
        if other is None:
            return self
        # Estimated only where a guess is what stands: a reported count at least as large wins.
        guessed = any((getattr(self, k) > getattr(other, k) and self.estimated)
                      or (getattr(other, k) > getattr(self, k) and other.estimated) for k in _COUNTS)
        return TokenUsage(**{k: max(getattr(self, k), getattr(other, k)) for k in _COUNTS}, estimated=guessed)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(**{k: getattr(self, k) + getattr(other, k) for k in _COUNTS},
                          estimated=self.estimated or other.estimated)


class ModelInfo(_Frozen):
    """One model a provider offers. Prices are USD per million tokens; a cache price of None
    means cached input costs the full input price."""

    id: str
    display_name: str = ""
    context_tokens: int = 128_000
    tier: Tier = "balanced"
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    cache_read_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None
    supports_tools: bool = True
    #: an id only a caller named (allow_unlisted_models), not the catalogue or configuration:
    #: metrics count it under "unlisted", as callers can name any number of them
    caller_named: bool = False

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return self.cost_of(TokenUsage(input_tokens=input_tokens, output_tokens=output_tokens))

    def cost_of(self, usage: TokenUsage) -> float:
        full = self.input_usd_per_mtok
        read = min(max(0, usage.cache_read_tokens), usage.input_tokens)
        write = min(max(0, usage.cache_write_tokens), usage.input_tokens - read)
        plain = usage.input_tokens - read - write
        read_price = full if self.cache_read_usd_per_mtok is None else self.cache_read_usd_per_mtok
        write_price = full if self.cache_write_usd_per_mtok is None else self.cache_write_usd_per_mtok
        total = plain * full + read * read_price + write * write_price + usage.output_tokens * self.output_usd_per_mtok
        return round(total / 1_000_000, 8)


class ToolSchema(_Frozen):
    """A tool as the model sees it: name, description and JSON Schema of the arguments."""

    name: str
    description: str
    input_schema: dict[str, Any]


class CompletionRequest(_Frozen):
    model: str | None = None  # provider's model id; None means the provider's default
    system: str = ""
    messages: tuple[Message, ...] = ()
    tools: tuple[ToolSchema, ...] = ()
    max_tokens: int = 4096
    temperature: float = 0.2
    stop: tuple[str, ...] = ()
    metadata: dict[str, str] = Field(default_factory=dict)  # tenant_id, session_id, purpose


class TextChunk(_Frozen):
    type: Literal["text"] = "text"
    text: str


class ToolCallChunk(_Frozen):
    type: Literal["tool_call"] = "tool_call"
    call: ToolCall


#: codes of the warnings providers and the router emit; published as ``error`` events that do
#: not end the turn (clients show them as notices)
WARNING_CODES = frozenset({"provider_failover", "provider_retry", "frugal_escalation", "pseudo_tools"})


class WarningChunk(_Frozen):
    """Something the operator should see (e.g. pseudo-tool fallback); not part of the answer."""

    type: Literal["warning"] = "warning"
    code: str
    message: str


class UsageChunk(_Frozen):
    """Tokens billed so far in this call (running totals), sent as the vendor reports them, so
    a call that fails or is cancelled before its ``DoneChunk`` is still costed. Not part of the
    answer: the router keeps it and passes nothing on."""

    type: Literal["usage"] = "usage"
    usage: TokenUsage


class DoneChunk(_Frozen):
    type: Literal["done"] = "done"
    stop_reason: StopReason = "end_turn"
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""


StreamChunk = Annotated[TextChunk | ToolCallChunk | WarningChunk | UsageChunk | DoneChunk,
                        Field(discriminator="type")]


class Completion(_Frozen):
    """A whole (non-streamed) answer."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    stop_reason: StopReason = "end_turn"
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""


class Provider(abc.ABC):
    """An LLM backend. Implementations are safe to share between concurrent tasks."""

    #: stable identifier used in configuration and model specs ("anthropic", "offline", ...)
    name: str = ""
    #: True for a server the operator runs (Ollama), not a vendor's cloud; whether a given
    #: request stays on the operator's network is ``leaves_network``'s to say
    local: bool = False
    #: True for providers that are not an LLM (offline analyst, scripted); labelled as such
    synthetic: bool = False

    @abc.abstractmethod
    def models(self) -> Sequence[ModelInfo]:
        """Models on offer; the first is the default."""

    @abc.abstractmethod
    def stream(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        """Stream one completion. Ends with exactly one ``DoneChunk``; raises ``ProviderError``."""

    def leaves_network(self, model_id: str | None = None) -> bool:
        """Whether requests for ``model_id`` are served off the operator's network (None: the
        provider's requests whatever the model), which decides whether the conversation is
        scrubbed of credentials first and whether local-only mode refuses them. A model, not
        a provider, is the unit: a local server may hand some models on to a vendor."""
        return not (self.local or self.synthetic)

    @property
    def supports_tools(self) -> bool:
        return True

    @property
    def supports_streaming(self) -> bool:
        return True

    def default_model(self) -> ModelInfo:
        models = self.models()
        if not models:
            raise ProviderError("no models configured", provider=self.name)
        return models[0]

    def model_info(self, model_id: str | None) -> ModelInfo:
        if not model_id:
            return self.default_model()
        for model in self.models():
            if model.id == model_id:
                return model
        return self.unknown_model(model_id)

    def fast_model(self) -> ModelInfo | None:
        """The cheap model frugal mode tries first; None when the provider has no such tier."""
        return None

    def unknown_model(self, model_id: str) -> ModelInfo:
        """A model not in the catalogue: providers that accept any id (Ollama) override this."""
        raise ProviderError(f"unknown model {model_id!r}", provider=self.name, model=model_id)

    def max_context_tokens(self, model_id: str | None = None) -> int:
        return self.model_info(model_id).context_tokens

    async def complete(self, request: CompletionRequest) -> Completion:
        text: list[str] = []
        calls: list[ToolCall] = []
        done = DoneChunk()
        async for chunk in self.stream(request):
            if isinstance(chunk, TextChunk):
                text.append(chunk.text)
            elif isinstance(chunk, ToolCallChunk):
                calls.append(chunk.call)
            elif isinstance(chunk, DoneChunk):
                done = chunk
        return Completion(text="".join(text), tool_calls=tuple(calls), stop_reason=done.stop_reason,
                          usage=done.usage, model=done.model)

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections. Called once when the process shuts down."""
