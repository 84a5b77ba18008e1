"""What a failed provider call is called: one client-safe sentence per error code.

Vendor and network texts quote key fragments, account and request ids; they go in
``ProviderError.detail`` (scrubbed, bounded) for operators' logs, never into the message that
reaches a client's event stream or a turn's error.
"""

from __future__ import annotations

from kortex.errors import ProviderError
from kortex.llm.base import TokenUsage
from kortex.redaction import scrub_text

MAX_DETAIL = 500

MESSAGES: dict[str, str] = {
    "provider_auth": "the provider rejected the API key",
    "rate_limited": "the provider is rate limiting requests",
    "provider_overloaded": "the provider is overloaded",
    "provider_server_error": "the provider had a server error",
    "provider_not_found": "the provider does not know this model or endpoint",
    "provider_rejected": "the provider rejected the request",
    "provider_stream_error": "the provider reported an error while answering",
    "connect_failed": "cannot connect to the provider",
    "read_timeout": "the provider stopped sending",
    "stream_interrupted": "the connection to the provider broke",
    "stream_truncated": "the provider's answer ended early",
    "stream_invalid": "the provider sent a malformed response",
    "request_invalid": "the request could not be sent to the provider (check its configuration)",
    "unknown_model": "this provider does not offer that model",
    "provider": "the provider call failed",
}


def failure(code: str, *, detail: str = "", provider: str = "", model: str = "", status: int | None = None,
            retryable: bool = False, retry_after: float | None = None,
            usage: TokenUsage | None = None) -> ProviderError:
    """A ``ProviderError`` whose message is ours; ``detail`` is scrubbed and cut here."""
    return ProviderError(MESSAGES.get(code, MESSAGES["provider"]), code=code, detail=clean_detail(detail),
                         provider=provider, model=model, status=status, retryable=retryable,
                         retry_after=retry_after, usage=usage)


def clean_detail(text: str) -> str:
    return scrub_text(" ".join(text.split()))[:MAX_DETAIL]
