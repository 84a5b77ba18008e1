"""An answer the step refuses once its vendor call has ended well (kortex/turns/consume.py: the
tool calls' argument bytes, summed over the calls, pass ``llm.max_answer_chars``) is audited as
what it was: the call's ``llm_call`` row says it failed, with the refusal's error code, and
still bills what the vendor reported, so the turn, its ``done`` and the row agree."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kortex.storage import audit
from kortex.testing.fakellm import FakeLLM
from tests.conftest import Harness
from tests.kortex.llm.conftest import vendor_config

VENDORS = ("anthropic", "openai", "ollama")
MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-4o", "ollama": "llama3.2"}


def _harness(harness_factory: Any, fake: FakeLLM) -> Harness:
    providers = {v: vendor_config(v, fake.url, max_retries=0) for v in VENDORS}
    return harness_factory(llm={"providers": providers, "max_answer_chars": 1_000})  # type: ignore[no-any-return]


@pytest.mark.parametrize("vendor", VENDORS)
def test_an_answer_refused_after_its_call_ended_is_audited_failed_and_still_billed(
        harness_factory: Any, fake: FakeLLM, vendor: str) -> None:
    # Three calls of ~400 argument bytes each: every one within the bound, together past it.
    # The vendor's stream ends well (usage, stop reason); the step refuses the answer after.
    calls = [{"id": f"c{n}", "name": "debug_echo", "arguments": {"text": f"{n}" + "a" * 400}} for n in range(3)]
    fake.add(MODELS[vendor], {"steps": [
        {"text": ["Reading."], "tool_calls": calls, "usage": {"input_tokens": 1200, "output_tokens": 345}},
        {"text": ["Done."]}]})
    h = _harness(harness_factory, fake)
    tenant = h.tenant(f"refused-{vendor}")
    turn = h.ask(tenant, "why?", model=f"{vendor}:{MODELS[vendor]}")
    assert turn.status == "failed" and turn.error["code"] == "stream_invalid", turn.error
    assert len(fake.requests) == 1  # the one call, finished by the vendor
    with h.k.db.connect() as conn:
        [row] = [r for r in audit.list_for_turn(conn, tenant, turn.id) if r["kind"] == "llm_call"]
    assert not row["ok"], row  # the answer was refused: not a successful call
    assert (row["payload"]["error_code"], row["payload"]["stop_reason"]) == ("stream_invalid", "error")
    assert row["payload"]["tool_calls"] == [] and row["payload"]["text_chars"] == 0  # nothing of it kept
    # Billed all the same: what the vendor reported, on the row, the turn and its done.
    assert (row["input_tokens"], row["output_tokens"]) == (1200, 345)
    assert (turn.input_tokens, turn.output_tokens) == (1200, 345)
    done = json.loads(h.events(turn.id)[-1].data)
    assert (done["usage"]["input_tokens"], done["usage"]["output_tokens"]) == (1200, 345)
    assert done["usage"]["cost_usd"] == pytest.approx(row["cost_usd"]) == pytest.approx(turn.cost_usd)
