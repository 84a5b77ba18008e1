"""The one path every tool call takes:

    lookup -> policy (deny by default) -> arguments (JSON, then the input model)
           -> run with the tool's timeout (progress note past the interim threshold)
           -> redact (allowlist + secret scrub) -> cap output -> audit entry -> ToolResult

The cap measures what the model receives: redaction can lengthen strings (``pwd=a`` becomes
``pwd=[REDACTED]``), so capping first could let a result through at several times the cap.

Nothing raises out of ``ToolPipeline.run``: every failure is an ``is_error`` result with a
code (``policy_denied``, ``invalid_json``, ``validation``, ``not_found``, ``timeout``,
``upstream``, ``result_too_large``, ``internal``) and a message the model can act on (a long
one cut, with ``truncated``, so an error fits the output cap like any result). Every
tool fails in the shape of llm-ops-agent-tools.md, with the pipeline's code beside it:

    {"error": true, "message": "...", "code": "NOT_FOUND" | "INVALID_PARAMETER" | ...,
     "error_code": "<error_code>"}

except a timeout, which keeps rfc-005 §6.1's shape (plus the same message and code):

    {"error": "tool_timeout", "elapsed": "5m1s", "tool": "get_logs", "message": "...", "code": "TIMEOUT"}

    error_code        code                  raised as
    validation        INVALID_PARAMETER     pydantic ValidationError, InvalidInput
    invalid_json      INVALID_PARAMETER     arguments that are not a JSON object
    not_found         NOT_FOUND             NotFound (an id that does not exist for this tenant)
    upstream          DATABASE_ERROR        StorageError (the embedded store failed)
    upstream          UPSTREAM_ERROR        UpstreamError (Prometheus, Loki, ... failed)
    timeout           TIMEOUT               the tool ran past its timeout
    result_too_large  RESULT_TOO_LARGE      ResultTooLarge (even trimmed, it does not fit the cap; or it
                                            nests deeper than ``MAX_RESULT_DEPTH``)
    policy_denied     POLICY_DENIED         unknown tool, or not allowed in this session
    internal          INTERNAL_ERROR        a bug in the tool (a result JSON cannot encode is one)

A result must also be one that can be stored and published, or its call would never end (the
tool task would fail storing it, and the call would wait for the watchdog's timeout answer):
see ``_encodable``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kortex.errors import InvalidInput, NotFound, ResultTooLarge, StorageError, ToolError, ToolTimeout, UpstreamError
from kortex.messages import ToolCall, ToolResult
from kortex.nesting import MAX_DEPTH, deeper_than
from kortex.redaction import scrub, scrub_text
from kortex.storage.audit import AuditEntry
from kortex.storage.db import statements_until
from kortex.tools.capping import cap_result, encoded_size
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry
from kortex.tools.spec import ToolContext, ToolSpec

log = logging.getLogger(__name__)

ProgressHook = Callable[[ToolCall, int], None]

#: the llm-ops-agent-tools.md code of each pipeline error code
SPEC_CODES: dict[str, str] = {
    "validation": "INVALID_PARAMETER",
    "invalid_json": "INVALID_PARAMETER",
    "not_found": "NOT_FOUND",
    "upstream": "UPSTREAM_ERROR",
    "timeout": "TIMEOUT",
    "result_too_large": "RESULT_TOO_LARGE",
    "policy_denied": "POLICY_DENIED",
    "internal": "INTERNAL_ERROR",
}


def _format_elapsed(seconds: float) -> str:
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{seconds:.1f}s"


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:8]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


#: seconds after a call's deadline at which the database stops its queries (see _run_with_timeout)
DB_GRACE = 0.25

#: characters of an error message the model gets: enough to act on; upstream errors can quote
#: whole responses (a Prometheus error string of megabytes), which bypassed the output cap
MAX_ERROR_CHARS = 2000
#: characters of a longer message scrubbed before the cut, so scrubbing costs the same however
#: much the upstream sent. The last ``_SCRUB_EDGE`` of them are dropped as well: a secret cut at
#: the window's edge (half a private key) may not look like one to the scrubber
_SCRUB_WINDOW = 64 * 1024
_SCRUB_EDGE = 16 * 1024
_CUT = "…[truncated]"

#: how deep a tool's result may nest. The result travels inside envelopes a few levels deep (a
#: ``tool_result`` event, a message row, the outbox), and pydantic writes at most about 254 levels
#: of JSON and reads back at most 200; 128 leaves room under both. Four times ingest's
#: ``MAX_DEPTH``, so a tool may wrap telemetry at its deepest in a structure of its own (a
#: get_traces page: 32 levels of spans, two levels each, then their tags).
MAX_RESULT_DEPTH = 4 * MAX_DEPTH


def _unchanged(text: str) -> str:
    return text


def _error_message(message: str, cap_bytes: int, forget: Callable[[str], str] = _unchanged) -> tuple[str, bool]:
    """``message`` without the credentials ``forget`` knows, scrubbed and bounded so an error
    result fits in ``cap_bytes`` of JSON; and whether it was cut. At most 6 bytes a character
    once encoded (a control character's ``\\uXXXX``), so an eighth of the cap in characters
    leaves room for the other fields."""
    limit = min(MAX_ERROR_CHARS, cap_bytes // 8)
    cut = len(message) > _SCRUB_WINDOW
    text = scrub_text(forget(message[:_SCRUB_WINDOW]))
    if cut:
        text = text[:max(0, len(text) - _SCRUB_EDGE)]
    if len(text) > limit:
        text, cut = text[:limit], True
    return (text + _CUT, True) if cut else (text, False)


def _encodable(spec: ToolSpec, content: dict[str, Any]) -> None:
    """Raise unless ``content`` can be stored and published (its depth is checked before). The
    database encodes it by json's rules, so no datetimes, bytes or other objects (SQLAlchemy and
    psycopg call ``json.dumps``), and PostgreSQL's jsonb refuses NaN and Infinity; pydantic, which
    publishes it, refuses a lone surrogate (which ``json.dumps`` escapes), as UTF-8 does."""
    try:
        json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # ValueError: NaN, a circular reference, a surrogate
        raise _unencodable(spec, exc) from None


def _unencodable(spec: ToolSpec, exc: Exception) -> ToolError:
    log.error("tool %s returned a result that cannot be encoded as JSON: %s", spec.name, exc)
    return ToolError(f"the {spec.name} tool returned a result that cannot be encoded as JSON "
                     "(an internal error); other tools still work")


class ToolPipeline:
    def __init__(
        self,
        registry: ToolRegistry,
        policy: ToolPolicy,
        *,
        result_cap_bytes: int = 64 * 1024,
        timeouts: dict[str, float] | None = None,
        progress_after: float = 30.0,
        max_stuck: int = 32,
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.result_cap_bytes = result_cap_bytes
        self.timeouts = dict(timeouts or {})
        self.progress_after = progress_after
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        self._stuck = 0

    @property
    def stuck_calls(self) -> int:
        """Calls answered with a timeout whose threads are still running."""
        with self._lock:
            return self._stuck

    def close(self) -> None:
        """Nothing to release: call threads are daemons that end with their sources' deadlines."""

    def timeout_for(self, spec: ToolSpec) -> float:
        return spec.timeout(self.timeouts.get(spec.name))

    def limits_for(self, name: str) -> tuple[float, float]:
        """(timeout, hard ceiling) for a tool name; unknown tools get the smallest category."""
        spec = self.registry.get(name)
        if spec is None:
            return 5.0, 30.0
        return self.timeout_for(spec), spec.limits.max_timeout

    def run(
        self,
        call: ToolCall,
        ctx: ToolContext,
        *,
        policy: ToolPolicy | None = None,
        audit: list[AuditEntry] | None = None,
        on_progress: ProgressHook | None = None,
    ) -> ToolResult:
        started = time.monotonic()
        policy = policy or self.policy
        spec = self.registry.get(call.name)
        args: Any = None
        try:
            if spec is None or policy.decide(spec) != "allow":
                # Unknown and disallowed look alike: the model learns nothing about hidden tools.
                return self._finish(call, ctx, spec, started, audit, error=(
                    "policy_denied", f"tool {call.name!r} is not available in this session"))
            if call.arguments_error:
                return self._finish(call, ctx, spec, started, audit, error=(
                    "invalid_json", "Invalid tool arguments JSON: send a JSON object matching the schema"))
            try:
                args = spec.input_model.model_validate(call.arguments)
            except ValidationError as exc:
                return self._finish(call, ctx, spec, started, audit,
                                    error=("validation", _validation_message(exc)))
            timeout = self.timeout_for(spec)
            ctx.result_cap_bytes = self.result_cap_bytes
            ctx.deadline = time.monotonic() + timeout
            raw = self._run_with_timeout(spec, args, ctx, timeout, call, on_progress)
            return self._shape(call, ctx, spec, started, audit, raw, args)
        except ToolTimeout:
            elapsed = time.monotonic() - started
            return self._finish(call, ctx, spec, started, audit, error=("timeout", "tool timed out"),
                                content={"error": "tool_timeout", "elapsed": _format_elapsed(elapsed),
                                         "tool": call.name, "code": "TIMEOUT",
                                         "message": f"{call.name} did not finish within "
                                                    f"{_format_elapsed(elapsed)}; narrow the query or try later"})
        except InvalidInput as exc:
            return self._finish(call, ctx, spec, started, audit, error=("validation", exc.message))
        except NotFound as exc:
            return self._finish(call, ctx, spec, started, audit, error=("not_found", exc.message))
        except StorageError:
            log.warning("tool %s: storage failed (call %s)", call.name, call.id, exc_info=True)
            return self._finish(call, ctx, spec, started, audit, error=("upstream", "the telemetry store failed"),
                                spec_code="DATABASE_ERROR")
        except UpstreamError as exc:
            return self._finish(call, ctx, spec, started, audit, error=("upstream", exc.message))
        except ToolError as exc:
            return self._finish(call, ctx, spec, started, audit, error=(exc.code, exc.message))
        except Exception:  # a bug in a tool must not end the turn
            log.exception("tool %s failed (call %s)", call.name, call.id)
            return self._finish(call, ctx, spec, started, audit, error=("internal", "internal error"))

    def _shape(self, call: ToolCall, ctx: ToolContext, spec: ToolSpec, started: float,
               audit: list[AuditEntry] | None, raw: Any, args: Any) -> ToolResult:
        if not isinstance(raw, dict):
            raise TypeError(f"tool {spec.name} returned {type(raw).__name__}, not a dict")
        if deeper_than(raw, MAX_RESULT_DEPTH):
            # Telemetry stored before ingest bounded its depth, or a structure a tool built: the
            # data, not the tool, is at fault, and the model can still ask for other records.
            raise ResultTooLarge(
                f"the result nests deeper than {MAX_RESULT_DEPTH} levels, more than a tool result can carry: "
                "the records it read are nested too deeply to return; ask for other records or a narrower query")
        # Redact first, cap what is left; private paging keys ride along for on_truncate.
        redacted = spec.allowlist.apply(raw)
        private = {k: v for k, v in raw.items() if isinstance(k, str) and k.startswith("_")}
        try:
            capped, truncated = cap_result({**redacted, **private}, spec, self.result_cap_bytes, args, ctx)
        except UnicodeEncodeError as exc:  # measuring its size encodes it: a lone surrogate
            raise _unencodable(spec, exc) from None
        content = {k: v for k, v in capped.items() if not (isinstance(k, str) and k.startswith("_"))}
        if truncated:
            content["truncated"] = True
        truncated = truncated or content.get("truncated") is True  # the tool's own cap counts too
        _encodable(spec, content)
        return self._finish(call, ctx, spec, started, audit, content=content, truncated=truncated)

    def recover(self, call: ToolCall, ctx: ToolContext, *, audit: list[AuditEntry] | None = None) -> ToolResult | None:
        """The result of a call whose worker died after its effect was stored (a proposal
        written, its result lost): the tool's ``recover`` hook finds it, and it goes through the
        same redaction, cap and audit as a live result. None when the tool has no hook or
        nothing was stored; the caller then answers with a timeout."""
        spec = self.registry.get(call.name)
        if spec is None or spec.recover is None:
            return None
        started = time.monotonic()
        try:
            raw = spec.recover(ctx)
            return None if raw is None else self._shape(call, ctx, spec, started, audit, raw, None)
        except Exception:  # recovery is best effort: the timeout answer still stands
            log.exception("recovering %s (call %s) failed", call.name, call.id)
            return None

    def _run_with_timeout(
        self, spec: ToolSpec, args: Any, ctx: ToolContext, timeout: float, call: ToolCall,
        on_progress: ProgressHook | None,
    ) -> Any:
        # One fresh thread per call rather than a shared pool: a pool's queue wait would count
        # against the timeout, and threads stuck past their timeout (a thread cannot be killed)
        # would starve every later call. Stuck threads are counted instead, and past
        # ``max_stuck`` new calls fail fast rather than pile up behind a hung upstream.
        with self._lock:
            if self._stuck >= self.max_stuck:
                raise UpstreamError(
                    f"{self._stuck} earlier tool calls are still stuck past their timeouts; "
                    "the telemetry sources look hung, try again later")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        state = {"abandoned": False}

        def target() -> None:
            try:
                # The telemetry database stops the call's queries just after its deadline: at the
                # same instant, the cancelled query raced the pipeline's own timeout, and a call
                # that merely ran out of time was now and then reported as an upstream error.
                with statements_until(deadline + DB_GRACE):
                    future.set_result(spec.run(args, ctx))
            except BaseException as exc:  # handed to the caller, which sorts errors out
                future.set_exception(exc)
            finally:
                with self._lock:
                    if state["abandoned"]:
                        self._stuck -= 1
                    state["abandoned"] = False  # a late finish is no longer stuck

        deadline = time.monotonic() + timeout
        threading.Thread(target=target, name=f"kortex-tool-{spec.name}", daemon=True).start()
        try:
            if on_progress is not None and self.progress_after < timeout:
                try:
                    return future.result(self.progress_after)
                except concurrent.futures.TimeoutError:
                    try:
                        on_progress(call, int(self.progress_after * 1000))
                    except Exception:  # a lost progress note is not worth failing the call
                        log.warning("progress note for %s failed", call.id, exc_info=True)
            return future.result(max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            with self._lock:
                if not future.done():
                    # The source's own deadline (ctx.deadline) should end it soon after.
                    state["abandoned"] = True
                    self._stuck += 1
            raise ToolTimeout(f"{spec.name} exceeded {timeout:.1f}s") from None

    def _finish(
        self,
        call: ToolCall,
        ctx: ToolContext,
        spec: ToolSpec | None,
        started: float,
        audit: list[AuditEntry] | None,
        *,
        content: Any = None,
        truncated: bool = False,
        error: tuple[str, str] | None = None,
        spec_code: str | None = None,
    ) -> ToolResult:
        elapsed_ms = int((time.monotonic() - started) * 1000)
        if error is not None and content is None:
            # Messages can quote upstream responses or arguments: scrubbed like any output (and
            # of the sources' credentials word for word), and capped like any output (the model
            # sees them as the call's result).
            message, cut = _error_message(error[1], self.result_cap_bytes,
                                          getattr(ctx.sources, "without_secrets", _unchanged))
            content = {"error": True, "message": message,
                       "code": spec_code or SPEC_CODES.get(error[0], "INTERNAL_ERROR"), "error_code": error[0]}
            if cut:
                content["truncated"] = truncated = True
        result = ToolResult(
            call_id=call.id, name=call.name, content=content, is_error=error is not None,
            error_code=error[0] if error else None, truncated=truncated, elapsed_ms=elapsed_ms,
        )
        if audit is not None:
            encoded = json.dumps(content, sort_keys=True, default=str, separators=(",", ":")).encode()
            audit.append(AuditEntry(
                tenant_id=ctx.tenant_id, kind="tool_call", subject=call.name, ok=error is None,
                session_id=ctx.session_id, turn_id=ctx.turn_id, latency_ms=elapsed_ms,
                payload={
                    "call_id": call.id,
                    "step": ctx.step,
                    "arguments": scrub(call.arguments),
                    "effect": spec.effect.value if spec else None,
                    "error_code": error[0] if error else None,
                    "truncated": truncated,
                    "result_bytes": encoded_size(content),
                    "result_sha256": hashlib.sha256(encoded).hexdigest(),
                },
            ))
        return result
