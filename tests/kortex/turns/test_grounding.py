"""The server checks every final answer's citations against its turn: a citation of no call of
the turn, or of a failed call, is dangling; a quoted number found in no result is flagged; the
strict policy asks the model once more. Through real turns, with a model speaking a vendor's
wire format (the fake server) and the checker on its own."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from kortex.messages import AssistantMessage, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.storage.schema import chat_messages, decisions
from kortex.testing.fakellm import FakeLLM
from kortex.turns.grounding import check
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

DEPLOYS = {"product": "checkout", "time_range": "last 2h"}
MODEL = "claude-opus-4-6"  # the anthropic default in tests/kortex/llm/conftest.py


def _harness(harness_factory: Any, fake: FakeLLM, policy: str = "warn") -> Harness:
    providers = {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)}
    return harness_factory(llm={"providers": providers, "default_provider": "anthropic",  # type: ignore[no-any-return]
                                "grounding": {"policy": policy}})


def _events(h: Harness, turn_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def _final_message(h: Harness, turn_id: str) -> Any:
    with h.k.db.connect() as conn:
        return conn.execute(select(chat_messages.c.content, chat_messages.c.grounding).where(
            chat_messages.c.turn_id == turn_id, chat_messages.c.role == "assistant")
            .order_by(chat_messages.c.step.desc())).first()


def _two_calls_then(text: list[str], *more: dict[str, Any]) -> dict[str, Any]:
    """A deploys call that works and one the tool pipeline refuses (bad arguments), then ``text``."""
    return {"steps": [
        {"tool_calls": [{"id": "toolu_good", "name": "get_recent_deploys", "arguments": DEPLOYS},
                        {"id": "toolu_bad", "name": "get_recent_deploys", "arguments": {"product": 42}}]},
        {"text": text}, *more]}


def test_a_dangling_and_a_failed_call_citation_are_flagged_on_done_and_on_the_stored_answer(
        harness_factory, fake: FakeLLM) -> None:
    fake.add(MODEL, _two_calls_then(["The deploy broke it [toolu_good]; ",
                                                   "see also [toolu_bad] and [toolu_made_up]."]))
    h = _harness(harness_factory, fake)
    turn = h.ask(h.tenant("acme"), "Why is checkout slow?")
    assert turn.status == "done"  # warn: the answer stands
    events = _events(h, turn.id)
    done = events[-1]
    assert done["citations"] == [{"id": "toolu_good", "tool": "get_recent_deploys", "ok": True},
                                 {"id": "toolu_bad", "tool": "get_recent_deploys", "ok": False},
                                 {"id": "toolu_made_up", "tool": None, "ok": False}]
    assert done["grounding"] == {"cited": 1, "dangling": ["toolu_bad", "toolu_made_up"], "uncited_numbers": []}
    notice = events[-2]
    assert notice["type"] == "error" and notice["code"] == "ungrounded_answer" and not notice["fatal"]
    assert "toolu_bad" in notice["message"] and "toolu_made_up" in notice["message"]
    stored = _final_message(h, turn.id)
    assert stored.grounding["dangling"] == ["toolu_bad", "toolu_made_up"] and len(stored.grounding["citations"]) == 3


def test_a_number_found_in_no_result_is_flagged(harness_factory, fake: FakeLLM) -> None:
    fake.add(MODEL, _two_calls_then(["Errors rose 731% after the deploy [toolu_good]."]))
    h = _harness(harness_factory, fake)
    flagged = h.ask(h.tenant("acme"), "Why is checkout slow?")
    assert _events(h, flagged.id)[-1]["grounding"] == {"cited": 1, "dangling": [], "uncited_numbers": ["731"]}


def test_a_grounded_answer_carries_its_citations_and_no_notice(harness_factory, fake: FakeLLM) -> None:
    fake.add(MODEL, _two_calls_then(["A deploy of checkout [toolu_good] preceded it."]))
    h = _harness(harness_factory, fake)
    clean = h.ask(h.tenant("acme"), "Why is checkout slow?")
    events = _events(h, clean.id)
    assert events[-1]["grounding"] == {"cited": 1, "dangling": [], "uncited_numbers": []}
    assert events[-1]["citations"] == [{"id": "toolu_good", "tool": "get_recent_deploys", "ok": True}]
    assert "ungrounded_answer" not in [e.get("code") for e in events]


def test_strict_asks_the_model_once_more_and_keeps_the_second_answer(harness_factory, fake: FakeLLM) -> None:
    fake.add(MODEL, _two_calls_then(
        ["It was the cache [toolu_invented]."],
        {"text": ["A deploy of checkout [toolu_good] preceded it."]}))
    h = _harness(harness_factory, fake, policy="strict")
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "Why is checkout slow?")
    events = _events(h, turn.id)
    kinds = [(e["type"], e.get("code")) for e in events]
    assert ("error", "ungrounded_answer") in kinds  # the client is told the first answer is replaced
    assert events[-1]["grounding"] == {"cited": 1, "dangling": [], "uncited_numbers": []}
    assert _final_message(h, turn.id).content == "A deploy of checkout [toolu_good] preceded it."
    reask = fake.requests[-1].body["messages"][-1]
    assert reask["role"] == "user" and "toolu_invented" in json.dumps(reask) and "toolu_good" in json.dumps(reask)
    assert "tools" not in fake.requests[-1].body or not fake.requests[-1].body["tools"]  # no new tool calls
    with h.k.db.connect() as conn:
        calls = conn.execute(select(decisions.c.ok).where(decisions.c.turn_id == turn.id,
                                                          decisions.c.kind == "llm_call")).all()
    assert len(calls) == 3 and all(c.ok for c in calls)  # the tool round, the answer and the re-ask: all billed


def test_strict_flags_what_the_second_answer_still_gets_wrong(harness_factory, fake: FakeLLM) -> None:
    fake.add(MODEL, _two_calls_then(["It was [toolu_invented]."],
                                                  {"text": ["Still [toolu_invented]."]}))
    h = _harness(harness_factory, fake, policy="strict")
    turn = h.ask(h.tenant("acme"), "Why is checkout slow?")
    assert turn.status == "done"
    done = _events(h, turn.id)[-1]
    assert done["grounding"]["dangling"] == ["toolu_invented"]
    assert len([r for r in fake.requests if r.path.endswith("/messages")]) == 3  # asked once more, not again


def _history(*results: tuple[str, str, Any, bool]) -> list[Any]:
    calls = tuple(ToolCall(id=i, name=n, arguments={}) for i, n, _, _ in results)
    return [UserMessage(content="earlier"), AssistantMessage(content="", tool_calls=(ToolCall(id="call_old", name="x"),)),
            ToolMessage(result=ToolResult(call_id="call_old", name="x", content={"p99": 123})),
            AssistantMessage(content="old answer"),
            UserMessage(content="Why is checkout slow since 14:30?"),
            AssistantMessage(content="", tool_calls=calls),
            *[ToolMessage(result=ToolResult(call_id=i, name=n, content=c, is_error=bad)) for i, n, c, bad in results]]


def test_the_checker_reads_ids_in_any_bracket_form_and_numbers_as_written_or_rounded() -> None:
    history = _history(("call_m1", "get_metrics", {"p99_s": 2.6049, "before_s": 0.28, "version": "v2.14.0"}, False),
                       ("call_l1", "get_logs", "timeout connecting to ledger (503) x 1,204", False),
                       ("call_x1", "get_spans", {"error": True}, True))
    answer = ("p99 rose from 0.28 s to 2.60 s after v2.14.0 [call_m1, call_l1]; 1,204 timeouts with 503s "
              "[`call_l1`]. Spans failed [call_x1]. Last turn said 123 [call_old]. 3 checks, at 14:30. "
              "See [the runbook](https://runbook) and [note]. Up 9.3x.")
    g = check(answer, history)
    assert [(c.id, c.tool, c.ok) for c in g.citations] == [
        ("call_m1", "get_metrics", True), ("call_l1", "get_logs", True), ("call_x1", "get_spans", False),
        ("call_old", None, False)]  # an earlier turn's call is not this turn's evidence
    assert g.dangling == ["call_x1", "call_old"]
    assert g.uncited_numbers == ["123", "9.3"]  # 123 is only in an earlier turn's result
    assert check("Nothing abnormal.", history).grounded


def test_the_scripted_model_s_dangling_citations_are_caught_too(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    turn = harness.ask(tenant, "Why is checkout slow?", model="scripted:dangling_citation")
    done = _events(harness, turn.id)[-1]
    assert done["grounding"]["dangling"] == ["call_broken", "call_imagined"] and done["grounding"]["cited"] == 1


def test_a_count_of_a_result_s_items_is_found_in_that_result() -> None:
    history = _history(("call_l1", "get_logs", {"lines": [{"m": "x"}] * 12, "total": 188}, False))
    assert check("12 lines shown of 188 [call_l1].", history).uncited_numbers == []
    assert check("13 lines shown [call_l1].", history).uncited_numbers == ["13"]


def test_a_time_of_day_taken_from_a_result_s_timestamp_is_found_there() -> None:
    history = _history(("call_d1", "get_recent_deploys", {"deploys": [{"ts": "2026-04-07T14:31:02Z"}]}, False))
    assert check("The deploy landed at 14:31 UTC [call_d1].", history).uncited_numbers == []
    assert check("The deploy landed at 15:47 UTC [call_d1].", history).uncited_numbers == ["15", "47"]


def test_milliseconds_quoted_as_seconds_are_found() -> None:
    history = _history(("call_s1", "get_deployment_status", {"latency_p95_ms": 3900, "p99_ms": 30012}, False))
    assert check("p95 3.9 s, p99 30.0 s [call_s1].", history).uncited_numbers == []
    assert check("p95 4.9 s [call_s1].", history).uncited_numbers == ["4.9"]


def test_microseconds_quoted_as_seconds_are_found() -> None:
    history = _history(("call_t1", "get_traces", {"root": {"duration_us": 2734000, "children": [
        {"duration_us": 2611000}]}}, False))
    assert check("took 2.7 s, 2.6 s of it in redis [call_t1].", history).uncited_numbers == []
    assert check("took 3.7 s [call_t1].", history).uncited_numbers == ["3.7"]


def test_a_ratio_quoted_as_a_percentage_is_found_only_as_a_percentage() -> None:
    history = _history(("call_s1", "get_deployment_status", {"error_rate": 0.373, "share": 0.125}, False))
    assert check("error rate 37% and 12.5 % of it [call_s1].", history).uncited_numbers == []
    assert check("error rate 38% [call_s1].", history).uncited_numbers == ["38"]
    assert check("37 requests failed [call_s1].", history).uncited_numbers == ["37"]  # a count, not a share


def test_a_short_invented_call_id_is_a_dangling_citation() -> None:
    history = _history(("call_m1", "get_metrics", {"v": 1}, False))
    g = check("The cause is X [call_1] and [call_2], as [call_m1] shows.", history)
    assert g.dangling == ["call_1", "call_2"] and not g.grounded


def test_an_answer_quoting_no_number_leaves_the_results_unread(monkeypatch: Any) -> None:
    # Results are the big part of the check's work: an answer with nothing but counting words
    # ("2 deploys") has nothing to look for in them.
    from kortex.turns import grounding

    history = _history(("call_d1", "get_recent_deploys", {"deploys": [{"version": "v2.14.0"}] * 2}, False))
    encoded: list[int] = []
    real = grounding.dumps_text
    monkeypatch.setattr(grounding, "dumps_text", lambda value: encoded.append(1) or real(value))
    assert check("Both 2 deploys went out [call_d1].", history).grounded and encoded == []
    assert check("v2.14.0 went out twice [call_d1].", history).uncited_numbers == [] and encoded == [1]
    assert check("v2.15.0 went out [call_d1].", history).uncited_numbers == ["2.15.0"]
