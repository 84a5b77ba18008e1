"""Bounds on the tool calls of one answer, held where every provider's calls enter Kortex
(kortex/turns/consume.py), through each vendor's wire format from the fake LLM server: one
per-call bound on argument bytes whichever adapter built the call, argument bytes counted with
the text toward ``llm.max_answer_chars``, calls past ``max_tool_calls_per_step`` kept without
their arguments, and arguments nested too deeply answered ``invalid_json`` instead of failing
the turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kortex.messages import ToolCall
from kortex.nesting import MAX_DEPTH
from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from kortex.turns.consume import storable
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

VENDORS = ("anthropic", "openai", "ollama")
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "ollama": "llama3.2"}


def _harness(harness_factory: Any, fake: FakeLLM, **llm: Any) -> Harness:
    providers = {v: vendor_config(v, fake.url, max_retries=0) for v in VENDORS}
    return harness_factory(llm={"providers": providers, **llm})  # type: ignore[no-any-return]


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def _answer_with_call(vendor: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A step whose one call carries ``arguments``. Anthropic's come whole in the tool_use block's
    ``input`` (``content_block_start``), not as ``input_json_delta`` fragments: the path that had
    no per-call bound. The others as each vendor sends them (OpenAI fragments, Ollama parsed)."""
    if vendor == "anthropic":
        block = {"type": "tool_use", "id": "toolu_whole", "name": "debug_echo", "input": arguments}
        return {"text": ["Reading."], "stop_reason": "tool_use", "extra_frames": [
            {"type": "content_block_start", "index": 1, "content_block": block},
            {"type": "content_block_stop", "index": 1}]}
    return {"text": ["Reading."], "tool_calls": [{"id": "c1", "name": "debug_echo", "arguments": arguments}]}


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_calls_arguments_past_the_per_call_bound_fail_the_answer_for_every_vendor(
        harness_factory: Any, fake: FakeLLM, vendor: str) -> None:
    fake.add(MODELS[vendor], {"steps": [_answer_with_call(vendor, {"text": "q" * 300_000}), {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant(f"big-{vendor}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{MODELS[vendor]}")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid", turn.error
    assert not [e for e in _events(h, turn.id) if e["type"] == "tool_call"]
    assert [m.role for m in h.messages(tenant, turn.session_id)] == ["user"]  # nothing of the answer kept
    with h.k.db.connect() as conn:
        [row] = [r for r in audit.list_for_turn(conn, tenant, turn.id) if r["kind"] == "llm_call"]
    # The vendor call itself failed, as it does for streamed fragments past the bound.
    assert not row["ok"] and row["payload"]["error_code"] == "stream_invalid"


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_call_under_the_per_call_bound_runs_for_every_vendor(harness_factory: Any, fake: FakeLLM,
                                                                  vendor: str) -> None:
    fake.add(MODELS[vendor], {"steps": [_answer_with_call(vendor, {"text": "q" * 100_000}), {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant(f"fits-{vendor}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{MODELS[vendor]}")
    # (What the next step may send is the context's and the budget's business, not this bound's.)
    events = _events(h, turn.id)
    call = next(e for e in events if e["type"] == "tool_call")
    assert len(call["arguments"]["text"]) == 100_000  # debug_echo's most
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["call_id"] == call["call_id"] and not result["is_error"], result


def test_tool_call_arguments_count_toward_max_answer_chars_with_the_text(harness_factory: Any,
                                                                          fake: FakeLLM) -> None:
    """40 calls of 100 kB each: 4 MB of arguments against a 1,000,000-character answer."""
    calls = [{"id": f"call_{n}", "name": "debug_echo", "arguments": {"text": f"{n}" + "z" * 100_000}, "fragments": 4}
             for n in range(40)]
    fake.add("gpt-4o", {"steps": [{"text": ["Reading."], "tool_calls": calls}, {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant("many")
    turn = h.ask(tenant, "why?", model="openai:gpt-4o")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid"
    assert "llm.max_answer_chars" in turn.error["message"]
    assert not [e for e in _events(h, turn.id) if e["type"] == "tool_call"]
    assert [m.role for m in h.messages(tenant, turn.session_id)] == ["user"]
    assert len(fake.requests) == 1  # not re-sent


@pytest.mark.parametrize(("argument_chars", "status"), [(400, "done"), (700, "failed")])
def test_text_and_arguments_share_the_answers_bound(harness_factory: Any, fake: FakeLLM, argument_chars: int,
                                                    status: str) -> None:
    """500 characters of text and one call: within 1,000 together the answer stands, past them it
    fails, though each alone is within."""
    fake.add("gpt-4o", {"steps": [
        {"text": ["t" * 500], "tool_calls": [{"id": "c1", "name": "debug_echo",
                                              "arguments": {"text": "a" * (argument_chars - 11)}}]},
        {"text": ["Done."]}]})  # {"text":"..."} is 11 characters more
    h = _harness(harness_factory, fake, max_answer_chars=1_000)
    tenant = h.tenant(f"shared-{argument_chars}")
    turn = h.ask(tenant, "why?", model="openai:gpt-4o")
    assert turn.status == status, turn.error


def test_calls_past_the_per_step_cap_keep_their_id_and_name_not_their_arguments(harness_factory: Any,
                                                                                fake: FakeLLM) -> None:
    calls = [{"id": f"call_{n}", "name": "debug_echo", "arguments": {"text": f"{n}" + "w" * 1000}} for n in range(4)]
    fake.add("gpt-4o", {"steps": [{"tool_calls": calls}, {"text": ["Done."]}]})
    h = _harness(harness_factory, fake, max_tool_calls_per_step=2)
    tenant = h.tenant("cap")
    turn = h.ask(tenant, "why?", model="openai:gpt-4o")
    assert turn.status == "done", turn.error
    events = _events(h, turn.id)
    published = {e["call_id"]: e["arguments"] for e in events if e["type"] == "tool_call"}
    assert published == {"call_0": {"text": "0" + "w" * 1000}, "call_1": {"text": "1" + "w" * 1000},
                         "call_2": {}, "call_3": {}}
    refused = {e["call_id"] for e in events if e["type"] == "tool_result" and e["error_code"] == "too_many_calls"}
    assert refused == {"call_2", "call_3"}
    [stored] = [m for m in h.messages(tenant, turn.session_id) if m.role == "assistant" and m.tool_calls]
    assert [(c["id"], c["name"], c["arguments"]) for c in stored.tool_calls[2:]] == [
        ("call_2", "debug_echo", {}), ("call_3", "debug_echo", {})]
    # What the model is sent next: the refused calls by id and name, and why they were refused.
    [assistant] = [m for m in fake.requests[-1].body["messages"] if m.get("tool_calls")]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"][2:]] == [
        ("call_2", "debug_echo", "{}"), ("call_3", "debug_echo", "{}")]


@pytest.mark.parametrize("vendor", VENDORS)
def test_deeply_nested_arguments_are_an_invalid_call_the_model_is_told_about(harness_factory: Any, fake: FakeLLM,
                                                                             vendor: str) -> None:
    """300 levels parse, but no event or audit row could carry them (pydantic stops near 254):
    the turn failed as ``internal``."""
    fake.add(MODELS[vendor], {"steps": [_answer_with_call(vendor, _nested(300)), {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant(f"deep-{vendor}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{MODELS[vendor]}")
    assert turn.status == "done", turn.error
    events = _events(h, turn.id)
    [call] = [e for e in events if e["type"] == "tool_call"]
    [result] = [e for e in events if e["type"] == "tool_result"]
    assert call["arguments"] == {} and (result["is_error"], result["error_code"]) == (True, "invalid_json")
    assert "invalid_json" in json.dumps(fake.requests[-1].body)  # the model read why


def test_arguments_may_nest_max_depth_levels_and_no_more() -> None:
    def depth(n: int) -> dict[str, Any]:  # the arguments object is the first level
        return {"text": "hi", "more": _nested(n - 1)}

    at_limit = storable(ToolCall(id="c1", name="debug_echo", arguments=depth(MAX_DEPTH)))
    assert at_limit.arguments_error is None and at_limit.arguments == depth(MAX_DEPTH)
    past = storable(ToolCall(id="c2", name="debug_echo", arguments=depth(MAX_DEPTH + 1)))
    assert (past.arguments, past.arguments_error) == ({}, "invalid_json")
    lists: Any = []
    for _ in range(MAX_DEPTH):
        lists = [lists]
    assert storable(ToolCall(id="c3", name="x", arguments={"l": lists})).arguments_error == "invalid_json"
