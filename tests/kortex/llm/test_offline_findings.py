"""What the offline analyst concludes from telemetry no playbook was written for: a service whose
name sounds like the LLM platform, a deployment failing on its own, a product nothing reports,
a certificate or a disk running out next to a harmless deploy; and its answer to the strict
grounding check's re-ask. Telemetry is written as the evaluation set writes it (eval/scenarios)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from eval.__main__ import expand
from kortex.llm.base import CompletionRequest, TextChunk, ToolCallChunk
from kortex.llm.offline import OfflineAnalyst
from kortex.llm.offline.platform import Requests
from kortex.llm.offline.question import read_question
from kortex.messages import AssistantMessage, Message, ToolMessage, UserMessage
from kortex.prompts import REGROUND
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from kortex.turns.profiles import CHAT
from tests.conftest import Harness


def _load(h: Harness, tenant: str, telemetry: dict[str, Any]) -> None:
    now = utcnow().replace(microsecond=0)
    with h.k.db.begin() as conn:
        for kind, items in expand(telemetry, now).items():
            ingest.write(conn, tenant, kind, ingest.validate_batch(kind, items, now=now))


def _ask(h: Harness, tenant: str, question: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    turn = h.ask(tenant, question)
    data = [json.loads(e.data) for e in h.events(turn.id)]
    calls = [d for d in data if d["type"] == "tool_call"]
    return "".join(d["delta"] for d in data if d["type"] == "text"), calls, data[-1]


def _cause(text: str) -> str:
    """The sentence that blames something, and how to confirm it; not the runner-up."""
    start = text.index("Most likely cause")
    return text[start:text.index("\n", start)].split(" Runner-up:")[0]


# ---- the subject: a named product outranks words of the LLM platform -------------------------


POOL = {"series": [{"product": "inference-gateway", "metric": "http_request_duration_seconds_p99", "before": 0.15,
                    "after": 2.4, "onset": "-20m", "span": "3h"}],
        "logs": [{"product": "inference-gateway", "level": "error", "host": "ig-3",
                  "message": "connection pool exhausted waiting for a connection to sessions-db", "from": "-20m",
                  "every": "10s"}]}


def test_a_service_whose_name_holds_an_llm_word_is_investigated_as_that_service(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, POOL)
    text, calls, _ = _ask(harness, tenant, "Why is inference-gateway slow?")
    assert "get_deployment_status" not in {c["name"] for c in calls}
    assert "LLM platform" not in text and "inference-gateway's http_request_duration_seconds_p99" in text
    assert "connection-pool exhaustion" in _cause(text)
    # a model's family before its size still means the platform; a service's name does not
    assert read_question("Why is gpt-4 slow?").domain == "llm"
    assert read_question("Why are premium users getting slow answers from llama-70b?").domain == "llm"
    assert read_question("Why is tokens-api failing?").domain == "service"


def test_a_product_the_telemetry_knows_outranks_an_llm_word_in_the_question(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, {"series": [{**POOL["series"][0], "product": "tokens"}],
                            "logs": [{**POOL["logs"][0], "product": "tokens"}]})
    text, calls, _ = _ask(harness, tenant, "Why is the tokens service slow?")  # "tokens" alone sounds like LLMs
    assert calls[0]["name"] == "list_products" and "get_deployment_status" not in {c["name"] for c in calls}
    assert "tokens's http_request_duration_seconds_p99" in text and "connection-pool exhaustion" in _cause(text)


def test_an_llm_platform_that_reports_nothing_is_no_data_not_healthy(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, {"series": [{"product": "billing", "metric": "http_requests_error_ratio",
                                        "before": 0.01, "after": 0.01, "span": "3h"}]})
    text, _, _ = _ask(harness, tenant, "Why is claude slow?")  # no such product: the platform it is
    assert "report healthy" not in text and "All 0" not in text
    assert "no LLM-platform data" in text and "billing" in text  # what does exist is offered


# ---- the LLM platform: a noisy neighbour needs neighbours --------------------------------------


def _deployment(status: str, **extra: Any) -> dict[str, Any]:
    return {"deployment_id": "mixtral-8x7b/onprem", "model_id": "mixtral-8x7b", "backend_id": "onprem",
            "status": status, "latency_p95_ms": 2350, "queue_depth": 17, "updated_at": "-2m", **extra}


def test_a_failing_deployment_with_one_user_does_not_blame_that_user(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, {
        "llm-deployments": [_deployment("degraded", error_rate=0.373)],
        "llm-users": [{"user_id": "u-ops1", "tier": "standard"}],
        "llm-requests": [{"request_id": f"req_m{i:04d}", "user_id": "u-ops1", "user_tier": "standard",
                          "deployment_id": "mixtral-8x7b/onprem", "model_id": "mixtral-8x7b", "backend_id": "onprem",
                          "latency_ms": 2000 + i, "status": "error" if i % 3 == 0 else "success",
                          "created_at": f"-{i + 1}m"} for i in range(40)]})
    text, calls, done = _ask(harness, tenant, "Why are mixtral answers failing for our users?")
    cause = _cause(text)
    assert "noisy neighbour" not in text and "u-ops1 (standard tier)" not in cause
    assert "mixtral-8x7b/onprem is degraded by itself" in cause
    assert "propose_action" not in {c["name"] for c in calls}  # no rate limit for the only user
    assert "error rate 37%" in text and done["grounding"]["uncited_numbers"] == []  # its own numbers are found


def _page(counts: dict[str, int], errors: dict[str, int] | None = None) -> Requests:
    from kortex.llm.offline.platform import analyse_requests
    from kortex.tools.builtin.get_recent_requests import tally
    rows = [{"user_id": user, "user_tier": "standard",
             "status": "error" if n < (errors or {}).get(user, 0) else "success"}
            for user, count in counts.items() for n in range(count)]
    return analyse_requests({"requests": rows, **tally(rows)})


def test_a_noisy_neighbour_sends_well_over_its_fair_share_and_errors_are_not_everyone_s() -> None:
    assert _page({"bulk": 90, "a": 4, "b": 3, "c": 3}).noisy
    assert not _page({"bulk": 40}).noisy                      # no neighbour to crowd out
    assert not _page({"bulk": 60, "a": 40}).noisy             # 60% of two users' traffic is near fair
    assert _page({"bulk": 85, "a": 15}).noisy
    # everyone's requests fail alike: the deployment fails them, not the busiest user
    assert not _page({"bulk": 80, "a": 10, "b": 10}, errors={"bulk": 24, "a": 3, "b": 3}).noisy
    assert _page({"bulk": 80, "a": 10, "b": 10}, errors={"bulk": 24}).noisy


def test_a_user_without_a_budget_is_not_shown_a_none_budget(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    requests = [{"request_id": f"req_n{i:04d}", "user_id": "bulk" if i % 10 else f"u{i}", "user_tier": "standard",
                 "deployment_id": "mixtral-8x7b/onprem", "model_id": "mixtral-8x7b", "backend_id": "onprem",
                 "latency_ms": 3000, "status": "success", "created_at": f"-{i // 2 + 1}m"} for i in range(60)]
    _load(harness, tenant, {"llm-deployments": [_deployment("degraded", error_rate=0.01)],
                            "llm-users": [{"user_id": "bulk", "tier": "standard"}],
                            "llm-requests": requests})
    text, calls, _ = _ask(harness, tenant, "Why are mixtral answers slow for our users?")
    assert "get_user_context" in {c["name"] for c in calls} and "noisy neighbour" in _cause(text)
    assert "$None" not in text and "no daily budget set" in text


# ---- a product nothing reports -----------------------------------------------------------------


def test_a_product_with_no_telemetry_is_said_to_have_none_not_to_be_steady(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, {"series": [{"product": "billing", "metric": "http_request_duration_seconds_p99",
                                        "before": 0.1, "after": 0.1, "span": "3h"}]})
    text, _, _ = _ask(harness, tenant, "Why is ledgerd slow?")
    assert "Nothing abnormal" not in text and "no step change" not in text
    assert "I found no telemetry of ledgerd" in text and "billing" in text


def test_metrics_without_samples_and_no_log_lines_are_no_telemetry(harness_factory) -> None:
    # Without list_products, the empty metric and the empty logs are all there is to go by.
    h = harness_factory(tools={"allowed": ["get_recent_deploys", "compare_to_baseline", "get_logs"]})
    tenant = h.tenant("acme")
    _load(h, tenant, {"series": [{"product": "billing", "metric": "http_request_duration_seconds_p99",
                                  "before": 0.1, "after": 0.1, "span": "3h"}]})
    text, _, _ = _ask(h, tenant, "Why is ledgerd slow?")
    assert "Nothing abnormal" not in text and "I found no telemetry of ledgerd" in text


# ---- a cause the logs name outranks a deploy that only stands next to it ------------------------


def _tls_with_deploy(message: str) -> dict[str, Any]:
    return {"series": [{"product": "payroll-export", "metric": "job_failures_ratio", "before": 0.01, "after": 0.93,
                        "onset": "-40m", "span": "3h"}],
            "logs": [{"product": "payroll-export", "level": "error", "host": "px-2", "message": message,
                      "from": "-40m", "every": "10s"}],
            "deploys": [{"product": "payroll-export", "ts": "-55m", "version": "v3.2.1", "actor": "docs-bot",
                         "commit": "d0c5f1a"}]}


def test_an_expired_certificate_outranks_a_coincidental_deploy(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _load(harness, tenant, _tls_with_deploy(
        "POST https://bankgw.internal/v2/batches failed: SSL: CERTIFICATE_VERIFY_FAILED certificate verify failed: "
        "certificate has expired (_ssl.c:1006)"))
    text, calls, _ = _ask(harness, tenant, "Why are payroll-export jobs failing?")
    cause = _cause(text)
    assert "expired TLS certificate" in cause and "v3.2.1" not in cause
    assert "rolling back" not in text and "back from v3.2.1" not in text
    assert "propose_action" not in {c["name"] for c in calls}  # no rollback proposed


def test_a_full_disk_written_as_enospc_is_named() -> None:
    from kortex.llm.offline.evidence import classify
    found = classify("write /var/cache/frames/seg-0042.tmp: ENOSPC")
    assert found is not None and found.name == "disk full" and not found.deployable
    expired = classify("TLS handshake failed: x509: certificate has expired (api.example.com)")
    assert expired is not None and "certificate" in expired.name
    assert classify("service account credential expired") is None  # a credential is no certificate


def test_a_deploy_that_brings_the_named_cause_still_leads(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    telemetry = _tls_with_deploy("connection pool exhausted waiting for a connection to payroll-db")
    telemetry["deploys"][0]["ts"] = "-45m"
    _load(harness, tenant, telemetry)
    text, _, _ = _ask(harness, tenant, "Why are payroll-export jobs failing?")
    assert "introduced by deploy v3.2.1" in _cause(text)


# ---- the strict grounding check's re-ask -------------------------------------------------------


async def _collect(analyst: OfflineAnalyst, request: CompletionRequest) -> list[Any]:
    return [chunk async for chunk in analyst.stream(request)]


def _investigate(h: Harness, tenant: str, question: str) -> tuple[list[Message], str]:
    """The analyst's turn driven by hand: its tool calls run through the real pipeline."""
    analyst, tools = OfflineAnalyst(), CHAT.tool_schemas(h.k)
    messages: list[Message] = [UserMessage(content=question)]
    for _ in range(10):
        chunks = asyncio.run(_collect(analyst, CompletionRequest(messages=tuple(messages), tools=tools)))
        calls = tuple(c.call for c in chunks if isinstance(c, ToolCallChunk))
        if not calls:
            return messages, "".join(c.text for c in chunks if isinstance(c, TextChunk))
        messages.append(AssistantMessage(content="", tool_calls=calls))
        messages += [ToolMessage(result=h.call(tenant, c.name, c.arguments, call_id=c.id)) for c in calls]
    raise AssertionError("the analyst never answered")


def test_the_re_ask_of_the_strict_grounding_check_is_answered_from_the_turn_s_results(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    messages, first = _investigate(harness, tenant, "Why is checkout slow?")
    assert "v2.14.0" in first
    reask = REGROUND.format(calls="call_x", dangling="none", numbers="42")
    again = asyncio.run(_collect(OfflineAnalyst(), CompletionRequest(tools=(), messages=(
        *messages, AssistantMessage(content=first), UserMessage(content=reask)))))
    assert not [c for c in again if isinstance(c, ToolCallChunk)]  # no tools are offered: none is called
    second = "".join(c.text for c in again if isinstance(c, TextChunk))
    assert "no investigation tools" not in second and second == first
