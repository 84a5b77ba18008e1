"""The kind of turn is data: a profile's prompt and tools reach the model, its end hook runs in
the transaction that ends the turn (however it ends) and hands work on, and a turn of an
unknown kind fails plainly."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from kortex.errors import KortexError
from kortex.storage import posting
from kortex.testing.fakellm import FakeLLM
from kortex.testing.inline import drive
from kortex.turns import chat
from kortex.turns import profiles as profiles_module
from kortex.turns.handoff import Handoff, StepDispatch
from kortex.turns.profiles import CHAT, TurnEnd, TurnProfile, profile_of, register
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config


@pytest.fixture
def scratch_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiles_module, "_PROFILES", dict(profiles_module._PROFILES))


def _turn(h: Harness, tenant: str, profile: str) -> str:
    session = chat.create_session(h.k, tenant, "t")
    with h.k.db.begin() as conn:
        new = posting.create_turn(conn, tenant_id=tenant, session_id=session.id, content="Summarise INC-1",
                                model=None, deadline=timedelta(minutes=5), profile=profile)
    return new.turn.id


def test_chat_is_the_default_profile_and_keeps_the_investigator_prompt_and_every_allowed_tool(harness) -> None:
    turn = chat.post_message(harness.k, harness.tenant("acme"), chat.create_session(
        harness.k, harness.tenant("acme"), "t").id, "hi").turn
    assert turn.profile == "chat" and profile_of("chat") is CHAT
    allowed = {t.name for t in harness.k.tools.schemas(harness.k.policy)}
    # Every tool the deployment allows but the post-mortem's output channel, offered to post-mortems only.
    assert "submit_postmortem" in allowed
    assert {t.name for t in CHAT.tool_schemas(harness.k)} == allowed - {"submit_postmortem"}
    assert "submit_postmortem" in {t.name for t in profile_of("postmortem").tool_schemas(harness.k)}


def test_a_profile_s_prompt_tools_and_finish_hook_shape_the_turn(harness_factory, fake: FakeLLM,
                                                                 scratch_profiles: None) -> None:
    seen: list[tuple[str, TurnEnd]] = []

    def on_end(k: Any, conn: Any, turn: Any, end: TurnEnd) -> Handoff:
        seen.append((turn.id, end))
        return Handoff(steps=(StepDispatch(turn.tenant_id, "00000000-0000-0000-0000-000000000000", 0),))

    register(TurnProfile(name="summary", system="You write summaries.", tools=frozenset({"get_recent_deploys"}),
                         budget_scope="batch", on_end=on_end))
    fake.add("claude-opus-4-6", {"steps": [{"text": ["Summary."]}]})
    h = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url, max_retries=0)},
                             "default_provider": "anthropic"})
    tenant = h.tenant("acme")
    turn_id = _turn(h, tenant, "summary")
    # The step, then the step the hook handed on (its turn does not exist: a claim that finds nothing).
    assert drive(h.k, Handoff(steps=(StepDispatch(tenant, turn_id, 0),))) == 2
    body = fake.requests[0].body
    system = body["system"] if isinstance(body["system"], str) else " ".join(b["text"] for b in body["system"])
    assert system == "You write summaries."
    assert [t["name"] for t in body["tools"]] == ["get_recent_deploys"]  # narrowed, never widened
    assert seen == [(turn_id, TurnEnd(status="done", answer="Summary."))]
    assert chat.get_turn(h.k, tenant, turn_id).status == "done"


def test_a_turn_of_a_kind_this_process_does_not_know_fails_and_says_so(harness, fake: FakeLLM) -> None:
    tenant = harness.tenant("acme")
    turn_id = _turn(harness, tenant, "no-such-kind")
    drive(harness.k, Handoff(steps=(StepDispatch(tenant, turn_id, 0),)))
    turn = chat.get_turn(harness.k, tenant, turn_id)
    assert turn.status == "failed" and turn.error["code"] == "unknown_profile"
    done = json.loads(harness.events(turn_id)[-1].data)
    assert done["status"] == "failed" and done["error"] == "unknown_profile"


def test_a_profile_name_is_registered_once() -> None:
    with pytest.raises(ValueError):
        register(TurnProfile(name="chat", system="another chat"))


def test_the_end_hook_hears_a_failed_and_a_cancelled_turn_too(harness, scratch_profiles: None) -> None:
    from kortex.turns.cancel import cancel_turn

    heard: list[TurnEnd] = []

    def on_end(k: Any, conn: Any, turn: Any, end: TurnEnd) -> Handoff:
        heard.append(end)
        return Handoff(steps=(StepDispatch(turn.tenant_id, turn.id, 99),))

    register(TurnProfile(name="hooked", system="x", on_end=on_end, before_call=lambda conn, turn, history:
                         KortexError("not today", code="refused_here")))
    tenant = harness.tenant("acme")
    failed = _turn(harness, tenant, "hooked")
    drive(harness.k, Handoff(steps=(StepDispatch(tenant, failed, 0),)))  # the gate refuses its first call
    assert chat.get_turn(harness.k, tenant, failed).error["code"] == "refused_here"
    _, handoff = cancel_turn(harness.k, tenant, _turn(harness, tenant, "hooked"), by="test")
    assert [e.status for e in heard] == ["failed", "cancelled"] and heard[0].error == "refused_here"
    assert [s.step for s in handoff.steps] == [99]  # what the hook hands on reaches the canceller
