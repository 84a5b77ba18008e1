"""What a failed provider call is called: one client-safe sentence per error code, and how
transport failures and error statuses become such failures.

Translation (here for httpx; ``kortex/llm/transport.py`` does the same for aiohttp, the default
``llm.http_transport``)::

    connect error / connect or pool timeout  -> code "connect_failed",     retryable
    read timeout                             -> code "read_timeout",       retryable
    reset, incomplete body, remote protocol  -> code "stream_interrupted", retryable
    request we cannot send (bad header, URL) -> code "request_invalid",    not retryable
    HTTP 408/409/429/5xx/529                 -> retryable, Retry-After kept (not 501/505:
                                                those fail over to the next provider only)
    HTTP 402, or a 429 saying the account's   -> code "provider_quota", not retryable (the key
    quota or credit is spent                    gets the same answer until someone pays); fails over
    other HTTP 4xx                           -> not retryable (auth, bad request, unknown model)

Vendor and network texts quote key fragments, account and request ids; they go in
``ProviderError.detail`` (scrubbed, bounded) for operators' logs, never into the message that
reaches a client's event stream or a turn's error. Scrubbing by pattern misses a key of no known
shape (``corp-llm-7f3a...``), and vendors do echo the key they refused: the credentials a
request carried (``request_secrets``) are taken out literally as well, before any cut.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import httpx

from kortex.errors import ProviderError
from kortex.llm.base import TokenUsage
from kortex.llm.retry import RETRYABLE_STATUS, parse_retry_after
from kortex.redaction import request_secrets, scrub_text, without_secrets

MAX_DETAIL = 500
MAX_ERROR_BODY = 16 * 1024
_CODES = {401: "provider_auth", 403: "provider_auth", 404: "provider_not_found", 429: "rate_limited",
          529: "provider_overloaded", 503: "provider_overloaded", 402: "provider_quota"}
#: error types or codes in a vendor's body that mean the account, not the moment: OpenAI sends
#: its spent quota as a 429 like a rate limit, and a retry only spends the turn's time
_QUOTA_KINDS = frozenset({"insufficient_quota", "billing_error", "billing_hard_limit_reached"})

MESSAGES: dict[str, str] = {
    "provider_auth": "the provider rejected the API key",
    "rate_limited": "the provider is rate limiting requests",
    "provider_quota": "the provider account has no quota or credit left",
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
            usage: TokenUsage | None = None, secrets: Iterable[str] = ()) -> ProviderError:
    """A ``ProviderError`` whose message is ours; ``detail`` is scrubbed (``secrets`` literally,
    then by pattern) and cut here."""
    return ProviderError(MESSAGES.get(code, MESSAGES["provider"]), code=code,
                         detail=clean_detail(detail, secrets), provider=provider, model=model, status=status,
                         retryable=retryable, retry_after=retry_after, usage=usage)


def clean_detail(text: str, secrets: Iterable[str] = ()) -> str:
    return scrub_text(without_secrets(" ".join(text.split()), secrets))[:MAX_DETAIL]


def transport_error(exc: httpx.HTTPError, provider: str, model: str) -> ProviderError:
    """Never the request in the text: a protocol error quotes the header it refused, and headers
    carry the API key. Only network errors keep their text (addresses, errno) as detail."""
    name = exc.__class__.__name__
    if isinstance(exc, httpx.LocalProtocolError | httpx.UnsupportedProtocol):
        # Our request cannot be sent as it is (a bad header value, a bad URL scheme): trying
        # again sends the same thing.
        return failure("request_invalid", provider=provider, model=model, detail=name)
    if isinstance(exc, httpx.ProtocolError):
        return failure("stream_interrupted", provider=provider, model=model, retryable=True, detail=name)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        code = "connect_failed"
    elif isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        code = "read_timeout"
    elif isinstance(exc, httpx.TransportError):
        code = "stream_interrupted"
    else:
        return failure("provider", provider=provider, model=model, detail=name)
    text = str(exc).strip()
    return failure(code, provider=provider, model=model, retryable=True, detail=f"{name}: {text}" if text else name)


async def status_error(response: httpx.Response, provider: str, model: str) -> ProviderError:
    body = bytearray()
    try:
        async for part in response.aiter_bytes():
            body += part
            if len(body) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    try:
        sent = request_secrets(response.request.headers)
    except RuntimeError:  # a response made without a request (none of ours)
        sent = ()
    return status_failure(response.status_code, response.reason_phrase, response.headers,
                          bytes(body[:MAX_ERROR_BODY]), provider, model, secrets=sent)


def status_failure(status: int, reason: str, headers: Mapping[str, str], body: bytes, provider: str,
                   model: str, *, secrets: Iterable[str] = ()) -> ProviderError:
    """An HTTP error status as a ``ProviderError``, whichever client read it; ``headers`` must
    be case-insensitive (httpx's and aiohttp's are). ``secrets``: the credentials the request
    sent (``request_secrets``), which a vendor's error text may quote back."""
    secrets = tuple(secrets)
    detail = vendor_message(body, secrets) or reason or "error"
    retryable = status in RETRYABLE_STATUS
    code = _CODES.get(status) or ("provider_server_error" if status >= 500 else "provider_rejected")
    if status < 500 and vendor_kinds(body) & _QUOTA_KINDS:
        code, retryable = "provider_quota", False
    elif code == "provider_quota":
        retryable = False
    return failure(code, provider=provider, model=model, status=status, retryable=retryable, detail=detail,
                   retry_after=parse_retry_after(headers) if retryable else None, secrets=secrets)


def vendor_kinds(body: bytes) -> frozenset[str]:
    """The error ``type`` and ``code`` a vendor's JSON error body names (OpenAI sends both,
    Anthropic a type); empty when the body is no such JSON."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return frozenset()
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        return frozenset()
    return frozenset(v for v in (error.get("type"), error.get("code")) if isinstance(v, str))


def vendor_message(body: bytes, secrets: Iterable[str] = ()) -> str:
    """The human part of a vendor's error body (Anthropic ``error.message``, OpenAI
    ``error.message``, Ollama ``error``), bounded; ``secrets`` are taken out before the cut, which
    could otherwise leave the start of one."""
    # as sent, and as a JSON body would spell them ("\\" and '"' escaped, "/" by some servers)
    secrets = tuple({*secrets, *(json.dumps(s)[1:-1] for s in secrets),
                     *(json.dumps(s)[1:-1].replace("/", "\\/") for s in secrets)})

    def bounded(part: str) -> str:
        return without_secrets(part, secrets)[:300]

    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return bounded(text)
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            kind, message = error.get("type"), error.get("message")
            if isinstance(message, str):
                return bounded(f"{kind}: {message}" if isinstance(kind, str) and kind else message)
        elif isinstance(error, str):
            return bounded(error)
    return bounded(text)
