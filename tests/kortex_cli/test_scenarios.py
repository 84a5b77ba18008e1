"""Every seeded scenario, asked through ``kortex ask`` in the embedded mode, gets an answer from
the offline analyst that names its root cause and cites every tool call it made."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kortex.telemetry.scenarios import SCENARIOS
from kortex_cli.main import app

# The tools each investigation must use: the service playbook (list_products names the metrics
# it surveys) and the LLM-platform one.
SERVICE_TOOLS = {"list_products", "get_recent_deploys", "compare_to_baseline", "get_logs", "get_admin_info",
                 "get_incident_history", "propose_action"}
PLATFORM_TOOLS = {"get_deployment_status", "get_active_incidents", "get_latency_trends", "get_request_volume",
                  "get_recent_requests", "propose_action"}
EXPECTED_TOOLS = {
    "checkout-deploy-regression": SERVICE_TOOLS,
    "connection-pool-exhaustion": SERVICE_TOOLS,
    "incident-archive": SERVICE_TOOLS,
    "llm-backend-degraded": PLATFORM_TOOLS | {"get_request_detail"},
    "noisy-neighbour": PLATFORM_TOOLS | {"get_user_context", "get_request_detail"},
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "kortex"


def test_every_scenario_has_an_expectation() -> None:
    assert set(EXPECTED_TOOLS) == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ask_names_the_root_cause_and_cites_the_calls(home: Path, name: str) -> None:
    scenario = SCENARIOS[name]
    runner = CliRunner()
    seeded = runner.invoke(app, ["seed", name], catch_exceptions=False)
    assert seeded.exit_code == 0, seeded.output
    assert f"seeded {name!r} for tenant 'demo'" in seeded.output and scenario.question in seeded.output
    asked = runner.invoke(app, ["ask", scenario.question, "--json"], catch_exceptions=False)
    assert asked.exit_code == 0, asked.output
    events = [json.loads(line) for line in asked.output.splitlines() if line.startswith("{")]
    calls = {e["data"]["call_id"]: e["data"]["name"] for e in events if e["event"] == "tool_call"}
    results = [e["data"] for e in events if e["event"] == "tool_result"]
    assert set(calls.values()) == EXPECTED_TOOLS[name]
    assert {r["call_id"] for r in results} == set(calls) and not any(r["is_error"] for r in results)
    answer = "".join(e["data"]["delta"] for e in events if e["event"] == "text")
    assert answer.startswith("**Offline analyst (rule-based, no LLM)**")
    cited = set(re.findall(r"\[(call_[0-9a-f]+)\]", answer))
    assert cited == set(calls), f"uncited: {set(calls) - cited}"
    summary = answer[answer.index("**Summary.**"):answer.index("**Evidence**")]
    for fact in scenario.key_facts:
        assert fact in summary, f"{name}: the summary does not name {fact!r}:\n{summary}"
    assert "Most likely cause" in summary
    assert [e["event"] for e in events].count("proposal") == 1 and events[-1]["data"]["status"] == "done"


def test_seed_lists_the_scenarios_and_rejects_unknown_ones(home: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["seed", "--list"])
    assert listed.exit_code == 0 and all(name in listed.output for name in SCENARIOS)
    bad = runner.invoke(app, ["seed", "no-such-thing"])
    assert bad.exit_code == 1 and "unknown scenario" in bad.output
