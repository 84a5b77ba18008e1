"""The one error tree of Kortex.

    KortexError
    ├── ConfigError             bad or missing configuration
    ├── NotFound                an id that does not exist for this tenant (never "exists elsewhere")
    ├── Conflict                the request clashes with current state (turn already running, ...)
    │   └── StaleAttempt        a step attempt that was superseded tried to write
    ├── InvalidInput            a caller sent something we reject (HTTP 4xx, CLI usage)
    ├── AuthError               missing, malformed, unknown or revoked credentials
    ├── Forbidden               valid credentials whose role does not allow the action
    ├── RateLimited             a rate or concurrency cap says not now
    │   └── BudgetExceeded      the tenant's daily spend or the session's tokens are used up
    ├── StorageError            the database failed in a way the caller cannot fix
    ├── StreamError             the event stream store failed
    │   └── StreamClosed        (kortex.stream.store) a write after the turn's ``done``
    ├── ProviderError           an LLM provider failed (status, provider, model, retryable)
    │   └── ProviderUnavailable the provider is not configured or not reachable in this mode
    └── ToolError               a tool failed; the pipeline turns it into an is_error result
        ├── ToolValidationError arguments do not match the tool's input model
        ├── ToolTimeout         the tool ran past its time limit
        ├── UpstreamError       the telemetry source behind the tool failed
        ├── ResultTooLarge      even trimmed, the result does not fit the output cap
        └── ToolNotFound        the tool exists nowhere in the catalog

Vendor exceptions (httpx, SQLAlchemy, redis) are translated at the boundary with
``raise ... from exc`` so callers only ever catch these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kortex.llm.base import TokenUsage


class KortexError(Exception):
    """Base of every error Kortex raises on purpose."""

    code: str = "internal"

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__
        if code is not None:
            self.code = code
        self.details = details


class ConfigError(KortexError):
    code = "config"


class NotFound(KortexError):
    code = "not_found"


class Conflict(KortexError):
    code = "conflict"


class StaleAttempt(Conflict):
    """The writer's step attempt is no longer the turn's: a later attempt has taken over."""

    code = "stale_attempt"


class InvalidInput(KortexError):
    code = "invalid_input"


class AuthError(KortexError):
    code = "unauthorized"


class Forbidden(KortexError):
    code = "forbidden"


class RateLimited(KortexError):
    """``retry_after``: seconds until the limit lets the caller in again, when known."""

    code = "rate_limited"

    def __init__(self, message: str = "", *, code: str | None = None, details: Any = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, code=code, details=details)
        self.retry_after = retry_after


class BudgetExceeded(RateLimited):
    code = "budget_exceeded"


class StorageError(KortexError):
    code = "storage"


class StreamError(KortexError):
    code = "stream"


class ProviderError(KortexError):
    """An LLM call failed. ``retryable`` drives retries and failover.

    ``message`` (and so ``str()``) is our own wording and may reach clients; what the vendor or
    the network said goes in ``detail``, for operators' logs only (vendor error texts quote key
    fragments, account ids and request ids). ``usage`` is what the vendor billed before the
    failure (the prompt is paid for even when the answer breaks off).
    """

    code = "provider"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        model: str = "",
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        code: str | None = None,
        detail: str = "",
        usage: TokenUsage | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.provider = provider
        self.model = model
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.detail = detail
        self.usage = usage

    def __str__(self) -> str:
        where = ":".join(p for p in (self.provider, self.model) if p)
        status = f" (HTTP {self.status})" if self.status else ""
        return f"{where + ': ' if where else ''}{self.message}{status}"


class ProviderUnavailable(ProviderError):
    code = "provider_unavailable"


class ToolError(KortexError):
    """Raised inside a tool; the pipeline converts it into an ``is_error`` result."""

    code = "internal"


class ToolValidationError(ToolError):
    code = "validation"


class ToolTimeout(ToolError):
    code = "timeout"


class UpstreamError(ToolError):
    code = "upstream"


class ResultTooLarge(ToolError):
    code = "result_too_large"


class ToolNotFound(ToolError):
    code = "policy_denied"
