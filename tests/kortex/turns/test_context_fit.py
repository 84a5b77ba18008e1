"""Each LLM call of a step fits its model's context window and the session's token cap: the
oldest of the history is left out of what is sent (never a call without its result, never the
question), the model is told, and a call that cannot fit, or would pass the cap, is refused
before it is made with an error the client reads. Through the vendors' real wire formats (the
fake vendor server)."""

from __future__ import annotations

import json
from typing import Any

from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.prompts import CONTEXT_CUT
from kortex.testing.fakellm import FakeLLM
from kortex.turns import chat
from kortex.turns.context import cut
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

MODEL = "openai:gpt-4o"  # 128k tokens of context
NOTE = CONTEXT_CUT.split("{")[0]


def _harness(harness_factory: Any, fake: FakeLLM, **overrides: Any) -> Harness:
    llm = overrides.pop("llm", {})
    openai = {**vendor_config("openai", fake.url, max_retries=0), **overrides.pop("openai", {})}
    providers = {"openai": openai, "anthropic": vendor_config("anthropic", fake.url, max_retries=0)}
    return harness_factory(llm={"providers": providers, **llm}, **overrides)  # type: ignore[no-any-return]


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def _big_calls(n: int, repeat: int = 100, prefix: str = "call") -> list[dict[str, Any]]:
    """n calls whose results are each about 2 KB x repeat (64 KiB at most: the result cap)."""
    return [{"id": f"{prefix}_{i}", "name": "debug_echo", "arguments": {"text": f"{i}" + "y" * 2000, "repeat": repeat}}
            for i in range(n)]


def _pairs_whole(messages: list[dict[str, Any]]) -> bool:
    """Every tool result answers a call of the assistant message before it, and every call is answered."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            if m["tool_call_id"] not in open_calls:
                return False
            open_calls.discard(m["tool_call_id"])
            continue
        if open_calls:
            return False
        open_calls = {c["id"] for c in m.get("tool_calls") or ()}
    return not open_calls


def test_a_request_sent_to_a_pinned_model_fits_its_context_window(harness_factory: Any, fake: FakeLLM) -> None:
    """(From the bounds audit.) 16 results at the 64 KiB cap come to ~270k tokens for a 128k model."""
    fake.add("gpt-4o", {"steps": [{"text": ["Reading."], "tool_calls": _big_calls(16)}, {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant("ctx")
    turn = h.ask(tenant, "why?", model=MODEL)
    assert turn.status == "done", turn.error
    sent = fake.requests[-1].body["messages"]
    prompt_chars = len(json.dumps(sent))
    assert prompt_chars // 4 <= 128_000, f"sent ~{prompt_chars // 4} tokens to a 128k-token model"
    # What was sent: the question, a note in place of the oldest results, the newest results whole.
    assert [m["content"] for m in sent if m["role"] == "user"][0] == "why?"
    assert any(m["role"] == "user" and m["content"].startswith(NOTE) for m in sent)
    results = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert results and results[-1] == "call_15" and len(results) < 16
    assert _pairs_whole(sent)
    # The stored conversation keeps everything.
    stored = h.messages(tenant, turn.session_id)
    assert sum(1 for m in stored if m.role == "tool") == 16


def test_a_turn_overshoots_the_session_token_cap_by_at_most_one_answer(harness_factory: Any, fake: FakeLLM) -> None:
    """(From the bounds audit.) The cap was checked against what was spent only: one call could pass it
    by its whole prompt (~270k tokens against a 200k cap)."""
    fake.add("gpt-4o", {"steps": [{"text": ["Reading."], "tool_calls": _big_calls(16)}, {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant("cap")
    turn = h.ask(tenant, "why?", model=MODEL)
    spent = turn.input_tokens + turn.output_tokens
    cap = h.settings.llm.budget.per_session_token_cap
    assert spent <= cap + 4096, f"the session spent {spent} tokens against a cap of {cap}"


def test_a_call_that_would_pass_the_session_cap_is_refused_before_it_is_made(harness_factory: Any,
                                                                             fake: FakeLLM) -> None:
    fake.add("gpt-4o", {"steps": [{"text": ["Reading."], "tool_calls": _big_calls(1, repeat=30)},
                                  {"text": ["Done."]}]})
    h = _harness(harness_factory, fake, llm={"budget": {"per_session_token_cap": 30_000}})
    tenant = h.tenant("cap")
    turn = h.ask(tenant, "why?", model=MODEL)
    assert len(fake.requests) == 1  # the second call (a ~60 KB result: ~30k tokens) was never made
    assert turn.status == "failed" and turn.error["code"] == "budget_exceeded"
    error = next(e for e in _events(h, turn.id) if e["type"] == "error")
    assert error["code"] == "budget_exceeded" and "30000 tokens" in error["message"] and not error["retryable"]
    assert turn.input_tokens + turn.output_tokens <= 30_000


def _small_model(**extra: Any) -> dict[str, Any]:
    # A model the catalogue does not know, with the window the configuration gives it.
    return {"openai": {"model": "tiny", "context_tokens": 16_000, "max_tokens": 1000, **extra},
            "turn": {"max_message_chars": 100_000}}


def test_a_question_no_window_holds_fails_the_step_before_any_call(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add("tiny", {"steps": [{"text": ["Done."]}]})
    h = _harness(harness_factory, fake, **_small_model())
    tenant = h.tenant("long")
    turn = h.ask(tenant, "why is checkout slow? " + "here is the log: " * 4000, model="openai:tiny")
    assert not fake.requests  # no vendor 400: nothing was sent
    assert turn.status == "failed" and turn.error["code"] == "context_too_long"
    error = next(e for e in _events(h, turn.id) if e["type"] == "error")
    assert error["code"] == "context_too_long" and "tiny's context window of 16000" in error["message"]


def test_a_fallback_with_a_larger_window_answers_what_the_first_cannot_hold(harness_factory: Any,
                                                                            fake: FakeLLM) -> None:
    fake.add("claude-opus-4-6", {"steps": [{"text": ["Done."]}]})
    h = _harness(harness_factory, fake, llm={"fallback_providers": ["anthropic"]}, **_small_model())
    tenant = h.tenant("long")
    turn = h.ask(tenant, "why is checkout slow? " + "here is the log: " * 4000, model="openai:tiny")
    assert turn.status == "done", turn.error
    assert [r.path for r in fake.requests] == ["/v1/messages"]  # the small model was never called
    notice = next(e for e in _events(h, turn.id) if e["type"] == "error")
    assert notice["code"] == "provider_failover" and "context window" in notice["message"]


def test_earlier_turns_go_first_and_the_model_is_told(harness_factory: Any, fake: FakeLLM) -> None:
    fake.add("tiny", {"steps": [{"tool_calls": _big_calls(1, repeat=5)}, {"text": ["First."]}]})
    h = _harness(harness_factory, fake, **_small_model())
    tenant = h.tenant("turns")
    first = h.ask(tenant, "first question", model="openai:tiny")
    fake.add("tiny", {"steps": [{"tool_calls": _big_calls(1, repeat=5, prefix="later")}, {"text": ["Second."]}]})
    second = h.ask(tenant, "second question", model="openai:tiny", session_id=first.session_id)
    assert second.status == "done", second.error
    sent = fake.requests[-1].body["messages"]
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert "first question" not in users and "second question" in users
    # in place of the first turn (question, call and result, answer), before the question
    assert users[0].startswith(NOTE) and "2 earlier messages and 1 tool calls with" in users[0]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["later_0"] and _pairs_whole(sent)


def test_a_small_window_keeps_an_eighth_for_the_answer_and_lowers_max_tokens_to_fit(harness_factory: Any,
                                                                                    fake: FakeLLM) -> None:
    """Ollama's default window (8192) holds ~5.5k tokens of instructions and tool schemas: the
    answer gets what is left (at least 1024), not the configured 4096 that would not fit."""
    fake.add("llama3.2", {"steps": [{"text": ["Local answer."]}]})
    h = harness_factory(llm={"providers": {"ollama": vendor_config("ollama", fake.url, max_retries=0)}})
    turn = h.ask(h.tenant("local"), "why?", model="ollama:llama3.2")
    assert turn.status == "done", turn.error
    body = fake.requests[-1].body
    options = body["options"]
    assert options["num_ctx"] == 8192 and 1024 <= options["num_predict"] < 4096
    prompt = len(json.dumps([body["messages"], body.get("tools")])) // 4
    assert body["tools"] and prompt + options["num_predict"] <= 8192


# ---- the cut itself --------------------------------------------------------------------------

def _call(n: int, size: int) -> tuple[AssistantMessage, ToolMessage]:
    call = ToolCall(id=f"c{n}", name="get_logs", arguments={"n": n})
    return (AssistantMessage(content=f"calling {n}", tool_calls=(call,)),
            ToolMessage(result=ToolResult(call_id=f"c{n}", name="get_logs", content={"rows": "x" * size})))


def test_a_history_that_fits_is_sent_as_it_is() -> None:
    history = (UserMessage(content="why?"), *_call(1, 100))
    kept, tokens = cut(history, 10_000)
    assert kept is history and 50 < tokens < 200


def test_calls_go_with_their_results_oldest_first_and_the_question_stays() -> None:
    calls = tuple(ToolCall(id=f"c{n}", name="get_logs", arguments={}) for n in range(4))
    results = tuple(ToolMessage(result=ToolResult(call_id=f"c{n}", name="get_logs", content={"rows": "x" * 2000}))
                    for n in range(4))
    history: tuple[Message, ...] = (UserMessage(content="why?"), AssistantMessage(content="Reading.", tool_calls=calls),
                                    *results)
    kept, tokens = cut(history, 2_400)
    assert kept is not None and tokens <= 2_400
    assert kept[0] == history[0] and isinstance(kept[1], UserMessage) and kept[1].content.startswith(NOTE)
    assistant = kept[2]
    assert isinstance(assistant, AssistantMessage) and assistant.content == "Reading."
    assert [c.id for c in assistant.tool_calls] == ["c2", "c3"]
    assert [m.result.call_id for m in kept[3:] if isinstance(m, ToolMessage)] == ["c2", "c3"]
    assert "window: 2 tool calls with their results." in kept[1].content


def test_a_re_ask_keeps_the_question_it_follows_and_what_cannot_fit_is_none() -> None:
    question = UserMessage(content="why?")
    history = (UserMessage(content="old"), AssistantMessage(content="old answer"), question, *_call(1, 4000),
               AssistantMessage(content="It is the pool."), UserMessage(content="cite your calls"))
    kept, _ = cut(history, 200, keep=(question,))
    assert kept is not None and kept[1] is question and kept[-1] == history[-1]
    assert isinstance(kept[0], UserMessage) and kept[0].content.startswith(NOTE)
    assert not any(isinstance(m, ToolMessage) for m in kept)
    nothing, minimum = cut(history, 20, keep=(question,))
    assert nothing is None and minimum > 20


def test_what_is_sent_is_the_scrubbed_messages_measured_as_stored() -> None:
    history = (UserMessage(content="old"), UserMessage(content="key sk-live-123 why?"))
    sent = (UserMessage(content="old"), UserMessage(content="key [redacted] why?"))
    kept, _ = cut(history, 40, sent=sent)
    assert kept is not None and kept[-1] is sent[1]


def test_the_newest_result_of_the_turn_stays_or_nothing_is_sent() -> None:
    # Dropped, the model would ask for it again, step after step: a result the window cannot hold
    # fails the step (None) rather than being left out.
    history = (UserMessage(content="why?"), *_call(1, 200), *_call(2, 40_000))
    nothing, minimum = cut(history, 5_000)
    assert nothing is None and minimum > 5_000
    kept, _ = cut(history, minimum + 40)  # room for the question, the newest result and the note
    assert kept is not None and isinstance(kept[-1], ToolMessage) and kept[-1].result.call_id == "c2"
    assert [m.result.call_id for m in kept if isinstance(m, ToolMessage)] == ["c2"]


def test_a_result_larger_than_the_window_fails_the_turn_instead_of_asking_again(harness_factory: Any,
                                                                                fake: FakeLLM) -> None:
    # The scripted model asks once, then answers: had its result been left out, every step would
    # have looked like the first to it (with a real model: the same call again), up to max_tool_depth.
    fake.add("tiny", {"steps": [{"tool_calls": _big_calls(1, repeat=30)}, {"text": ["Answer."]}]})
    h = _harness(harness_factory, fake, **_small_model())
    turn = h.ask(h.tenant("huge"), "why?", model="openai:tiny")
    assert turn.status == "failed" and turn.error["code"] == "context_too_long", turn.error
    assert len(fake.requests) == 1  # the call that asked; the result never went out cut away


def test_a_routed_turn_is_cut_to_the_window_its_session_outgrew_not_refused(harness_factory: Any,
                                                                          fake: FakeLLM) -> None:
    # The session's earlier turns no longer fit any candidate's window, its new question does:
    # routing weighs what the cut cannot leave out (the turn's own), and the step is cut to fit.
    # It answered no_route before, the whole session weighed against every window.
    fake.add("tiny", {"steps": [{"text": ["First."]}]})
    h = _harness(harness_factory, fake, llm={"routing": {"candidates": ["openai::tiny"]}}, **_small_model())
    tenant = h.tenant("grown")
    session = chat.create_session(h.k, tenant, "s", "auto")
    for n in range(3):  # ~12k tokens each: together past tiny's 16k window
        fake.add("tiny", {"steps": [{"text": [f"Answer {n}. " + "detail " * 6000]}]})
        assert h.ask(tenant, f"question {n}?", session_id=session.id).status == "done"
    fake.add("tiny", {"steps": [{"text": ["Latest."]}]})
    turn = h.ask(tenant, "and now?", session_id=session.id)
    assert turn.status == "done", turn.error
    sent = fake.requests[-1].body["messages"]
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users[-1] == "and now?" and users[0].startswith(NOTE)
