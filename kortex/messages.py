"""Conversation types: user, assistant (with tool calls) and tool-result messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Model):
    """The model asking us to run a tool. ``id`` is stable from call to result."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # Set when the model produced arguments that are not a JSON object. The raw text is
    # kept out of the model's view (tool-use-spec §8); the pipeline answers `invalid_json`.
    arguments_error: str | None = None


class ToolResult(_Model):
    """What a tool call produced, as the model will see it."""

    call_id: str
    name: str
    content: Any = None
    is_error: bool = False
    error_code: str | None = None
    truncated: bool = False
    elapsed_ms: int = 0


class UserMessage(_Model):
    role: Literal["user"] = "user"
    content: str


class AssistantMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class ToolMessage(_Model):
    role: Literal["tool"] = "tool"
    result: ToolResult


Message = Annotated[UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
MessageAdapter: TypeAdapter[Message] = TypeAdapter(Message)


class Usage(_Model):
    """Billed tokens and their cost for one or more LLM calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 8),
        )
