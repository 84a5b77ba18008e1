"""The retrying provider the HTTP vendors share (``HTTPProvider``): the models on offer, and
``stream``, which tries one streamed call again on retryable failures while nothing has been
produced; and the one stream-reading loop of the SSE vendors (``SSEProvider``: Anthropic,
OpenAI): post, read server-sent events, hand each to the vendor's decoder, stop at its end.
The wire client is ``kortex/llm/vendor.py``; failures are named in ``kortex/llm/failures.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm import catalog
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
from kortex.llm.failures import failure
from kortex.llm.retry import RetryPolicy
from kortex.llm.vendor import VendorClient, drain
from kortex.llm.wire import sse_events
from kortex.redaction import without_secrets

log = logging.getLogger(__name__)

sleep = asyncio.sleep  # the backoff wait (tests record it instead of waiting)


class HTTPProvider(Provider):
    """A provider reached over HTTP: ``stream`` retries ``_stream_once`` on retryable failures
    while nothing has been produced yet (a retry after output would repeat it).

    The models on offer are the vendor's catalogue (``catalogue``) with configured prices, plus
    the configured ``model``/``fast_model`` and priced ids; ``problems`` says what is wrong with
    the configuration without making the provider unusable (shown by ``/v1/llm/providers``).
    """

    catalogue: tuple[ModelInfo, ...] = ()

    def __init__(self, name: str, config: ProviderSettings, settings: Settings) -> None:
        self.name = name
        self.config = config
        self.settings = settings
        # The credentials this provider sends, taken out of every failure's detail before it is
        # logged or raised (a vendor echoes the key it refused, whatever its shape). A vendor
        # whose key comes from elsewhere, or that sends more, sets them from its headers.
        key = config.api_key.get_secret_value().strip() if config.api_key else ""
        self.secrets: tuple[str, ...] = (key,) if key else ()
        self.retry = RetryPolicy.of(config)
        if config.model and not catalog.valid_id(config.model):
            raise ProviderUnavailable("model is not a valid model id (printable characters, no spaces)",
                                      provider=name, code="provider_config")
        self._models: tuple[ModelInfo, ...] = ()
        self.problems: list[str] = []
        if self.catalogue:  # a vendor with a price list (Ollama lists what its server has)
            self._models, self.problems = catalog.offered(self.catalogue, config)
        for problem in self.problems:
            log.warning("llm.providers.%s: %s", name, problem)

    def models(self) -> Sequence[ModelInfo]:
        return self._models

    def fast_model(self) -> ModelInfo | None:
        fast = catalog.fast_model(self.models(), self.config)
        if not fast:
            return None
        try:
            return self.model_info(fast)
        except ProviderError:  # a fast model the provider cannot use means no fast model, not no provider
            return None

    def unknown_model(self, model_id: str) -> ModelInfo:
        if self.config.allow_unlisted_models:
            # The operator allowed any id: priced from configuration, else free (documented).
            return catalog.unlisted(model_id, self.config).model_copy(update={"caller_named": True})
        # The id is the caller's own input (checked printable and short before it gets here).
        raise ProviderError(f"model {model_id!r} is not offered by {self.name}", provider=self.name,
                            model=model_id, code="unknown_model",
                            detail="not in the catalogue, model, fast_model or prices; allow_unlisted_models "
                                   "accepts any id")

    async def _stream_once(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        raise NotImplementedError
        yield  # pragma: no cover - marks this as an async generator

    async def stream(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        retry, waited = 0, 0.0
        spent = TokenUsage()  # billed to tries that failed and were tried again
        warned: set[tuple[str, str]] = set()  # a warning is said once, not once per try
        while True:
            produced = done = False
            running = TokenUsage()
            try:
                async with aclosing(self._stream_once(request)) as chunks:
                    async for chunk in chunks:
                        if isinstance(chunk, UsageChunk):
                            running = chunk.usage
                            yield UsageChunk(usage=spent + running)
                            continue
                        if isinstance(chunk, WarningChunk):
                            if (chunk.code, chunk.message) in warned:
                                continue
                            warned.add((chunk.code, chunk.message))
                        elif isinstance(chunk, DoneChunk):
                            done = True
                            chunk = chunk.model_copy(update={"usage": spent + chunk.usage})
                        elif isinstance(chunk, TextChunk | ToolCallChunk):
                            produced = True
                        yield chunk
                return
            except ProviderError as exc:
                error, cause = exc, exc.__cause__
            except Exception as exc:  # a frame no check foresaw, or a bug: still this provider's failure
                if not done:
                    log.exception("%s: unexpected failure while streaming", self.name)
                error = failure("stream_invalid", detail=f"{exc.__class__.__name__}: {exc}", secrets=self.secrets)
                cause = exc
            if done:  # the answer and its usage are whole; what broke afterwards changes nothing
                log.debug("%s: ignored after the final chunk: %s", self.name, error.code)
                return
            # Failures made where the key is not known (a decoder reading an in-stream error)
            # are cleaned here, before anything logs or keeps them.
            error.detail = without_secrets(error.detail, self.secrets)
            error.provider = error.provider or self.name
            error.model = error.model or request.model or ""
            error.usage = spent + running.most(error.usage)
            wait = None if produced or not error.retryable else self.retry.next_wait(retry, error.retry_after, waited)
            if wait is None:
                log.warning("%s:%s failed: %s (%s)", self.name, error.model, error.code, error.detail or error.message)
                raise error from cause
            log.warning("%s:%s: %s (%s); retry %d in %.2fs", self.name, error.model, error.code,
                        error.detail or error.message, retry + 1, wait)
            # Nothing was produced yet: the client hears why it waits, the router counts it.
            status = f" (HTTP {error.status})" if error.status else ""
            yield WarningChunk(code="provider_retry", message=(
                f"{self.name}:{error.model} failed with {error.code}{status}; retry {retry + 1} in {wait:.1f}s"))
            await sleep(wait)
            spent = error.usage
            waited += wait
            retry += 1

    async def aclose(self) -> None:
        http: VendorClient | None = getattr(self, "http", None)
        if http is not None:
            await http.aclose()


class Decoder(Protocol):
    """A vendor's reading of one stream: events in, our chunks out."""

    finished: bool
    usage: TokenUsage

    def feed(self, event: Any) -> Iterable[StreamChunk]: ...

    def at_end(self) -> Iterable[StreamChunk]:
        """The body ended before the vendor's final event: the last chunks, or a failure."""
        ...


class SSEProvider(HTTPProvider):
    """A vendor that streams server-sent events: the loop is here once, the reading of the
    events in its ``Decoder``."""

    http: VendorClient
    path: str

    def body(self, request: CompletionRequest) -> dict[str, Any]:
        raise NotImplementedError

    def decoder(self, model: str) -> Decoder:
        raise NotImplementedError

    async def _stream_once(self, request: CompletionRequest) -> AsyncGenerator[StreamChunk, None]:
        model = request.model or self.default_model().id
        decoder = self.decoder(model)
        async with self.http.post_stream(self.path, self.body(request), model=model) as response:
            async with aclosing(sse_events(response.aiter_bytes())) as events:
                async for event in events:
                    for chunk in decoder.feed(event):
                        yield chunk
                    if decoder.finished:
                        await drain(events)  # briefly: the connection is reused only if the body ends
                        return
        for chunk in decoder.at_end():
            yield chunk

