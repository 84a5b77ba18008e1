"""Checkpoints: every step boundary, chained root first; a fork ends its history at one and leaves
the original alone; a retry runs a turn again from one, with another model, and answers
differently; another tenant finds none of it. Over the vendor's wire format (the fake LLM)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kortex.errors import NotFound
from kortex.testing.fakellm import FakeLLM
from kortex.testing.inline import drive
from kortex.turns import chat, checkpoints
from tests.api.conftest import bearer
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

STRONG, FAST = "claude-opus-4-6", "claude-haiku-4-6"
QUESTION = "Why is checkout slow?"


@pytest.fixture
def h(harness_factory: Any, fake: FakeLLM) -> Harness:
    fake.add(STRONG, {"steps": [
        {"text": ["Reading ", "the deploys."], "tool_calls": [
            {"id": "toolu_1", "name": "get_recent_deploys", "arguments": {"product": "checkout"}}]},
        {"text": ["Deploy v2.14.0 ", "shrank the pool [toolu_1]."]},
    ]})
    # The fake serves a script's step by the assistant messages since the last question; a retry
    # from step 0 continues a conversation that already holds one, so its answer is at step 1.
    different = {"text": ["A different answer, ", "from the fast model."]}
    fake.add(FAST, {"steps": [different, different]})
    harness: Harness = harness_factory(llm={"providers": {"anthropic": vendor_config("anthropic", fake.url,
                                                                                      max_retries=0)},
                                            "default_provider": "anthropic"})
    return harness


def _answer(h: Harness, tenant: str, session_id: str) -> str:
    return str(h.messages(tenant, session_id)[-1].content)


def test_every_step_boundary_is_a_checkpoint_chained_root_first(h: Harness) -> None:
    tenant = h.tenant("acme")
    h.seed(tenant)
    first = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    second = h.ask(tenant, "And payments?", model=f"anthropic:{FAST}", session_id=first.session_id)
    chain = checkpoints.of_turn(h.k, tenant, second.id)
    assert [(c.turn_id, c.step) for c in chain] == [(first.id, None), (first.id, 0), (first.id, 1),
                                                    (second.id, None), (second.id, 0)]
    assert [c.parent_id for c in chain] == [None, *[c.id for c in chain[:-1]]]
    assert all(b.tokens > a.tokens for a, b in zip(chain, chain[1:], strict=False))
    assert chain[0].id == checkpoints.checkpoint_id(first.id, None)  # stable: derived, not stored
    assert [c.turn_id for c in checkpoints.of_turn(h.k, tenant, first.id)] == [first.id] * 3  # up to that turn


def test_a_fork_ends_its_history_at_the_checkpoint_and_leaves_the_original_alone(h: Harness) -> None:
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    before = [m.content for m in h.messages(tenant, turn.session_id)]
    after_step0 = checkpoints.of_turn(h.k, tenant, turn.id)[1]
    forked = checkpoints.fork(h.k, tenant, turn.session_id, after_step0.id, name="what if")
    copied = h.messages(tenant, forked.id)
    assert forked.name == "what if" and forked.id != turn.session_id
    assert [m.role for m in copied] == ["user", "assistant", "tool"]  # the question, step 0 and its result
    assert [m.content for m in h.messages(tenant, turn.session_id)] == before
    [cut] = [t for t in _turns(h, tenant, forked.id)]
    assert cut.status == "cancelled" and cut.error["code"] == "forked"  # copied only in part


def _turns(h: Harness, tenant: str, session_id: str) -> list[Any]:
    from kortex.storage.schema import turns as turns_table

    with h.k.db.connect() as conn:
        from sqlalchemy import select

        rows = conn.execute(select(turns_table.c.id).where(turns_table.c.session_id == session_id)).all()
    return [chat.get_turn(h.k, tenant, r.id) for r in rows]


def test_a_retry_from_a_step_with_another_model_answers_differently(h: Harness, fake: FakeLLM) -> None:
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    original = _answer(h, tenant, turn.session_id)
    after_step0 = checkpoints.of_turn(h.k, tenant, turn.id)[1]
    retried = checkpoints.retry(h.k, tenant, turn.id, checkpoint=after_step0.id, model=f"anthropic:{FAST}")
    drive(h.k, retried.posted.handoff)
    again = chat.get_turn(h.k, tenant, retried.posted.turn.id)
    assert again.status == "done" and again.session_id == retried.session.id != turn.session_id
    answer = _answer(h, tenant, retried.session.id)
    assert answer != original and answer.startswith("A different answer")
    sent = fake.requests[-1].body
    assert sent["model"] == FAST
    assert "Go on from here" in str(sent["messages"][-1]["content"]) and QUESTION in str(sent["messages"])


def test_a_retry_from_the_turn_s_start_asks_its_question_again(h: Harness) -> None:
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    retried = checkpoints.retry(h.k, tenant, turn.id, model=f"anthropic:{FAST}")
    drive(h.k, retried.posted.handoff)
    messages = h.messages(tenant, retried.session.id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].content == QUESTION


def test_another_tenant_finds_no_checkpoint(h: Harness) -> None:
    tenant, other = h.tenant("acme"), h.tenant("globex")
    h.seed(tenant)
    turn = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    point = checkpoints.of_turn(h.k, tenant, turn.id)[0]
    for attempt in (lambda: checkpoints.of_turn(h.k, other, turn.id),
                    lambda: checkpoints.fork(h.k, other, turn.session_id, point.id),
                    lambda: checkpoints.retry(h.k, other, turn.id)):
        with pytest.raises(NotFound):
            attempt()
    own = chat.create_session(h.k, other, "mine")
    with pytest.raises(NotFound):  # nor can it name one of them in a session of its own
        checkpoints.fork(h.k, other, own.id, point.id)


def test_the_endpoints(h: Harness) -> None:
    tenant = h.tenant("acme")
    h.seed(tenant)
    turn = h.ask(tenant, QUESTION, model=f"anthropic:{STRONG}")
    sent: list[Any] = []
    with TestClient(create_app(h.settings, dispatch=sent.append, embedded_worker=False)) as api:
        auth = bearer(h.api_key(tenant))
        listed = api.get(f"/v1/turns/{turn.id}/checkpoints", headers=auth).json()
        assert [c["step"] for c in listed] == [None, 0, 1] and listed[1]["parent_id"] == listed[0]["id"]
        forked = api.post(f"/v1/sessions/{turn.session_id}/fork", json={"checkpoint_id": listed[1]["id"]},
                          headers=auth)
        assert forked.status_code == 201 and forked.json()["turn_count"] == 1
        retried = api.post(f"/v1/turns/{turn.id}/retry", json={"model": f"anthropic:{FAST}"}, headers=auth)
        assert retried.status_code == 202 and len(sent) == 1 and retried.json()["session_id"] != turn.session_id
        assert api.get(f"/v1/turns/{turn.id}", headers=auth).json()["steps"] == [
            {"step": 0, "model": f"anthropic:{STRONG}", "routed": False},
            {"step": 1, "model": f"anthropic:{STRONG}", "routed": False}]
        other = bearer(h.api_key(h.tenant("globex")))
        assert api.get(f"/v1/turns/{turn.id}/checkpoints", headers=other).status_code == 404
        missing = api.post(f"/v1/sessions/{turn.session_id}/fork", json={"checkpoint_id": "nope"}, headers=auth)
        assert missing.status_code == 404
