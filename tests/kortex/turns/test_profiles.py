"""The kind of turn is data: a profile's prompt and tools reach the model, its finish hook runs
in the closing transaction and hands work on, and a turn of an unknown kind fails plainly."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from kortex.storage import turns
from kortex.testing.fakellm import FakeLLM
from kortex.testing.inline import drive
from kortex.turns import chat
from kortex.turns import profiles as profiles_module
from kortex.turns.handoff import Handoff, StepDispatch
from kortex.turns.profiles import CHAT, TurnProfile, profile_of, register
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config


@pytest.fixture
def scratch_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiles_module, "_PROFILES", dict(profiles_module._PROFILES))


def _turn(h: Harness, tenant: str, profile: str) -> str:
    session = chat.create_session(h.k, tenant, "t")
    with h.k.db.begin() as conn:
        new = turns.create_turn(conn, tenant_id=tenant, session_id=session.id, content="Summarise INC-1",
                                model=None, deadline=timedelta(minutes=5), profile=profile)
    return new.turn.id


def test_chat_is_the_default_profile_and_keeps_the_investigator_prompt_and_every_allowed_tool(harness) -> None:
    turn = chat.post_message(harness.k, harness.tenant("acme"), chat.create_session(
        harness.k, harness.tenant("acme"), "t").id, "hi").turn
    assert turn.profile == "chat" and profile_of("chat") is CHAT
    assert {t.name for t in CHAT.tool_schemas(harness.k)} == {t.name for t in harness.k.tools.schemas(harness.k.policy)}


def test_a_profile_s_prompt_tools_and_finish_hook_shape_the_turn(harness_factory, fake: FakeLLM,
                                                                 scratch_profiles: None) -> None:
    seen: list[tuple[str, str]] = []

    def on_finish(k: Any, conn: Any, turn: Any, text: str) -> Handoff:
        seen.append((turn.id, text))
        return Handoff(steps=(StepDispatch(turn.tenant_id, "00000000-0000-0000-0000-000000000000", 0),))

    register(TurnProfile(name="summary", system="You write summaries.", tools=frozenset({"get_recent_deploys"}),
                         budget_scope="batch", on_finish=on_finish))
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
    assert seen == [(turn_id, "Summary.")]
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
