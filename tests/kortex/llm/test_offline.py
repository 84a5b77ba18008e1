"""The offline analyst investigates through the real tools and cites what it used."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from kortex.errors import UpstreamError
from kortex.llm.offline.evidence import classify
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from kortex.turns import toolrun
from tests.conftest import Harness


def _answer(h: Harness, turn) -> tuple[str, list[dict]]:
    data = [json.loads(e.data) for e in h.events(turn.id)]
    return "".join(d["delta"] for d in data if d["type"] == "text"), data


def test_names_the_deploy_and_the_pool_errors_and_cites_every_call(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    turn = harness.ask(tenant, "Why is checkout slow?")
    assert turn.status == "done" and turn.model_used == "offline:analyst"
    text, data = _answer(harness, turn)
    assert text.startswith("**Offline analyst (rule-based, no LLM)**")
    assert "v2.14.0" in text and "connection pool exhausted" in text
    assert "database connection-pool exhaustion" in text
    calls = [d for d in data if d["type"] == "tool_call"]
    # list_products names the product's metrics: every one is surveyed for a step
    assert {c["name"] for c in calls} == {"list_products", "get_recent_deploys", "compare_to_baseline", "get_logs",
                                          "get_admin_info", "get_incident_history", "propose_action"}
    cited = set(re.findall(r"\[(call_[0-9a-f]+)\]", text))
    assert cited == {c["call_id"] for c in calls}
    assert "v2.13.2" not in text and "v5.2.1" not in text  # outside the window / another product


def test_is_deterministic(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    frozen = utcnow()  # the same evidence twice: relative windows must not slide between the two asks
    monkeypatch.setattr(toolrun, "utcnow", lambda: frozen)
    first, _ = _answer(harness, harness.ask(tenant, "Why is checkout slow?"))
    second, _ = _answer(harness, harness.ask(tenant, "Why is checkout slow?"))

    def strip(text: str) -> str:  # call ids depend on the turn's position; each ask proposes anew
        text = re.sub(r"call_[0-9a-f]+", "call", text)
        return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "uuid", text)

    assert strip(first) == strip(second) and "Most likely cause" in first


def test_healthy_product_gets_no_invented_cause(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    text, _ = _answer(harness, harness.ask(tenant, "Why is payments slow?"))
    assert "no step change" in text and "Most likely cause" not in text


def test_question_without_a_product_asks_for_one(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    turn = harness.ask(tenant, "hello there")
    text, data = _answer(harness, turn)
    assert "could not tell which product" in text
    # it first looked for what exists (nothing here), and guessed nothing
    assert [d["name"] for d in data if d["type"] == "tool_call"] == ["list_products"]


def test_a_subject_the_question_does_not_place_is_resolved_against_the_products_that_exist(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "connection-pool-exhaustion")
    turn = harness.ask(tenant, "Why are inventory requests timing out?")  # no word position names it
    text, data = _answer(harness, turn)
    calls = [d["name"] for d in data if d["type"] == "tool_call"]
    assert calls[0] == "list_products" and len(calls) > 1
    assert "could not tell" not in text and "inventory's" in text
    # resolution itself: whole words, then a hyphenated name's first part, then a close spelling
    from kortex.llm.offline.subject import resolve
    names = ["api-gateway", "ledger", "search", "storefront"]
    assert resolve("why did ledger start throwing errors", names) == "ledger"
    assert resolve("why can't the mobile app reach the api?", names) == "api-gateway"
    assert resolve("why is the storefornt slow", names) == "storefront"
    assert resolve("is everything ok?", names) is None
    assert resolve("is everything ok?", ["billing"]) == "billing"  # the only thing that exists


def _billing_latency(h: Harness) -> str:
    tenant = h.tenant("acme")
    now = utcnow()
    rows = [{"product": "billing", "metric": "billing_latency_p99_seconds", "ts": now - timedelta(minutes=m),
             "value": 0.3 if m > 30 else 2.5, "unit": "seconds", "labels": {}} for m in range(1, 600)]
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", rows)
    return tenant


def test_surveys_the_metrics_the_product_reports(harness: Harness) -> None:
    tenant = _billing_latency(harness)
    text, data = _answer(harness, harness.ask(tenant, "Why is billing slow?"))
    metric_calls = [d["arguments"]["metric_name"] for d in data
                    if d["type"] == "tool_call" and d["name"] == "compare_to_baseline"]
    assert metric_calls == ["billing_latency_p99_seconds"]
    assert "billing_latency_p99_seconds went from 0.3 s to 2.5 s" in text
    # the baseline holds hours of samples here: the z-score means something, with its sample count
    assert "far outside its 24 h baseline of " in text and "samples (max z-score" in text


def test_without_a_survey_follows_up_on_a_missing_metric_with_one_that_exists(harness_factory) -> None:
    h = harness_factory(tools={"allowed": ["get_recent_deploys", "compare_to_baseline", "get_logs"]})
    tenant = _billing_latency(h)
    text, data = _answer(h, h.ask(tenant, "Why is billing slow?"))
    metric_calls = [d["arguments"]["metric_name"] for d in data
                    if d["type"] == "tool_call" and d["name"] == "compare_to_baseline"]
    assert metric_calls == ["http_request_duration_seconds_p99", "billing_latency_p99_seconds"]
    assert "billing_latency_p99_seconds went from 0.3 s to 2.5 s" in text
    assert h.ask(tenant, "Is checkout failing?").status == "done"


def test_says_so_when_tools_are_disabled(harness_factory) -> None:
    h = harness_factory(tools={"allowed": []})
    tenant = h.tenant("acme")
    text, data = _answer(h, h.ask(tenant, "Why is checkout slow?"))
    assert "no investigation tools are enabled" in text
    assert not [d for d in data if d["type"] == "tool_call"]


def test_a_trace_id_in_the_question_is_looked_up_first(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    trace_id = harness.call(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h", "level": "error",
                                                 "limit": 1}).content["lines"][0]["trace_id"]
    text, data = _answer(harness, harness.ask(tenant, f"What happened to request {trace_id}?"))
    calls = [d for d in data if d["type"] == "tool_call"]
    assert calls[0]["name"] == "get_traces" and calls[0]["arguments"]["request_id"] == trace_id
    # the product came from the trace's root span: the rest of the investigation is about checkout
    assert {c["arguments"].get("product") for c in calls[1:]} == {"checkout"}
    summary = text[text.index("**Summary.**"):]
    assert summary.startswith(f"**Summary.** The requested trace {trace_id}: checkout POST /api/checkout")
    assert "orders-db: acquire connection" in summary and "v2.14.0" in summary
    assert set(re.findall(r"\[(call_[0-9a-f]+)\]", text)) == {c["call_id"] for c in calls}


def test_an_unknown_trace_without_a_product_is_said_so(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    text, data = _answer(harness, harness.ask(tenant, "What happened to request 0123456789abcdef?"))
    assert [d["name"] for d in data if d["type"] == "tool_call"] == ["get_traces"]
    assert "could not find trace" in text and "no trace has id" in text


def test_an_llm_request_id_starts_from_its_routing_decision(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "llm-backend-degraded")
    request = harness.call(tenant, "get_recent_requests", {"deployment_id": "gpt-4/aws", "status": "timeout",
                                                           "since": "30 minutes ago", "limit": 1}).content
    rid = request["requests"][0]["id"]
    text, data = _answer(harness, harness.ask(tenant, f"Why did {rid} time out?"))
    calls = [d for d in data if d["type"] == "tool_call"]
    assert calls[0]["name"] == "get_request_detail" and calls[0]["arguments"] == {"request_id": rid}
    recent = next(c for c in calls if c["name"] == "get_recent_requests")
    assert recent["arguments"]["deployment_id"] == "gpt-4/aws"  # the deployment that request used
    assert f"request {rid} (timeout" in text and "the router estimated" in text and "INC-2207" in text


def test_a_healthy_llm_platform_gets_no_invented_cause(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    now = utcnow()
    with harness.k.db.begin() as conn:
        ingest.write(conn, tenant, "llm-deployments", [
            {"deployment_id": d, "model_id": d.split("/")[0], "backend_id": d.split("/")[1], "status": "healthy",
             "latency_p50_ms": 300.0, "latency_p95_ms": 600.0, "error_rate": 0.01, "queue_depth": 3,
             "cost_per_1k_tokens": 0.01, "rate_limit_remaining": 900, "sample_count": 100, "updated_at": now}
            for d in ("gpt-4/aws", "claude-3/anthropic")])
    text, data = _answer(harness, harness.ask(tenant, "Are the LLM backends healthy?"))
    names = [d["name"] for d in data if d["type"] == "tool_call"]
    assert "get_deployment_status" in names and "propose_action" not in names
    assert "All 2 deployments of the LLM platform report healthy" in text and "Most likely cause" not in text


# ---- failed calls are not evidence --------------------------------------------------------


class Failing:
    """A source whose named methods fail the way a remote backend does; the rest delegate."""

    def __init__(self, inner: object, *names: str) -> None:
        self._inner = inner
        self._names = names

    def __getattr__(self, name: str):
        if name in self._names:
            def fail(*args: object, **kwargs: object) -> None:
                raise UpstreamError(f"upstream: 503 {name} is unavailable")
            return fail
        return getattr(self._inner, name)


def _ask_with_failing(h: Harness, tenant: str, question: str, source: str, *names: str) -> str:
    sources = h.k.sources
    original = getattr(sources, source)
    setattr(sources, source, Failing(original, *names))
    try:
        text, _ = _answer(h, h.ask(tenant, question))
    finally:
        setattr(sources, source, original)
    return text


def test_a_failed_deploy_lookup_is_not_read_as_no_deploy(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    text = _ask_with_failing(harness, tenant, "Why is checkout slow?", "deploys", "list_deploys")
    assert "landed near that change" not in text.replace("could not check whether a deploy of checkout landed near "
                                                         "that change", "")
    assert "get_recent_deploys failed" in text and "deploy v2.14.0" not in text
    inventory = harness.tenant("inventory")
    harness.seed(inventory, "connection-pool-exhaustion")
    text = _ask_with_failing(harness, inventory, "Why is inventory timing out?", "deploys", "list_deploys")
    assert "no deploy is involved" not in text and "get_recent_deploys failed" in text


def test_failed_metric_queries_are_not_read_as_a_steady_metric(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    text = _ask_with_failing(harness, tenant, "Why is payments slow?", "metrics", "query_metric")
    assert "no step change" not in text and "could not read payments's metrics" in text
    assert "compare_to_baseline failed" in text


def test_failed_log_and_history_lookups_make_no_claims(harness: Harness) -> None:
    import re as _re
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    text = _ask_with_failing(harness, tenant, "Why is checkout slow?", "logs", "query_logs")
    assert "no matching lines" not in text and "get_logs failed" in text
    # The failed call is named, never cited: a citation is evidence (kortex/turns/grounding.py).
    failed_id = _re.search(r"get_logs failed \(call (call_[0-9a-f]+)\)", text)
    assert failed_id is not None and f"[{failed_id.group(1)}]" not in text
    assert "connection-pool exhaustion" not in text  # the cause came from the logs: no logs, no cause


def test_a_failed_deployment_status_is_not_read_as_all_healthy(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "llm-backend-degraded")
    text = _ask_with_failing(harness, tenant, "Are the LLM backends healthy?", "llmops", "deployments")
    assert "report healthy" not in text and "get_deployment_status failed" in text


def test_a_failed_incident_lookup_is_not_read_as_no_incident(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "llm-backend-degraded")
    text = _ask_with_failing(harness, tenant, "Why are LLM requests to gpt-4 slow and failing?", "incidents",
                             "incidents_at")
    assert "No open incident concerns" not in text and "neither an open incident" not in text
    assert "get_active_incidents failed" in text and "gpt-4/aws" in text


@pytest.mark.parametrize("line,cause", [
    ("OOMKilled: container exceeded its memory limit", "memory exhaustion"),
    ("java.lang.OutOfMemoryError: Java heap space", "memory exhaustion"),
    ("upstream answered 429 Too Many Requests", "upstream rate limiting"),
    ("request timed out after 5000ms", "upstream timeouts"),
    ("booked room 14290 via zoom", None),
    ("broom closet inventory synced", None),
    ("order 4290 shipped", None),
])
def test_causes_match_whole_words(line: str, cause: str | None) -> None:
    found = classify(line)
    assert (found.name if found else None) == cause


@pytest.mark.parametrize("scenario", ["checkout-deploy-regression", "connection-pool-exhaustion", "noisy-neighbour",
                                      "llm-backend-degraded"])
def test_the_analyst_cites_only_calls_of_its_turn_that_succeeded(harness: Harness, scenario: str) -> None:
    import json as _json

    from kortex.telemetry.scenarios import get_scenario
    tenant = harness.tenant(f"cites-{scenario}")
    harness.seed(tenant, scenario)
    turn = harness.ask(tenant, get_scenario(scenario).question)
    done = _json.loads(harness.events(turn.id)[-1].data)
    assert done["grounding"]["dangling"] == [] and done["grounding"]["cited"] >= 3


def test_the_dominant_error_names_its_one_host_and_not_a_mixed_set() -> None:
    from kortex.llm.offline.service import log_pattern

    def top(hosts: list[dict[str, object]]) -> dict[str, object]:
        return {"templates": [{"template": "write failed", "example": "write failed", "count": 9,
                               "first_ts": "2026-04-07T14:31:02Z", "last_ts": "2026-04-07T14:41:02Z",
                               "hosts": hosts}]}
    one = log_pattern(top([{"host": "ledger-3", "count": 8}, {"host": "ledger-1", "count": 1}]))
    assert one is not None and (one.host, one.host_count) == ("ledger-3", 8)
    mixed = log_pattern(top([{"host": f"ledger-{i}", "count": 3} for i in range(3)]))
    assert mixed is not None and mixed.host is None
    unnamed = log_pattern(top([]))  # lines without hosts name none
    assert unnamed is not None and unnamed.host is None
    assert log_pattern({"templates": []}) is None


def test_the_same_question_in_two_sessions_gets_different_call_ids(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    ids = []
    for _ in range(2):
        _text, data = _answer(harness, harness.ask(tenant, "Why is checkout slow?"))
        ids.append({d["call_id"] for d in data if d["type"] == "tool_call"})
    assert ids[0] and ids[1] and not ids[0] & ids[1]


def test_a_product_named_by_the_dominant_line_is_looked_at_one_hop_further(harness: Harness) -> None:
    from kortex.llm.offline.service import LogPattern, ServiceFindings, dependency

    def line(text: str) -> LogPattern:
        return LogPattern(template="t", count=3, example=text, first=None, last=None)
    found = ServiceFindings(product="orders", pattern=line("call to inventory took 1480ms (reserve stock)"))
    assert dependency(found) == "inventory"
    found = ServiceFindings(product="checkout", pattern=line("charge failed: upstream payments returned 503"))
    assert dependency(found) == "payments"
    assert dependency(ServiceFindings(product="ledger", pattern=line("write failed: disk full"))) is None
