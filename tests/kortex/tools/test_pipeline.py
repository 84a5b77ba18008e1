"""The tool pipeline: deny by default, validation, timeouts, caps, redaction and audit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import Field

from kortex.messages import ToolCall
from kortex.storage.audit import AuditEntry
from kortex.testing.tools import TEST_TOOLS
from kortex.tools.pipeline import ToolPipeline
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry
from kortex.tools.spec import Effect, ToolContext, ToolInput, ToolSpec


class _Args(ToolInput):
    n: int = Field(ge=0, le=10)


def _boom(args: _Args, ctx: ToolContext) -> dict[str, Any]:
    raise ZeroDivisionError("bug")


def _write(args: _Args, ctx: ToolContext) -> dict[str, Any]:
    return {"done": True}


BOOM = ToolSpec(name="boom", description="raises", input_model=_Args, run=_boom, redact=("x",))
WRITER = ToolSpec(name="writer", description="writes", input_model=_Args, run=_write, redact=("done",),
                  effect=Effect.STATE_CHANGE)


def _ctx() -> ToolContext:
    return ToolContext(tenant_id="t1", session_id="s1", turn_id="u1", call_id="c1", step=0,
                       now=datetime.now(UTC), sources=None)  # type: ignore[arg-type]


def _pipeline(allowed=None, **kwargs: Any) -> ToolPipeline:
    registry = ToolRegistry([*TEST_TOOLS, BOOM, WRITER])
    policy = ToolPolicy.build(allowed, registry)
    return ToolPipeline(registry, policy, **kwargs)


def run(pipeline: ToolPipeline, name: str, args: dict, audit: list | None = None, **kw: Any):
    return pipeline.run(ToolCall(id="c1", name=name, arguments=args), _ctx(), audit=audit, **kw)


def test_unknown_and_unlisted_tools_are_denied_alike() -> None:
    p = _pipeline(allowed=["debug_echo"])
    unknown = run(p, "rm_rf", {})
    unlisted = run(p, "debug_sleep", {"seconds": 0})
    for result in (unknown, unlisted):
        assert result.is_error and result.error_code == "policy_denied"
        assert "not available" in result.content["message"]
    assert not run(p, "debug_echo", {"text": "hi"}).is_error


def test_write_effects_need_explicit_allowance() -> None:
    assert run(_pipeline(), "writer", {"n": 1}).error_code == "policy_denied"  # default: read-only only
    assert not run(_pipeline(allowed=["writer"]), "writer", {"n": 1}).is_error


def test_validation_errors_name_the_fields() -> None:
    result = run(_pipeline(), "debug_echo", {"repeat": 0, "extra": 1})
    assert result.is_error and result.error_code == "validation"
    msg = result.content["message"]
    assert "text" in msg and "repeat" in msg and "extra" in msg


def test_invalid_json_arguments_are_reported_without_echoing_them() -> None:
    p = _pipeline()
    call = ToolCall(id="c9", name="debug_echo", arguments={}, arguments_error="invalid_json")
    result = p.run(call, _ctx())
    assert result.error_code == "invalid_json" and result.call_id == "c9"


def test_timeout_becomes_a_structured_error() -> None:
    p = _pipeline(timeouts={"debug_sleep": 0.1})
    result = run(p, "debug_sleep", {"seconds": 5})
    assert result.is_error and result.error_code == "timeout"
    assert result.content["error"] == "tool_timeout" and result.content["tool"] == "debug_sleep"
    assert result.elapsed_ms < 2000


def test_timeouts_are_clamped_to_the_category_ceiling() -> None:
    p = _pipeline(timeouts={"debug_sleep": 10_000})
    timeout, ceiling = p.limits_for("debug_sleep")
    assert timeout == ceiling == 30.0  # lookup category: 5 s default, 30 s hard


def test_upstream_and_internal_failures_become_results() -> None:
    up = run(_pipeline(), "debug_echo", {"text": "x", "fail": True})
    assert up.error_code == "upstream" and "503" in up.content["message"]
    bug = run(_pipeline(), "boom", {"n": 1})
    assert bug.error_code == "internal" and bug.content["message"] == "internal error"


def test_output_is_capped_and_flagged_truncated() -> None:
    p = _pipeline(result_cap_bytes=2048)
    result = run(p, "debug_echo", {"text": "x" * 100, "repeat": 200})
    assert not result.is_error and result.truncated and result.content["truncated"] is True
    assert 0 < len(result.content["items"]) < 200
    assert len(json.dumps(result.content).encode()) <= 2048


def test_the_cap_measures_the_redacted_result() -> None:
    """Scrubbing lengthens ``pwd=a`` to ``pwd=[REDACTED]``: a result under the cap before
    redaction can be far over it after; the cap applies to what the model receives."""
    p = _pipeline()  # 64 KiB
    result = run(p, "debug_echo", {"text": "pwd=a " * 2000, "repeat": 5})  # 60 KB raw, 150 KB scrubbed
    assert not result.is_error and result.truncated and 0 < len(result.content["items"]) < 5
    assert len(json.dumps(result.content, separators=(",", ":")).encode()) <= 64 * 1024
    assert "pwd=a" not in json.dumps(result.content)


def _wide(args: _Args, ctx: ToolContext) -> dict[str, Any]:
    return {"blob": {f"key{i}": i for i in range(20_000)}}  # nothing to drop, no string to shorten


WIDE = ToolSpec(name="wide", description="too big to trim", input_model=_Args, run=_wide, redact=("blob", "truncated"))


def test_a_result_that_cannot_be_trimmed_is_an_error_the_model_can_act_on() -> None:
    registry = ToolRegistry([WIDE])
    p = ToolPipeline(registry, ToolPolicy.build(["wide"], registry), result_cap_bytes=4096)
    result = run(p, "wide", {"n": 1})
    assert result.is_error and result.error_code == "result_too_large"
    assert result.content["code"] == "RESULT_TOO_LARGE" and "4096 bytes" in result.content["message"]
    assert "shorter time range" in result.content["message"]


def test_redaction_keeps_only_allowlisted_fields() -> None:
    result = run(_pipeline(), "debug_echo", {"text": "token=abc123secret ok"})
    assert "secret" not in result.content  # not in the allowlist
    assert result.content["items"] == ["token=[REDACTED] ok"]


def test_every_call_writes_one_audit_entry_with_scrubbed_arguments() -> None:
    entries: list[AuditEntry] = []
    p = _pipeline()
    run(p, "debug_echo", {"text": "password=hunter2"}, audit=entries)
    run(p, "nope", {}, audit=entries)
    assert [e.ok for e in entries] == [True, False]
    assert entries[0].payload["arguments"] == {"text": "password=[REDACTED]"}
    assert entries[1].payload["error_code"] == "policy_denied"
    assert all(e.kind == "tool_call" and e.tenant_id == "t1" for e in entries)


def test_progress_note_fires_for_slow_tools() -> None:
    notes: list[int] = []

    def on_progress(call: ToolCall, elapsed_ms: int) -> None:
        notes.append(elapsed_ms)

    p = _pipeline(progress_after=0.05)
    result = run(p, "debug_sleep", {"seconds": 0.2}, on_progress=on_progress)
    assert not result.is_error and notes == [50]
    fast: list[int] = []
    run(p, "debug_sleep", {"seconds": 0}, on_progress=lambda c, e: fast.append(e))
    assert fast == []


def test_registry_rejects_collisions_and_bad_names() -> None:
    with pytest.raises(ValueError):
        ToolRegistry([BOOM, BOOM])
    with pytest.raises(ValueError):
        ToolRegistry([ToolSpec(name="bad name", description="", input_model=_Args, run=_boom, redact=("x",))])
    with pytest.raises(ValueError):
        ToolSpec(name="noredact", description="", input_model=_Args, run=_boom)


def test_schema_keeps_argument_named_title() -> None:
    class WithTitle(ToolInput):
        title: str = Field(description="an argument called title")

    spec = ToolSpec(name="t", description="", input_model=WithTitle, run=_boom, redact=("x",))
    assert "title" in spec.input_schema["properties"]
    assert "title" not in spec.input_schema  # pydantic's own annotation is gone
    assert spec.input_schema["required"] == ["title"]



def test_domain_errors_map_to_pipeline_codes_and_spec_codes() -> None:
    from kortex.errors import NotFound, StorageError

    def missing(args: _Args, ctx: ToolContext) -> dict[str, Any]:
        raise NotFound("Request not found: req_1")

    def broken(args: _Args, ctx: ToolContext) -> dict[str, Any]:
        raise StorageError("database error: OperationalError at 10.0.0.5 password=x")

    specs = [ToolSpec(name="missing", description="", input_model=_Args, run=missing, redact=("x",)),
             ToolSpec(name="broken", description="", input_model=_Args, run=broken, redact=("x",))]
    registry = ToolRegistry([*TEST_TOOLS, *specs])
    p = ToolPipeline(registry, ToolPolicy.build(None, registry))
    assert run(p, "missing", {"n": 1}).content == {"error": True, "message": "Request not found: req_1",
                                                   "code": "NOT_FOUND", "error_code": "not_found"}
    db = run(p, "broken", {"n": 1})
    assert db.error_code == "upstream" and db.content["code"] == "DATABASE_ERROR"
    assert "10.0.0.5" not in db.content["message"]  # storage details stay in the server log
    assert run(p, "broken", {"n": 99}).content["code"] == "INVALID_PARAMETER"
    assert run(p, "nope", {}).content["code"] == "POLICY_DENIED"


def test_error_messages_are_scrubbed_too() -> None:
    from kortex.errors import UpstreamError

    def leaky(args: _Args, ctx: ToolContext) -> dict[str, Any]:
        raise UpstreamError("upstream said: 401 for Authorization: Bearer abcdefghijklmnopqrstuv")

    spec = ToolSpec(name="leaky", description="", input_model=_Args, run=leaky, redact=("x",))
    registry = ToolRegistry([spec])
    p = ToolPipeline(registry, ToolPolicy.build(None, registry))
    result = p.run(ToolCall(id="c", name="leaky", arguments={"n": 1}), _ctx())
    assert result.error_code == "upstream" and "abcdefghijklmnop" not in result.content["message"]


def _raising(message: str, cap: int) -> ToolPipeline:
    from kortex.errors import UpstreamError

    def upstream(args: _Args, ctx: ToolContext) -> dict[str, Any]:
        raise UpstreamError(message)

    spec = ToolSpec(name="upstream", description="", input_model=_Args, run=upstream, redact=("x",))
    registry = ToolRegistry([spec])
    return ToolPipeline(registry, ToolPolicy.build(None, registry), result_cap_bytes=cap)


@pytest.mark.parametrize("cap", [1024, 64 * 1024])
@pytest.mark.parametrize("filler", ["x", "\x01", "€", "🔥"])  # 1 to 6 bytes a character in JSON
def test_an_error_message_of_any_size_fits_the_output_cap(cap: int, filler: str) -> None:
    """A Prometheus ``error`` string of megabytes is cut like any output, and says so."""
    audit: list[AuditEntry] = []
    result = run(_raising("bad_data: " + filler * 3_000_000, cap), "upstream", {"n": 1}, audit)
    assert result.is_error and result.error_code == "upstream"
    assert result.truncated and result.content["truncated"] is True
    message = result.content["message"]
    assert message.startswith("bad_data: " + filler * 10) and message.endswith("[truncated]")
    assert len(json.dumps(result.content, separators=(",", ":"), ensure_ascii=False).encode()) <= cap
    assert audit[0].payload["result_bytes"] <= cap


def test_no_part_of_a_secret_cut_by_the_error_message_cap_reaches_the_model() -> None:
    # Keys the scrubber shortens to a marker, then one whose end lies past what is scrubbed of a
    # long message: unscrubbed, its first half would be left at the start of the cut message.
    key = "-----BEGIN PRIVATE KEY-----\n" + "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" * 64 + "\n-----END PRIVATE KEY-----"
    message = "upstream said: " + " ".join([key] * 31) + " " + key + " and more" * 100_000
    result = run(_raising(message, 64 * 1024), "upstream", {"n": 1})
    assert result.truncated and "MIIEvQIBADAN" not in result.content["message"]
    assert result.content["message"].endswith("[truncated]")


class _Gate(ToolInput):
    pass


def _gated_pipeline(run_fn, **kwargs: Any) -> ToolPipeline:
    spec = ToolSpec(name="gated", description="waits on a test gate", input_model=_Gate, run=run_fn,
                    redact=("ok",))
    registry = ToolRegistry([spec])
    return ToolPipeline(registry, ToolPolicy.build(None, registry), **kwargs)


def test_many_concurrent_calls_all_run_at_once_no_queue_eats_their_timeout() -> None:
    # 40 calls that can only finish together: a shared pool smaller than 40 would leave some
    # queued behind the barrier until their timeouts, so every one succeeding shows none waited.
    import threading
    n = 40
    barrier = threading.Barrier(n, timeout=20)

    def gated(args: _Gate, ctx: ToolContext) -> dict[str, Any]:
        barrier.wait()
        return {"ok": True}

    p = _gated_pipeline(gated, timeouts={"gated": 25})
    results: list[Any] = []
    threads = [threading.Thread(target=lambda: results.append(run(p, "gated", {}))) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == n and all(not r.is_error and r.content == {"ok": True} for r in results)


def test_calls_stuck_past_their_timeout_are_bounded_and_released_when_they_end() -> None:
    import threading
    release = threading.Event()

    def hangs(args: _Gate, ctx: ToolContext) -> dict[str, Any]:
        release.wait(30)
        return {"ok": True}

    p = _gated_pipeline(hangs, timeouts={"gated": 0.05}, max_stuck=2)
    assert [run(p, "gated", {}).error_code for _ in range(2)] == ["timeout", "timeout"]
    assert p.stuck_calls == 2
    refused = run(p, "gated", {})  # fails fast instead of stacking a third hung thread
    assert refused.is_error and refused.error_code == "upstream" and "stuck" in refused.content["message"]
    assert p.stuck_calls == 2
    release.set()
    for _ in range(200):
        if p.stuck_calls == 0:
            break
        threading.Event().wait(0.01)
    assert p.stuck_calls == 0
    ok = run(p, "gated", {})
    assert not ok.is_error and ok.content == {"ok": True}
