"""What one turn adds to the metrics: a turn started and finished, its steps, its tool calls and
its LLM calls with their tokens; refusals and the watchdog's actions; queue depth at scrape."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from kortex import metrics
from tests.conftest import Harness


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _snapshot(names: list[tuple[str, dict[str, str]]]) -> dict[str, float]:
    return {f"{n}{sorted(labels.items())}": _value(n, **labels) for n, labels in names}


def test_a_turn_with_two_tool_calls_counts_once_as_started_and_finished_with_its_steps_tools_and_calls(
        harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    watched = [
        ("kortex_turns_started_total", {"profile": "chat"}),
        ("kortex_turns_finished_total", {"profile": "chat", "status": "done"}),
        ("kortex_step_duration_seconds_count", {"outcome": "tools"}),
        ("kortex_step_duration_seconds_count", {"outcome": "ended"}),
        ("kortex_tool_duration_seconds_count", {"tool": "get_recent_deploys", "outcome": "ok"}),
        ("kortex_tool_duration_seconds_count", {"tool": "get_logs", "outcome": "ok"}),
        ("kortex_llm_calls_total", {"provider": "scripted", "model": "two_tools", "outcome": "ok"}),
        ("kortex_llm_first_token_seconds_count", {"provider": "scripted", "model": "two_tools"}),
        ("kortex_llm_tokens_total", {"provider": "scripted", "model": "two_tools", "kind": "output"}),
    ]
    before = _snapshot(watched)
    turn = harness.ask(tenant, "Why is checkout slow?", model="scripted:two_tools")
    assert turn.status == "done"
    after = _snapshot(watched)
    delta = {k: after[k] - before[k] for k in after}
    assert list(delta.values())[:8] == [1, 1, 1, 1, 1, 1, 2, 2]  # two steps: two LLM calls
    assert list(delta.values())[8] > 0  # output tokens


def test_a_failed_turn_and_a_cancelled_one_count_by_status(harness: Harness) -> None:
    from kortex.turns import chat
    from kortex.turns.cancel import cancel

    tenant = harness.tenant("acme")
    failed_before = _value("kortex_turns_finished_total", profile="chat", status="failed")
    cancelled_before = _value("kortex_turns_finished_total", profile="chat", status="cancelled")
    assert harness.ask(tenant, "x", model="scripted:fail").status == "failed"
    session = chat.create_session(harness.k, tenant, "t", "scripted:text_only")
    cancel(harness.k, tenant, chat.post_message(harness.k, tenant, session.id, "x").turn.id, by="test")
    assert _value("kortex_turns_finished_total", profile="chat", status="failed") == failed_before + 1
    assert _value("kortex_turns_finished_total", profile="chat", status="cancelled") == cancelled_before + 1


def test_the_watchdog_s_actions_and_refusals_are_counted_by_kind() -> None:
    before = _value("kortex_watchdog_actions_total", action="requeued_steps")
    failed = _value("kortex_watchdog_actions_total", action="failed_turns")
    metrics.watchdog({"requeued_steps": 3, "failed_turns": 0})
    assert _value("kortex_watchdog_actions_total", action="requeued_steps") == before + 3
    assert _value("kortex_watchdog_actions_total", action="failed_turns") == failed  # zero adds nothing
    refused = _value("kortex_budget_refusals_total", limit="max_concurrent_turns_per_tenant")
    metrics.refused("max_concurrent_turns_per_tenant")
    assert _value("kortex_budget_refusals_total", limit="max_concurrent_turns_per_tenant") == refused + 1


def test_queue_depth_is_read_at_scrape_and_a_broker_outage_leaves_every_queue_out() -> None:
    depths: dict[str, Any] = {"turns": 7, "tools": 0, "batch": 2}

    def read() -> dict[str, int]:
        if depths["turns"] is None:
            raise ConnectionError("broker down")
        return {queue: int(depth) for queue, depth in depths.items()}

    registry = CollectorRegistry()
    registry.register(metrics.QueueDepth(read))
    text = generate_latest(registry).decode()
    assert 'kortex_queue_depth{queue="turns"} 7.0' in text and 'kortex_queue_depth{queue="tools"} 0.0' in text
    assert 'kortex_queue_depth{queue="batch"} 2.0' in text
    depths["turns"] = None  # missing, not the last figure read as if it were current
    text = generate_latest(registry).decode()
    assert "kortex_queue_depth{" not in text


@pytest.mark.parametrize("token", [None, "s3cret-tøken"])
def test_the_metrics_port_requires_the_bearer_token_when_one_is_set(token: str | None) -> None:
    server = metrics.serve(0, host="127.0.0.1", token=token)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        bare = httpx.get(url, timeout=5)
        if token is None:
            assert bare.status_code == 200 and "kortex_turns_started_total" in bare.text
            return
        assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")
        assert "kortex_" not in bare.text
        for wrong in ("Bearer nope", f"Basic {token}", "Bearer", f"Bearer {token}x", "Bearer \xff"):
            assert httpx.get(url, headers={"Authorization": wrong.encode("latin-1")}, timeout=5).status_code == 401
        right = httpx.get(url, headers={"Authorization": f"Bearer {token}".encode()}, timeout=5)
        assert right.status_code == 200 and "kortex_turns_started_total" in right.text
    finally:
        server.shutdown()
        server.server_close()


def test_the_grafana_dashboard_only_charts_metrics_kortex_has() -> None:
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana-kortex.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum|total)$", "", n) for e in exprs for n in re.findall(r"kortex_\w+", e)}
    known = {m.name for m in REGISTRY.collect() if m.name.startswith("kortex_")} | {"kortex_queue_depth"}
    assert used and used <= known, used - known
