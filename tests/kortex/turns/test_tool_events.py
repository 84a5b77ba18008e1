"""Events tools add to a whole turn: the interim tool_progress note and the proposal card."""

from __future__ import annotations

import json

from tests.conftest import Harness


def _data(h: Harness, turn_id: str) -> list[dict]:
    return [json.loads(e.data) for e in h.events(turn_id)]


def test_a_slow_tool_sends_a_progress_note_before_its_result(harness_factory) -> None:
    h = harness_factory(tools={"progress_after_s": 0.15})
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "slow", model="scripted:progress")
    assert turn.status == "done"
    data = _data(h, turn.id)
    types = [d["type"] for d in data]
    assert types.count("tool_progress") == 1
    assert types.index("tool_call") < types.index("tool_progress") < types.index("tool_result")
    note = data[types.index("tool_progress")]
    assert note["call_id"] == "call_slow" and note["elapsed_ms"] == 150 and "longer than usual" in note["message"]
    fast = harness_factory(tools={"progress_after_s": 5})
    quiet = fast.ask(fast.tenant("acme"), "slow", model="scripted:progress")
    assert "tool_progress" not in [d["type"] for d in _data(fast, quiet.id)]


def test_propose_action_publishes_a_proposal_after_its_result(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = harness.ask(tenant, "fix it", model="scripted:propose")
    assert turn.status == "done"
    data = _data(harness, turn.id)
    types = [d["type"] for d in data]
    assert types.count("proposal") == 1 and types.index("tool_result") < types.index("proposal")
    result = data[types.index("tool_result")]
    card = data[types.index("proposal")]
    assert card["call_id"] == "call_propose" and card["proposal_id"] == result["content"]["proposal_id"]
    assert (card["action"], card["product"], card["params"]) == ("rollback-deploy", "checkout", {"version": "v2.14.0"})
    proposal = harness.k.proposals.get(tenant, card["proposal_id"])
    assert (proposal.turn_id, proposal.session_id, proposal.status) == (turn.id, turn.session_id, "pending")
    assert card["expires_at"].startswith(proposal.expires_at.strftime("%Y-%m-%dT%H:%M:%S"))


def test_a_refused_proposal_publishes_no_card(harness_factory) -> None:
    h = harness_factory(tools={"allowed": ["get_logs"]})  # propose_action not allowed for this deployment
    tenant = h.tenant("acme")
    turn = h.ask(tenant, "fix it", model="scripted:propose")
    data = _data(h, turn.id)
    assert [d["error_code"] for d in data if d["type"] == "tool_result"] == ["policy_denied"]
    assert "proposal" not in [d["type"] for d in data] and h.k.proposals.list(tenant) == []
