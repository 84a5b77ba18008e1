"""A provider that replays a script: fixed text and tool calls per step. For tests and benchmarks.

A script is JSON::

    {"steps": [
        {"text": ["Checking ", "logs."], "tool_calls": [{"id": "c1", "name": "get_logs",
                                                        "arguments": {"product": "checkout"}}]},
        {"text": ["Done."], "usage": {"input_tokens": 12, "output_tokens": 3}}
     ],
     "loop": false}

The step played is the number of assistant messages since the last user message, so a
script is a whole turn. ``loop`` repeats the last step forever (for depth-limit tests).
A step may carry ``delay_ms`` (before each chunk), ``error`` (raise a ProviderError after its
text, so text-then-failure is a mid-stream error) or
``arguments_raw`` on a call (arguments that are not valid JSON).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kortex.config import ProviderSettings, Settings
from kortex.errors import ProviderError, ProviderUnavailable
from kortex.llm.base import (
    CompletionRequest,
    DoneChunk,
    ModelInfo,
    Provider,
    StreamChunk,
    TextChunk,
    TokenUsage,
    ToolCallChunk,
)
from kortex.llm.convert import load_arguments
from kortex.messages import AssistantMessage, ToolCall, UserMessage
from kortex.prompts import REGROUND_MARK

BUILTIN_SCRIPTS = Path(__file__).resolve().parent.parent / "testing" / "scripts"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}\Z")


class ScriptCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    arguments_raw: str | None = None


class ScriptError(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = "scripted failure"
    status: int | None = 500
    retryable: bool = False


class ScriptStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: list[str] = Field(default_factory=list)
    tool_calls: list[ScriptCall] = Field(default_factory=list)
    delay_ms: int = 0
    stop_reason: str | None = None
    usage: TokenUsage | None = None
    error: ScriptError | None = None


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: list[ScriptStep]
    loop: bool = False


def step_index(messages: Sequence[Any]) -> int:
    """How many assistant messages follow the last user message. The server's own grounding
    re-ask (kortex/prompts.py REGROUND) continues the turn: the script's next step answers it."""
    count = 0
    for message in reversed(messages):
        if isinstance(message, UserMessage) and not message.content.startswith(REGROUND_MARK):
            break
        if isinstance(message, AssistantMessage):
            count += 1
    return count


class ScriptedProvider(Provider):
    name = "scripted"
    synthetic = True

    def __init__(self, scripts: dict[str, Script] | None = None, dirs: Sequence[Path] = (),
                 prices: dict[str, dict[str, float]] | None = None) -> None:
        self._scripts = dict(scripts or {})
        self._dirs = list(dirs)
        self._prices = dict(prices or {})  # per script, so tests can bill turns

    def models(self) -> Sequence[ModelInfo]:
        names = set(self._scripts)
        for folder in self._dirs:
            if folder.is_dir():
                names.update(p.stem for p in folder.glob("*.json"))
        return [ModelInfo(id=n, display_name=f"scripted {n}", tier="fast") for n in sorted(names)] or [
            ModelInfo(id="default", display_name="scripted (no scripts)")
        ]

    def model_info(self, model_id: str | None) -> ModelInfo:
        # Any script is a model; looking it up must not list the script folders on every call.
        if not model_id:
            return self.default_model()
        self.script(model_id)  # raises when there is no such script
        price = self._prices.get(model_id, {})
        return ModelInfo(id=model_id, display_name=f"scripted {model_id}", tier="fast",
                         input_usd_per_mtok=price.get("input", 0.0), output_usd_per_mtok=price.get("output", 0.0))

    def script(self, name: str) -> Script:
        if name in self._scripts:
            return self._scripts[name]
        if not _NAME.match(name):
            raise ProviderError(f"bad script name {name!r}", provider=self.name, model=name)
        for folder in self._dirs:
            path = folder / f"{name}.json"
            if path.is_file():
                script = Script.model_validate_json(path.read_text())
                self._scripts[name] = script
                return script
        raise ProviderError(f"no script named {name!r}", provider=self.name, model=name)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        model = request.model or self.default_model().id
        script = self.script(model)
        index = played = step_index(request.messages)
        if index >= len(script.steps):
            if not script.loop:
                raise ProviderError(f"script {model!r} has no step {index}", provider=self.name, model=model)
            index = len(script.steps) - 1
        step = script.steps[index]
        delay = step.delay_ms / 1000.0
        out_chars = 0
        for piece in step.text:
            if delay:
                await asyncio.sleep(delay)
            out_chars += len(piece)
            yield TextChunk(text=piece)
        if step.error is not None:  # after any text: a failure mid-stream
            raise ProviderError(step.error.message, provider=self.name, model=model,
                                status=step.error.status, retryable=step.error.retryable)
        for i, call in enumerate(step.tool_calls):
            if delay:
                await asyncio.sleep(delay)
            yield ToolCallChunk(call=_to_call(call, played, i))
        in_chars = sum(len(getattr(m, "content", "") or "") for m in request.messages)
        usage = step.usage or TokenUsage(input_tokens=max(1, in_chars // 4), output_tokens=max(1, out_chars // 4))
        stop = step.stop_reason or ("tool_use" if step.tool_calls else "end_turn")
        yield DoneChunk(stop_reason=stop, usage=usage, model=model)  # type: ignore[arg-type]


def _to_call(call: ScriptCall, step: int, index: int) -> ToolCall:
    call_id = call.id or f"call_s{step}_{index}"
    if call.arguments_raw is not None:
        try:
            parsed = load_arguments(call.arguments_raw)
        except ValueError:
            return ToolCall(id=call_id, name=call.name, arguments={}, arguments_error="invalid_json")
        if not isinstance(parsed, dict):
            return ToolCall(id=call_id, name=call.name, arguments={}, arguments_error="invalid_json")
        return ToolCall(id=call_id, name=call.name, arguments=parsed)
    return ToolCall(id=call_id, name=call.name, arguments=call.arguments)


def create(name: str, config: ProviderSettings, settings: Settings) -> Provider:
    if not settings.testing.enable_test_providers:
        raise ProviderUnavailable("test providers are disabled (testing.enable_test_providers)", provider=name)
    dirs = [BUILTIN_SCRIPTS]
    if settings.testing.scripts_dir:
        dirs.insert(0, settings.testing.scripts_dir)
    return ScriptedProvider(dirs=dirs, prices=config.prices)
