"""Bounds on one tool call's arguments that every vendor adapter shares (kortex/llm/convert.py,
``parse_arguments``): arguments that came whole (Anthropic's ``tool_use`` input, Ollama's parsed
object or its text) are held to ``MAX_ARGUMENT_BYTES`` as streamed fragments are, and nesting
past ``MAX_DEPTH`` is an ``invalid_json`` call, never a RecursionError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kortex.errors import ProviderError
from kortex.llm.convert import MAX_ARGUMENT_BYTES, CallAssembler, parse_arguments
from kortex.nesting import MAX_DEPTH

OVERHEAD = len('{"t":""}')


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("as_text", [False, True])
def test_arguments_that_came_whole_are_held_to_the_per_call_bound(as_text: bool) -> None:
    def raw(size: int) -> Any:
        arguments = {"t": "q" * (size - OVERHEAD)}
        return json.dumps(arguments, separators=(",", ":")) if as_text else arguments

    assert parse_arguments("c1", "get_logs", raw(MAX_ARGUMENT_BYTES)).arguments_error is None
    with pytest.raises(ProviderError) as caught:
        parse_arguments("c1", "get_logs", raw(MAX_ARGUMENT_BYTES + 1))
    assert caught.value.code == "stream_invalid"
    assert caught.value.detail == f"tool call arguments longer than {MAX_ARGUMENT_BYTES} bytes"


def test_anthropics_tool_use_input_is_held_to_the_bound_like_its_fragments() -> None:
    calls = CallAssembler()
    calls.start(0, "toolu_1", "get_logs", {"t": "q" * MAX_ARGUMENT_BYTES})
    with pytest.raises(ProviderError, match="malformed"):
        calls.finish(0)


@pytest.mark.parametrize("as_text", [False, True])
def test_arguments_nested_past_the_limit_are_invalid_json(as_text: bool) -> None:
    def raw(depth: int) -> Any:  # the arguments object is the first level
        if as_text:  # written out: json.dumps itself cannot go 5,000 deep
            return '{"t":' + '{"a":' * (depth - 1) + '"x"' + "}" * depth
        return {"t": _nested(depth - 1)}

    assert parse_arguments("c1", "x", raw(MAX_DEPTH)).arguments == {"t": _nested(MAX_DEPTH - 1)}
    for depth in (MAX_DEPTH + 1, 300, 5_000):  # 5,000: past json's own recursion, decoding and encoding
        call = parse_arguments("c1", "x", raw(depth))
        assert (call.arguments, call.arguments_error) == ({}, "invalid_json"), depth


def test_arguments_with_a_lone_surrogate_are_measured_not_refused() -> None:
    """Ollama's parsed arguments may hold one (the step replaces it): no UTF-8 encoder takes it."""
    call = parse_arguments("c1", "get_logs", {"product": "check\udfffout"})
    assert call.arguments == {"product": "check\udfffout"} and call.arguments_error is None
    with pytest.raises(ProviderError):
        parse_arguments("c1", "get_logs", {"product": "\udfff" * MAX_ARGUMENT_BYTES})
