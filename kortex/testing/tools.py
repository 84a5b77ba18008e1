"""Tools for tests and benchmarks, registered only with ``testing.enable_test_tools``."""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import Field

from kortex.errors import UpstreamError
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class SleepInput(ToolInput):
    seconds: float = Field(ge=0, le=600, description="How long to sleep")


def _sleep(args: SleepInput, ctx: ToolContext) -> dict[str, Any]:
    time.sleep(args.seconds)
    return {"slept_s": args.seconds}


class CrashInput(ToolInput):
    exit_code: int = Field(70, ge=1, le=255)


def _crash(args: CrashInput, ctx: ToolContext) -> dict[str, Any]:
    # The worker process dies mid-call, as on an OOM kill: only the watchdog can settle it.
    # Never enable test tools outside a throwaway worker.
    os._exit(args.exit_code)


class EchoInput(ToolInput):
    text: str = Field(max_length=100_000)
    repeat: int = Field(1, ge=1, le=100_000)
    fail: bool = False


def _echo(args: EchoInput, ctx: ToolContext) -> dict[str, Any]:
    if args.fail:
        raise UpstreamError("echo upstream returned 503")
    return {"items": [args.text] * args.repeat, "call_id": ctx.call_id, "secret": "hunter2"}


TEST_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(name="debug_sleep", description="Sleep for a while (tests the time limits).",
             input_model=SleepInput, run=_sleep, category="lookup", redact=("slept_s",)),
    ToolSpec(name="debug_crash", description="Kill the worker process running the call (tests recovery).",
             input_model=CrashInput, run=_crash, category="lookup", redact=("never",)),
    ToolSpec(name="debug_echo", description="Echo text back (tests caps and redaction).",
             input_model=EchoInput, run=_echo, category="lookup", redact=("items", "call_id", "truncated"),
             list_field="items"),
)
