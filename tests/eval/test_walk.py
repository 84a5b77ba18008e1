"""Every claim the offline analyst prints traces to a tool result of its turn.

Each scenario of the evaluation set (loaded through the ingest API) and each built-in demo
scenario (seeded) is asked once in one embedded Kortex; the answer is then walked: every
citation names a successful call of the turn, every number is found in a result (the server's
own matching, kortex/turns/grounding.py), every quoted text is in a result verbatim, and every
id-like token (a host, a version, a request or incident id, a metric or flag name) occurs in one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from eval.__main__ import Embedded, embedded, scenario_files
from kortex.messages import AssistantMessage, Message, ToolCall, ToolMessage, ToolResult, UserMessage
from kortex.telemetry.scenarios import SCENARIOS, seed
from kortex.turns import grounding

MODEL = "offline:analyst"
_QUOTED = re.compile(r"\"([^\"\n]{3,})\"")
# A token an operator would copy into a query: letters and digits mixed (ledger-3, v6.0.0,
# INC-0877, req_7f2a), or words joined by _ / . : (new_ranker, gpt-4/aws, users-db.internal).
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:-]*[A-Za-z0-9]")
_ID_LIKE = re.compile(r"(?=.*[A-Za-z])(?=.*\d)|[_/]|[a-z]\.[a-z]")
_CLOCK = re.compile(r"^\d{1,2}:\d{2}$")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif value is not None:
        yield str(value)


def _history(question: str, results: list[dict[str, Any]]) -> list[Message]:
    calls = tuple(ToolCall(id=r["call_id"], name=r["name"]) for r in results)
    return [UserMessage(content=question), AssistantMessage(tool_calls=calls),
            *(ToolMessage(result=ToolResult(call_id=r["call_id"], name=r["name"], content=r.get("content"),
                                            is_error=r.get("is_error", False))) for r in results)]


def untraced(question: str, answer: str, calls: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[str]:
    """What the answer says that neither the question nor any call or result of the turn holds.
    A call's id, tool name and arguments may be named ("get_logs (level >= warn)", a query in
    quotes): that is what was asked, not a finding; numbers must come from results."""
    history = _history(question, results)
    out = [f"citation {c.id}" for c in grounding.citations(answer, history) if not c.ok]
    out += [f"number {n}" for n in grounding.uncited_numbers(answer, history)]
    # A failed call's error text is its result too: naming why it failed is no finding.
    asked = "\n".join([question, *(s for r in results for s in _strings(r.get("content"))),
                        *(s for c in calls for s in _strings({c["name"]: c.get("arguments"), "id": c["call_id"]}))])
    for quoted in _QUOTED.findall(answer):
        if quoted not in asked:
            out.append(f"quote {quoted!r}")
    prose = _QUOTED.sub(" ", re.sub(r"\[[^\]\n]*\]", " ", answer))
    for token in sorted(set(_TOKEN.findall(prose)), key=prose.find):
        if _ID_LIKE.search(token) and not _CLOCK.match(token) and not _occurs(token, asked):
            out.append(f"id {token}")
    return out


def _occurs(token: str, corpus: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(token)}(?![A-Za-z0-9])", corpus) is not None


@pytest.fixture(scope="module")
def kortex() -> Iterator[Embedded]:
    with embedded() as k:
        yield k


EVAL = scenario_files()


@pytest.mark.parametrize(("path", "part"), EVAL, ids=[f"{part}/{p.stem}" for p, part in EVAL])
def test_every_claim_of_an_eval_answer_traces_to_a_result(kortex: Embedded, path: Path, part: str) -> None:
    r = kortex.run(path, part, MODEL)
    assert r.error is None and r.answer
    missing = untraced(r.question, r.answer, r.calls, r.results)
    assert not missing, "\n".join([*missing, "", r.answer])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_claim_of_a_demo_answer_traces_to_a_result(kortex: Embedded, name: str) -> None:
    scenario = SCENARIOS[name]
    tenant, chat_key, _ = kortex.tenant(f"walk-{name}")
    with kortex.kortex.db.begin() as conn:
        seed(conn, tenant, scenario, now=datetime.now(UTC))
    asked = kortex.ask(chat_key, scenario.question, MODEL, name)
    assert asked.done.get("status") == "done" and asked.answer
    missing = untraced(scenario.question, asked.answer, asked.calls, asked.results)
    assert not missing, "\n".join([*missing, "", asked.answer])


def test_the_walk_finds_what_no_result_holds() -> None:
    results = [{"call_id": "call_a1", "name": "get_logs", "content": {"lines": [
        {"host": "ledger-3", "message": "disk full on /var/lib/ledger"}], "total_matches": 147}}]
    answer = ('147 lines [call_a1], "disk full on /var/lib/ledger" on ledger-3; 312 more on ledger-4 [call_b2], '
              'deploy v6.0.0 said "no space".')
    calls = [{"call_id": "call_a1", "name": "get_logs", "arguments": {"product": "ledger"}}]
    assert untraced("Why is ledger failing?", answer, calls, results) == [
        "citation call_b2", "number 312", "number 6.0.0", "quote 'no space'", "id ledger-4", "id v6.0.0"]
