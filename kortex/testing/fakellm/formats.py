"""The three wire formats the fake speaks: how each vendor frames a streamed answer, an error
and an in-stream failure, and how to read which step of a conversation a request is at.

Field names follow the vendors' documentation; the official SDKs parse these streams in
``tests/kortex/llm/test_fake_server.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from kortex.testing.fakellm.script import FakeCall, FakeStep, FakeStreamError

# kortex.prompts.REGROUND_MARK, written out: the fake speaks vendors' formats and imports no turn code.
REGROUND_MARK = "[grounding check]"

_RESULT_PREFIX = "Tool result ("  # how kortex/llm/pseudotools.py returns results to marker-driven models


@dataclass(frozen=True, slots=True)
class Piece:
    data: bytes
    text: bool = False  # a text delta (counted by disconnect_after / truncate_after)


@dataclass(frozen=True, slots=True)
class Conversation:
    first_user: str
    step: int
    prompt_chars: int


def _dumps(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: escaped ("\\ud800"), as a vendor's encoder writes it
        return json.dumps(value, separators=(",", ":"))
    return text


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else _dumps(data)}\n\n".encode()


def _fragments(text: str, count: int) -> list[str]:
    size = max(1, -(-len(text) // count))
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _arguments_text(call: FakeCall) -> str:
    return call.arguments_raw if call.arguments_raw is not None else _dumps(call.arguments)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _conversation(messages: list[dict[str, Any]], is_user_turn: Any) -> Conversation:
    chars = sum(len(_dumps(m)) for m in messages)
    step = 0
    for message in reversed(messages):
        # Kortex's grounding re-ask (kortex/prompts.py) continues the turn: the next step answers it.
        if is_user_turn(message) and not _text_of(message.get("content")).startswith(REGROUND_MARK):
            break
        if message.get("role") == "assistant":
            step += 1
    first = next((_text_of(m.get("content")) for m in messages if is_user_turn(m)), "")
    return Conversation(first, step, chars)


class WireFormat(Protocol):
    """What the server needs of a format; the format classes below are used as such, never instantiated."""

    name: str
    content_type: str

    @staticmethod
    def check(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str] | None: ...

    @staticmethod
    def conversation(body: dict[str, Any]) -> Conversation: ...

    @staticmethod
    def error(status: int, message: str, kind: str | None = None) -> bytes: ...

    @staticmethod
    def stream_error(error: FakeStreamError) -> bytes: ...

    @staticmethod
    def render(step: FakeStep, model: str, body: dict[str, Any], conv: Conversation) -> list[Piece]: ...


class Anthropic:
    name = "anthropic"
    content_type = "text/event-stream"

    @staticmethod
    def check(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str] | None:
        # The API documents x-api-key; recent official SDKs send the key as a bearer token.
        if not headers.get("x-api-key") and not headers.get("authorization", "").startswith("Bearer "):
            return 401, "x-api-key header is required"
        if not headers.get("anthropic-version"):
            return 400, "invalid_request_error: anthropic-version header is required"
        for key in ("model", "max_tokens", "messages"):
            if key not in body:
                return 400, f"invalid_request_error: {key}: Field required"
        messages = body["messages"]
        for i, message in enumerate(messages):
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            if isinstance(content, str) and not content.strip():
                return 400, f"invalid_request_error: messages.{i}: text content blocks must be non-empty"
            for j, block in enumerate(blocks):
                if block.get("type") == "text" and not str(block.get("text") or "").strip():
                    return 400, (f"invalid_request_error: messages.{i}.content.{j}.text: text content blocks "
                                 "must contain non-whitespace text")
            uses = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            if uses and message.get("role") == "assistant":
                after = messages[i + 1] if i + 1 < len(messages) else {}
                answered = {b.get("tool_use_id") for b in after.get("content") or []
                            if isinstance(b, dict) and b.get("type") == "tool_result"}
                unanswered = [u for u in uses if u not in answered]
                if unanswered:
                    return 400, (f"invalid_request_error: messages.{i + 1}: tool_use ids were found without "
                                 f"tool_result blocks immediately after: {', '.join(map(str, unanswered))}")
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            if not results:
                continue
            before = messages[i - 1] if i else {}
            uses_before = {b.get("id") for b in before.get("content") or []
                           if isinstance(b, dict) and b.get("type") == "tool_use"}
            missing = [r for r in results if r not in uses_before]
            if before.get("role") != "assistant" or missing:
                return 400, f"invalid_request_error: messages.{i}: unexpected tool_use_id in tool_result: {missing}"
        return None

    @staticmethod
    def conversation(body: dict[str, Any]) -> Conversation:
        def user_turn(m: dict[str, Any]) -> bool:
            content = m.get("content")
            return m.get("role") == "user" and (isinstance(content, str) or not any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in content or []))
        return _conversation(body.get("messages") or [], user_turn)

    @staticmethod
    def error(status: int, message: str, kind: str | None = None) -> bytes:
        kind = kind or {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                        403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
                        529: "overloaded_error"}.get(status, "api_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    @staticmethod
    def stream_error(error: FakeStreamError) -> bytes:
        return _sse("error", {"type": "error", "error": {"type": error.type, "message": error.message}})

    @staticmethod
    def render(step: FakeStep, model: str, body: dict[str, Any], conv: Conversation) -> list[Piece]:
        usage = step.usage_for(conv.prompt_chars)
        start_usage = {"input_tokens": usage.input_tokens, "output_tokens": 1}
        if usage.cache_read_tokens or usage.cache_write_tokens:
            start_usage.update(cache_read_input_tokens=usage.cache_read_tokens,
                               cache_creation_input_tokens=usage.cache_write_tokens)
        out = [Piece(_sse("message_start", {"type": "message_start", "message": {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}}))]
        index = 0
        if step.text:
            out.append(Piece(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                          "content_block": {"type": "text", "text": ""}})))
            out.append(Piece(_sse("ping", {"type": "ping"})))
            out += [Piece(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                       "delta": {"type": "text_delta", "text": t}}), text=True)
                    for t in step.text]
            out.append(Piece(_sse("content_block_stop", {"type": "content_block_stop", "index": 0})))
            index = 1
        out += [Piece(_sse(None, frame)) for frame in step.extra_frames]
        if step.stream_error:
            return [*out, Piece(Anthropic.stream_error(step.stream_error))]
        for n, call in enumerate(step.tool_calls):
            at = index + n
            block = {"type": "tool_use", "id": call.id or f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name,
                     "input": {}}
            out.append(Piece(_sse("content_block_start", {"type": "content_block_start", "index": at,
                                                          "content_block": block})))
            pieces = ["", *_fragments(_arguments_text(call), call.fragments)]  # the API opens with ""
            out += [Piece(_sse("content_block_delta", {"type": "content_block_delta", "index": at, "delta": {
                "type": "input_json_delta", "partial_json": p}})) for p in pieces]
            out.append(Piece(_sse("content_block_stop", {"type": "content_block_stop", "index": at})))
        out.append(Piece(_sse("message_delta", {"type": "message_delta", "delta": {
            "stop_reason": step.stop(), "stop_sequence": None}, "usage": {"output_tokens": usage.output_tokens}})))
        out.append(Piece(_sse("message_stop", {"type": "message_stop"})))
        return out


class OpenAI:
    name = "openai"
    content_type = "text/event-stream"
    _STOP = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}

    @staticmethod
    def check(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str] | None:
        if not headers.get("authorization", "").startswith("Bearer "):
            return 401, "You didn't provide an API key."
        for key in ("model", "messages"):
            if key not in body:
                return 400, f"Missing required parameter: '{key}'."
        messages = body["messages"]
        for i, message in enumerate(messages):
            calls = [c.get("id") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            if message.get("role") == "assistant" and calls:
                answered = set()
                for after in messages[i + 1:]:
                    if after.get("role") != "tool":
                        break
                    answered.add(after.get("tool_call_id"))
                unanswered = [c for c in calls if c not in answered]
                if unanswered:
                    return 400, ("An assistant message with 'tool_calls' must be followed by tool messages "
                                 "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                                 f"response messages: {', '.join(map(str, unanswered))}")
            if message.get("role") != "tool":
                continue
            j = i - 1
            while j >= 0 and messages[j].get("role") == "tool":
                j -= 1
            asked = {c.get("id") for c in (messages[j].get("tool_calls") or [])} if j >= 0 else set()
            if j < 0 or messages[j].get("role") != "assistant" or message.get("tool_call_id") not in asked:
                return 400, (f"Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                             f"message with 'tool_calls' (messages[{i}]).")
        return None

    @staticmethod
    def conversation(body: dict[str, Any]) -> Conversation:
        return _conversation(body.get("messages") or [], lambda m: m.get("role") == "user")

    @staticmethod
    def error(status: int, message: str, kind: str | None = None) -> bytes:
        kind = kind or {401: "invalid_api_key", 429: "rate_limit_exceeded",
                        400: "invalid_request_error"}.get(status, "server_error")
        return _dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}}).encode()

    @staticmethod
    def stream_error(error: FakeStreamError) -> bytes:
        return _sse(None, {"error": {"message": error.message, "type": "server_error", "param": None, "code": None}})

    @staticmethod
    def render(step: FakeStep, model: str, body: dict[str, Any], conv: Conversation) -> list[Piece]:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not step.usage_omitted
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": model, "system_fingerprint": "fp_fake"}
        if include_usage:
            base["usage"] = None  # as the API does: null on every chunk but the last

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(None, {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                    "finish_reason": finish}]})

        out = [Piece(chunk({"role": "assistant", "content": ""}))]
        out += [Piece(chunk({"content": t}), text=True) for t in step.text]
        out += [Piece(_sse(None, frame)) for frame in step.extra_frames]
        if step.stream_error:
            return [*out, Piece(OpenAI.stream_error(step.stream_error))]
        out += [Piece(chunk({"tool_calls": parts})) for parts in OpenAI._tool_deltas(step)]
        usage = step.usage_for(conv.prompt_chars)
        prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
        usage_body = {"prompt_tokens": prompt, "completion_tokens": usage.output_tokens,
                      "total_tokens": prompt + usage.output_tokens,
                      "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens}}
        if include_usage and step.usage_with_finish:  # some compatible servers fold it in
            out.append(Piece(_sse(None, {**base, "usage": usage_body, "choices": [
                {"index": 0, "delta": {}, "logprobs": None, "finish_reason": OpenAI._STOP[step.stop()]}]})))
        else:
            out.append(Piece(chunk({}, OpenAI._STOP[step.stop()])))
            if include_usage:
                out.append(Piece(_sse(None, {**base, "choices": [], "usage": usage_body})))
        out.append(Piece(_sse(None, "[DONE]")))
        return out

    @staticmethod
    def _tool_deltas(step: FakeStep) -> list[list[dict[str, Any]]]:
        """The ``tool_calls`` of each chunk: per call an opening delta then its argument fragments
        (``sequential``), or one fragment of every call per chunk (``interleaved``)."""
        calls = []
        for n, call in enumerate(step.tool_calls):
            opening = {"index": n, "id": call.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            fragments = [{"index": n, "function": {"arguments": p}}
                         for p in _fragments(_arguments_text(call), call.fragments)]
            calls.append([opening, *fragments])
        if step.tool_call_style == "no_index":
            calls = [[{k: v for k, v in part.items() if k != "index"} for part in parts] for parts in calls]
        if step.tool_call_style != "interleaved":
            return [[part] for parts in calls for part in parts]
        longest = max((len(parts) for parts in calls), default=0)
        return [[parts[i] for parts in calls if i < len(parts)] for i in range(longest)]


class Ollama:
    name = "ollama"
    content_type = "application/x-ndjson"

    @staticmethod
    def check(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, str] | None:
        if not body.get("model"):
            return 400, "model is required"
        return None

    @staticmethod
    def conversation(body: dict[str, Any]) -> Conversation:
        def user_turn(m: dict[str, Any]) -> bool:
            return m.get("role") == "user" and not str(m.get("content") or "").startswith(_RESULT_PREFIX)
        return _conversation(body.get("messages") or [], user_turn)

    @staticmethod
    def error(status: int, message: str, kind: str | None = None) -> bytes:
        return _dumps({"error": message}).encode()  # Ollama's errors are a bare message

    @staticmethod
    def stream_error(error: FakeStreamError) -> bytes:
        return (_dumps({"error": error.message}) + "\n").encode()

    @staticmethod
    def render(step: FakeStep, model: str, body: dict[str, Any], conv: Conversation) -> list[Piece]:
        native = bool(body.get("tools"))

        def line(message: dict[str, Any], **extra: Any) -> bytes:
            return (_dumps({"model": model, "created_at": _now(), "message": {"role": "assistant", **message},
                            "done": False, **extra}) + "\n").encode()

        out = [Piece(line({"content": t}), text=True) for t in step.text]
        out += [Piece((_dumps(frame) + "\n").encode()) for frame in step.extra_frames]
        if step.stream_error:
            return [*out, Piece(Ollama.stream_error(step.stream_error))]
        for call in step.tool_calls:
            if native and call.arguments_raw is None:
                out.append(Piece(line({"content": "", "tool_calls": [
                    {"function": {"name": call.name, "arguments": call.arguments}}]})))
            else:  # the model writes the marker as text (pseudo-tools), or garbles it
                out.append(Piece(line({"content": f"<<TOOL name=\"{call.name}\" args='{_arguments_text(call)}'>>"}),
                                 text=True))
        usage = step.usage_for(conv.prompt_chars)
        out.append(Piece((_dumps({
            "model": model, "created_at": _now(), "message": {"role": "assistant", "content": ""}, "done": True,
            "done_reason": "length" if step.stop() == "max_tokens" else "stop", "total_duration": 1_000_000,
            "load_duration": 1000, "prompt_eval_count": usage.input_tokens, "prompt_eval_duration": 1000,
            "eval_count": usage.output_tokens, "eval_duration": 1000}) + "\n").encode()))
        return out

    @staticmethod
    def tags(models: list[str]) -> bytes:
        return _dumps({"models": [
            {"name": m, "model": m, "modified_at": "2026-01-01T00:00:00Z", "size": 1_000_000,
             "digest": uuid.uuid5(uuid.NAMESPACE_URL, m).hex * 2,
             "details": {"parent_model": "", "format": "gguf", "family": "fake", "families": ["fake"],
                         "parameter_size": "1B", "quantization_level": "Q4_0"}}
            for m in models]}).encode()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


FORMATS: dict[str, WireFormat] = {"/v1/messages": Anthropic, "/v1/chat/completions": OpenAI,
                                  "/chat/completions": OpenAI, "/api/chat": Ollama}
