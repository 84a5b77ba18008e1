"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kortex.keys import KeyInfo
from kortex.messages import Usage
from kortex.redaction import scrub
from kortex.text import Name
from kortex.turns.chat import MessageRecord, SessionRecord, TurnRecord


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSession(_In):
    name: Name | None = Field(None, max_length=200, description="one line, no control characters")
    model: str | None = Field(None, max_length=200, description="provider:model, e.g. 'offline:analyst'")


class PostMessage(_In):
    content: str = Field(min_length=1, max_length=200_000)
    model: str | None = Field(None, max_length=200)


class UsageOut(BaseModel):
    input_tokens: int
    output_tokens: int
    cost_usd: float


class SessionOut(BaseModel):
    id: str
    name: str
    model: str | None
    created_at: datetime
    updated_at: datetime
    turn_count: int
    usage: UsageOut

    @classmethod
    def of(cls, s: SessionRecord, usage: Usage | None = None) -> SessionOut:
        usage = usage or Usage()
        return cls(id=s.id, name=s.name, model=s.model, created_at=s.created_at, updated_at=s.updated_at,
                   turn_count=s.turn_count,
                   usage=UsageOut(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                  cost_usd=usage.cost_usd))


class SessionPageOut(BaseModel):
    sessions: list[SessionOut] = Field(description="Newest first; usage is not summed in a list (GET the session)")
    next_before: str | None = Field(None, description="Pass as ?before= to read the next (older) page")


class MessageOut(BaseModel):
    id: str
    turn_id: str
    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    result: Any = None
    is_error: bool = False
    error_code: str | None = None
    truncated: bool = False
    position: str
    grounding: dict[str, Any] | None = Field(
        None, description="a final answer's citations as the server checked them: citations [{id, tool, ok}], "
                          "cited, dangling, uncited_numbers")
    created_at: datetime

    @classmethod
    def of(cls, m: MessageRecord) -> MessageOut:
        # Arguments are scrubbed as on the live stream: a model may have copied a secret into one.
        tool_calls = [{**c, "arguments": scrub(c.get("arguments") or {})} for c in m.tool_calls] \
            if m.tool_calls else m.tool_calls
        return cls(id=m.id, turn_id=m.turn_id, role=m.role, content=m.content, tool_calls=tool_calls,
                   tool_call_id=m.tool_call_id, tool_name=m.tool_name, result=m.result, is_error=m.is_error,
                   error_code=m.error_code, truncated=m.truncated, position=f"{m.turn_no}.{m.step}.{m.ord}",
                   grounding=m.grounding,
                   created_at=m.created_at)


class MessagePage(BaseModel):
    messages: list[MessageOut]
    next_after: str | None = Field(None, description="Pass as ?after= to read the next page")


class ForkSession(_In):
    checkpoint_id: str = Field(min_length=1, max_length=64)
    name: Name | None = Field(None, max_length=200, description="one line, no control characters")


class RetryTurn(_In):
    checkpoint_id: str | None = Field(None, min_length=1, max_length=64,
                                      description="default: the turn's start (its question is asked again)")
    model: str | None = Field(None, max_length=200, description="default: the turn's; 'auto' routes each step")


class CheckpointOut(BaseModel):
    id: str
    parent_id: str | None
    turn_id: str
    step: int | None = Field(description="null: the turn's start (after its user message)")
    position: list[int] = Field(description="the last message it includes: [turn_no, step, ord]")
    tokens: int = Field(description="the conversation's size there, estimated (four characters a token)")
    created_at: datetime


class TurnAccepted(BaseModel):
    turn_id: str
    session_id: str
    status: str
    events_url: str


class StepModelOut(BaseModel):
    step: int
    model: str = Field(description="provider:model that answered the step")
    routed: bool = Field(description="chosen by the router (model 'auto'), not named by the caller")


class TurnOut(BaseModel):
    id: str
    session_id: str
    status: str
    step: int
    model: str | None
    model_used: str | None
    usage: UsageOut
    error: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    steps: list[StepModelOut] | None = Field(None, description="the model of each step that has answered "
                                                                "(GET /v1/turns/{id} only)")

    @classmethod
    def of(cls, t: TurnRecord, steps: list[tuple[int, str, bool]] | None = None) -> TurnOut:
        return cls(id=t.id, session_id=t.session_id, status=t.status, step=t.step, model=t.model,
                   model_used=t.model_used, error=t.error, created_at=t.created_at, updated_at=t.updated_at,
                   finished_at=t.finished_at,
                   usage=UsageOut(input_tokens=t.input_tokens, output_tokens=t.output_tokens, cost_usd=t.cost_usd),
                   steps=None if steps is None else [StepModelOut(step=n, model=m, routed=r) for n, m, r in steps])


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorOut(BaseModel):
    error: ErrorBody


class CreateKey(_In):
    name: Name = Field("default", min_length=1, max_length=200,
                       description="what the key is for: one line, no control characters, not blank")
    role: Literal["chat", "operator", "ingest", "admin"] = Field(
        "chat", description="chat: sessions (made, read, deleted), turns (asked, cancelled), post-mortem jobs and "
                            "the catalogs; operator: also decide on proposals; ingest: write telemetry only; "
                            "admin: everything, keys included")


class KeyOut(BaseModel):
    key_id: str = Field(description="the key's public id (its second part); never the secret")
    name: str
    role: str
    created_at: datetime
    revoked_at: datetime | None = None

    @classmethod
    def of(cls, info: KeyInfo) -> KeyOut:
        return cls(key_id=info.key_id, name=info.name, role=info.role, created_at=info.created_at,
                   revoked_at=info.revoked_at)


class KeyCreated(KeyOut):
    key: str = Field(description="the whole key, shown this once: only a hash of its secret is stored")


class KeyList(BaseModel):
    keys: list[KeyOut]
    next_after: str | None = Field(None, description="the last key of a full page: pass as after for the next")
