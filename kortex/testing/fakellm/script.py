"""What the fake LLM server replays: a script of steps, one per model call of a turn.

    {"steps": [
        {"text": ["Checking ", "the logs."],
         "tool_calls": [{"id": "toolu_1", "name": "get_logs", "arguments": {"product": "checkout"},
                         "fragments": 4}]},
        {"faults": [{"status": 429, "retry_after": 0.01}], "text": ["The pool ran dry."]}
     ]}

The step served is the number of assistant messages after the last user message, so one
script is one turn, whichever wire format asks. Faults make the fake fail like a vendor:
``faults`` answer the first requests for a step with HTTP errors; ``disconnect_after`` resets
the connection and ``truncate_after`` ends the body cleanly but early, both after that many
text pieces (``truncate_partial`` also sends the first half of the next frame, a line cut
mid-way); ``stream_error`` sends the vendor's in-stream error event after the text.

What happens after the final frame (``message_stop``, ``[DONE]``, ``"done": true``):
``after_end`` ``"reset"`` resets the connection instead of ending the body, ``"stall"`` holds
it open (a proxy that keeps it) for ``stall_ms`` first. ``split_bytes`` writes every text frame
in slices of that many bytes (2 splits every 3-byte character across reads). ``extra_frames`` are
sent verbatim after the text (the JSON of an SSE ``data:`` or an NDJSON line): malformed frames.
OpenAI only: ``tool_call_style`` ``"interleaved"`` sends one fragment of every call per chunk
(several indexes in one chunk), ``"no_index"`` omits ``index`` as some compatible servers do;
``usage_with_finish`` puts usage in the chunk with ``finish_reason``; ``usage_omitted`` sends
no usage at all, not even ``"usage": null``, as a compatible server or proxy that ignores
``stream_options.include_usage`` does.

Pacing, to stand in for a real model in benchmarks: ``first_token_ms`` holds the first text
piece back (time to first token; the headers and ``message_start`` go out at once, as the
vendors send them), then text pieces follow at ``tokens_per_s``, each piece counting as
``piece_tokens`` tokens. The schedule is measured from the start of the stream, not from the
previous write, so a busy server catches up instead of drifting slower than the model would.
Unset, the fake writes as fast as it can (``delay_ms`` still adds a fixed pause per piece).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FakeCall(_Model):
    id: str | None = None
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    arguments_raw: str | None = None  # sent instead of `arguments`: e.g. JSON that does not parse
    fragments: int = Field(3, ge=1, le=1000)  # how many pieces the argument JSON is streamed in


class FakeFault(_Model):
    status: int = Field(500, ge=400, le=599)
    message: str = "fake failure"
    retry_after: float | None = None
    kind: str | None = None  # the vendor's error type/code in the body (OpenAI "insufficient_quota"); else the status's
    disconnect: bool = False  # reset the connection instead of answering (status unused)


class FakeStreamError(_Model):
    type: str = "overloaded_error"
    message: str = "Overloaded"


class FakeUsage(_Model):
    input_tokens: int = 0  # not counting the cache (Anthropic's meaning)
    output_tokens: int = 0
    cache_read_tokens: int = 0  # Anthropic cache_read_input_tokens, OpenAI cached_tokens
    cache_write_tokens: int = 0  # Anthropic cache_creation_input_tokens


class FakeStep(_Model):
    text: list[str] = Field(default_factory=list)
    tool_calls: list[FakeCall] = Field(default_factory=list)
    stop_reason: Literal["end_turn", "tool_use", "max_tokens", "stop_sequence"] | None = None
    usage: FakeUsage | None = None
    delay_ms: float = Field(0, ge=0, le=60_000)  # before each streamed piece
    faults: list[FakeFault] = Field(default_factory=list)
    disconnect_after: int | None = Field(None, ge=0)
    truncate_after: int | None = Field(None, ge=0)
    truncate_partial: bool = False
    stream_error: FakeStreamError | None = None
    after_end: Literal["reset", "stall"] | None = None
    stall_ms: float = Field(30_000, ge=0, le=600_000)
    split_bytes: int | None = Field(None, ge=1)
    extra_frames: list[Any] = Field(default_factory=list)
    tool_call_style: Literal["sequential", "interleaved", "no_index"] = "sequential"
    usage_with_finish: bool = False
    usage_omitted: bool = False
    first_token_ms: float = Field(0, ge=0, le=600_000)
    tokens_per_s: float | None = Field(None, gt=0, le=1_000_000)
    piece_tokens: int = Field(1, ge=1, le=10_000)

    @property
    def paced(self) -> bool:
        return self.first_token_ms > 0 or self.tokens_per_s is not None

    def text_due_s(self, index: int) -> float:
        """When text piece ``index`` (0-based) is due, in seconds after the stream started."""
        gap = self.piece_tokens / self.tokens_per_s if self.tokens_per_s else 0.0
        return self.first_token_ms / 1000.0 + index * gap

    def stop(self) -> str:
        return self.stop_reason or ("tool_use" if self.tool_calls else "end_turn")

    def usage_for(self, prompt_chars: int) -> FakeUsage:
        if self.usage is not None:
            return self.usage
        out = sum(len(t) for t in self.text) + sum(len(str(c.arguments)) for c in self.tool_calls)
        return FakeUsage(input_tokens=max(1, prompt_chars // 4), output_tokens=max(1, out // 4))


class FakeScript(_Model):
    steps: list[FakeStep]
    loop: bool = False  # repeat the last step forever
    # Ollama only: refuse requests with `tools` (HTTP 400, "does not support tools") the way
    # a model without native tool calling does.
    native_tools: bool = True

    def step(self, index: int) -> FakeStep | None:
        if index < len(self.steps):
            return self.steps[index]
        return self.steps[-1] if self.loop and self.steps else None
