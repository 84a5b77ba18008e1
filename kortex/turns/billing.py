"""What a step's LLM calls cost and how they are audited: one audit row per call (billed also
when it failed or was cut short), the step's usage and the turn's running total."""

from __future__ import annotations

from typing import Any

from kortex import metrics
from kortex.errors import ProviderError
from kortex.llm.router import Attempt
from kortex.messages import ToolCall, Usage
from kortex.storage.audit import AuditEntry
from kortex.storage.records import TurnRecord

#: Errors that are the step's verdict on what a call answered (kortex/turns/consume.py: the
#: answer past ``llm.max_answer_chars``, text and tool-call arguments together, or one call's
#: arguments past their bound). Tool calls reach the step only once their call has ended well,
#: so such an error comes after the vendor's stop reason: it is still that call's failure, and
#: its row says the answer was refused (what it cost is billed all the same).
REFUSED_ANSWER = frozenset({"stream_invalid"})


def usage_of(attempts: list[Attempt]) -> Usage:
    """What the step cost: every call, including a frugal attempt that was escalated."""
    total = Usage()
    for a in attempts:
        total += Usage(input_tokens=a.usage.input_tokens, output_tokens=a.usage.output_tokens, cost_usd=a.cost_usd)
    return total


def billed(turn: TurnRecord) -> Usage:
    """What the turn's row says its calls billed so far."""
    return Usage(input_tokens=turn.input_tokens, output_tokens=turn.output_tokens, cost_usd=turn.cost_usd)


def turn_total(turn: TurnRecord, usage: Usage) -> Usage:
    return billed(turn) + usage


def llm_audit(
    turn: TurnRecord,
    step: int,
    attempts: list[Attempt],
    *,
    calls: tuple[ToolCall, ...] = (),
    text_chars: int = 0,
    error: ProviderError | None = None,
) -> list[AuditEntry]:
    """One row per LLM call. ``error`` is what ended the step: it is recorded on the last call
    when that call has no error of its own and was still running (a timeout) or its answer was
    refused (``REFUSED_ANSWER``); an error after a call that ended well (a lease lost once it
    had answered) is no failure of that call."""
    entries = []
    for index, attempt in enumerate(attempts):
        last = index == len(attempts) - 1
        failure = attempt.error if attempt.error is not None and attempt.error.code != "cancelled" else None
        if failure is None and last and error is not None and (
                attempt.stop_reason in (None, "error") or error.code in REFUSED_ANSWER):
            failure = error  # includes "cancelled": a call cut short is not a success
        # Prompts and answers stay out of the audit row: they may quote secrets from telemetry.
        payload: dict[str, Any] = {
            "step": step, "attempt": index, "provider": attempt.provider, "model": attempt.model.id,
            "fast": attempt.fast, "stop_reason": "error" if failure else attempt.stop_reason,
            "tool_calls": [c.name for c in calls] if last and failure is None else [],
            "text_chars": text_chars if last and failure is None else 0,
            "cache_read_tokens": attempt.usage.cache_read_tokens,
            "cache_write_tokens": attempt.usage.cache_write_tokens,
            "retries": attempt.retries,
            "first_token_ms": attempt.first_token_ms,  # what routing measures latency from
        }
        if attempt.usage.estimated:  # the vendor never said: the tokens are counted from characters
            payload["usage_estimated"] = True
        if failure is not None:
            payload.update(error_code=failure.code, status=failure.status, retryable=failure.retryable)
        # A label per model a caller may name at will would be a series per name: those share one.
        label = "unlisted" if attempt.model.caller_named else attempt.model.id
        metrics.llm_call(attempt.provider, label, ok=failure is None,
                         first_token_s=attempt.first_token_ms / 1000 if attempt.first_token_ms is not None else None,
                         input_tokens=attempt.usage.input_tokens, output_tokens=attempt.usage.output_tokens,
                         cost_usd=attempt.cost_usd)
        entries.append(AuditEntry(
            tenant_id=turn.tenant_id, kind="llm_call", subject=attempt.spec, ok=failure is None, payload=payload,
            session_id=turn.session_id, turn_id=turn.id, input_tokens=attempt.usage.input_tokens,
            output_tokens=attempt.usage.output_tokens, cost_usd=attempt.cost_usd, latency_ms=attempt.latency_ms,
        ))
    return entries


__all__ = ["REFUSED_ANSWER", "billed", "llm_audit", "turn_total", "usage_of"]
