"""The eight LLM-ops tools (llm-ops-agent-tools.md) on the embedded store."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from kortex.storage.schema import llm_requests
from kortex.telemetry import embedded_llmops, ingest
from kortex.timeparse import isoformat, utcnow
from tests.conftest import Harness, make_settings


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> tuple[Path, str]:
    """The scenario seeded once per module (it is the slow part); each test gets its own copy."""
    path = tmp_path_factory.mktemp("llmops") / "kortex.db"
    shutil.copy(sqlite_template, path)
    h = Harness(make_settings(path.parent, f"sqlite:///{path}"))
    tenant = h.tenant("acme")
    h.seed(tenant, "llm-backend-degraded")
    h.close()
    return path, tenant


@pytest.fixture
def platform(seeded: tuple[Path, str], tmp_path: Path) -> Iterator[tuple[Harness, str]]:
    path, tenant = seeded
    shutil.copy(path, tmp_path / "kortex.db")
    h = Harness(make_settings(tmp_path, f"sqlite:///{tmp_path / 'kortex.db'}"))
    yield h, tenant
    h.close()


def _count(h: Harness, tenant: str, *where) -> int:
    with h.k.db.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(llm_requests)
                               .where(llm_requests.c.tenant_id == tenant, *where)) or 0)


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_deployment_status_filters_and_summarises(platform) -> None:
    h, tenant = platform
    every = h.call(tenant, "get_deployment_status", {}).content
    assert every["summary"] == {"total": 5, "healthy": 4, "degraded": 1, "down": 0}
    aws = next(d for d in every["deployments"] if d["id"] == "gpt-4/aws")
    assert aws["status"] == "degraded" and aws["latency_p95_ms"] == 4600 and aws["is_stale"] is False
    assert [d["id"] for d in h.call(tenant, "get_deployment_status", {"model_id": "gpt-4"}).content["deployments"]] \
        == ["gpt-4/aws", "gpt-4/azure"]
    degraded = h.call(tenant, "get_deployment_status", {"status": "degraded"}).content
    assert [d["id"] for d in degraded["deployments"]] == ["gpt-4/aws"] and degraded["summary"]["total"] == 1
    none = h.call(tenant, "get_deployment_status", {"backend_id": "nowhere"}).content
    assert none == {"deployments": [], "summary": {"total": 0, "healthy": 0, "degraded": 0, "down": 0}}
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "llm-deployments", [{
            "deployment_id": "qwen/edge", "model_id": "qwen", "backend_id": "edge", "status": "down",
            "updated_at": utcnow() - timedelta(minutes=10), "sample_count": 0}])
    edge = h.call(tenant, "get_deployment_status", {"status": "down"}).content["deployments"][0]
    assert edge["id"] == "qwen/edge" and edge["is_stale"] is True
    bad = h.call(tenant, "get_deployment_status", {"status": "sick"})
    assert bad.error_code == "validation" and bad.content["code"] == "INVALID_PARAMETER"


def test_active_incidents_are_the_open_ones(platform) -> None:
    h, tenant = platform
    active = h.call(tenant, "get_active_incidents", {}).content
    assert active["count"] == 1 and active["incidents"][0]["id"] == "INC-2207"
    assert 36 <= active["incidents"][0]["duration_minutes"] <= 39
    assert h.call(tenant, "get_active_incidents", {"target_type": "backend", "target_id": "aws"}).content["count"] == 1
    assert h.call(tenant, "get_active_incidents", {"target_type": "model"}).content == {"incidents": [], "count": 0}
    assert h.call(tenant, "get_active_incidents", {"target_type": "planet"}).error_code == "validation"
    assert h.call(h.tenant("other"), "get_active_incidents", {}).content["count"] == 0


def test_incidents_filed_against_a_product_filter_as_they_are_shown(platform) -> None:
    h, tenant = platform
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "incidents", [{
            "ref": "INC-3001", "product": "checkout", "title": "checkout errors", "severity": "error",
            "opened_at": utcnow() - timedelta(minutes=5), "closed_at": None, "findings": "", "resolution": "",
            "target_type": None, "target_id": None}])
    shown = next(i for i in h.call(tenant, "get_active_incidents", {}).content["incidents"] if i["id"] == "INC-3001")
    assert (shown["target_type"], shown["target_id"]) == ("product", "checkout")
    for args in ({"target_type": "product"}, {"target_id": "checkout"},
                 {"target_type": "product", "target_id": "checkout"}):
        found = h.call(tenant, "get_active_incidents", args).content
        assert [i["id"] for i in found["incidents"]] == ["INC-3001"], args
    assert h.call(tenant, "get_active_incidents", {"target_type": "backend", "target_id": "checkout"}) \
        .content["count"] == 0
    assert [i["id"] for i in h.call(tenant, "get_active_incidents", {"target_type": "backend"})
            .content["incidents"]] == ["INC-2207"]


def test_recent_requests_filter_and_page_through_a_pinned_window(platform) -> None:
    h, tenant = platform
    now = utcnow()
    timeouts = h.call(tenant, "get_recent_requests", {"deployment_id": "gpt-4/aws", "status": "timeout",
                                                      "since": "1 hour ago"}).content
    assert timeouts["count"] > 0 and {r["status"] for r in timeouts["requests"]} == {"timeout"}
    assert {r["deployment_id"] for r in timeouts["requests"]} == {"gpt-4/aws"}
    premium = h.call(tenant, "get_recent_requests", {"user_tier": "premium", "limit": 10}).content["requests"]
    assert len(premium) == 10 and {r["user_tier"] for r in premium} == {"premium"}
    first = h.call(tenant, "get_recent_requests", {"since": "1 hour ago", "limit": 25}).content
    with h.k.db.begin() as conn:  # arrives while the model pages: must not shift the pages
        ingest.write(conn, tenant, "llm-requests", [{
            "request_id": "req_late", "user_id": "user_101", "user_tier": "premium", "deployment_id": "gpt-4/aws",
            "model_id": "gpt-4", "backend_id": "aws", "latency_ms": 1, "status": "success", "created_at": utcnow()}])
    items, cursor, pages = list(first["requests"]), first.get("next_cursor"), 1
    while cursor:
        page = h.call(tenant, "get_recent_requests", {"since": "1 hour ago", "limit": 25, "cursor": cursor}).content
        items += page["requests"]
        cursor, pages = page.get("next_cursor"), pages + 1
        assert page["has_more"] == bool(cursor)
    ids = [r["id"] for r in items]
    expected = _count(h, tenant, llm_requests.c.created_at >= _ts(first["since"]),
                      llm_requests.c.created_at < _ts(first["until"]))
    assert len(ids) == len(set(ids)) == expected > 25 and pages == -(-expected // 25)
    assert "req_late" not in ids
    stamps = [r["created_at"] for r in items]
    assert stamps == sorted(stamps, reverse=True)
    assert timedelta(minutes=59) < now - _ts(first["since"]) <= timedelta(hours=1, seconds=5)
    other_args = h.call(tenant, "get_recent_requests", {"since": "2 hours ago", "limit": 25,
                                                        "cursor": first["next_cursor"]})
    assert other_args.error_code == "validation" and "different query" in other_args.content["message"]


@pytest.mark.parametrize("since", ["PT30M", "last 30m", "30 minutes ago", "now-30m", "half"])
def test_recent_requests_accept_relative_times(platform, since: str) -> None:
    h, tenant = platform
    now = utcnow()
    if since == "half":  # an ISO 8601 interval
        since = f"{isoformat(now - timedelta(minutes=30))}/PT30M"
    result = h.call(tenant, "get_recent_requests", {"since": since, "limit": 100}, now=now).content
    assert abs((_ts(result["since"]) - (now - timedelta(minutes=30))).total_seconds()) < 1
    assert result["count"] == min(100, _count(h, tenant, llm_requests.c.created_at >= _ts(result["since"]),
                                              llm_requests.c.created_at < _ts(result["until"])))


def test_recent_requests_reject_bad_parameters_and_answer_empty_lists(platform) -> None:
    h, tenant = platform
    for args in ({"limit": 101}, {"since": "tomorrow-ish"}, {"since": "1 hour ago", "until": "2 hours ago"},
                 {"status": "ok"}, {"deployment_id": "no-slash"}, {"colour": "red"}):
        result = h.call(tenant, "get_recent_requests", args)
        assert result.is_error and result.error_code == "validation", args
        assert result.content["code"] == "INVALID_PARAMETER"
    empty = h.call(tenant, "get_recent_requests", {"user_id": "nobody"}).content
    assert empty["requests"] == [] and empty["count"] == 0 and empty["has_more"] is False
    now = utcnow()
    yesterday = h.call(tenant, "get_recent_requests", {"since": "yesterday", "limit": 5}, now=now).content
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    assert _ts(yesterday["since"]) == midnight - timedelta(days=1)  # until defaults to now
    assert abs((_ts(yesterday["until"]) - now).total_seconds()) < 0.01


def test_request_detail_shows_the_routing_decision_and_the_incident(platform) -> None:
    h, tenant = platform
    failed = h.call(tenant, "get_recent_requests", {"deployment_id": "gpt-4/aws", "status": "timeout",
                                                    "since": "30 minutes ago", "limit": 1}).content["requests"][0]
    detail = h.call(tenant, "get_request_detail", {"request_id": failed["id"]}).content
    assert detail["request"]["status"] == "timeout" and detail["request"]["latency_ms"] == 30_000
    options = detail["request"]["routing_decision"]["options_considered"]
    assert {o["deployment"] for o in options} == {"gpt-4/aws", "gpt-4/azure"}
    assert detail["related_incident"]["id"] == "INC-2207"
    old = h.call(tenant, "get_recent_requests", {"deployment_id": "gpt-4/aws", "since": "20 hours ago",
                                                 "until": "19 hours ago", "limit": 1}).content["requests"][0]
    assert h.call(tenant, "get_request_detail", {"request_id": old["id"]}).content["related_incident"] is None
    missing = h.call(tenant, "get_request_detail", {"request_id": "req_missing"})
    assert missing.error_code == "not_found" and missing.content == {
        "error": True, "message": "Request not found: req_missing", "code": "NOT_FOUND", "error_code": "not_found"}
    assert h.call(h.tenant("other"), "get_request_detail", {"request_id": failed["id"]}).error_code == "not_found"


def test_user_context_counts_today(platform) -> None:
    h, tenant = platform
    now = utcnow()
    user = h.call(tenant, "get_user_context", {"user_id": "user_101"}, now=now).content["user"]
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    assert user["tier"] == "premium" and user["latency_sla_ms"] == 800 and user["daily_budget_usd"] == 50.0
    assert user["requests_today"] == _count(h, tenant, llm_requests.c.user_id == "user_101",
                                            llm_requests.c.created_at >= midnight, llm_requests.c.created_at < now)
    assert user["daily_budget_remaining_usd"] == round(50.0 - user["daily_budget_used_usd"], 4)
    assert h.call(tenant, "get_user_context", {"user_id": "ghost"}).error_code == "not_found"
    assert h.call(tenant, "get_user_context", {}).error_code == "validation"


def test_latency_trends_show_the_degradation(platform) -> None:
    h, tenant = platform
    aws = h.call(tenant, "get_latency_trends", {"deployment_id": "gpt-4/aws", "since": "last 6h"}).content
    rows = aws["data"]
    assert {r["deployment_id"] for r in rows} == {"gpt-4/aws"} and 6 <= len(rows) <= 7
    # The degradation began 40 minutes ago: it fills the current hour (which may have only just
    # begun, with a handful of requests) or the one before.
    recent = rows[-2:]
    assert max(r["latency_p95_ms"] for r in recent) > 5 * rows[1]["latency_p95_ms"]
    assert max(r["error_rate"] for r in recent) > 0.05
    assert aws["summary"]["total_requests"] == sum(r["request_count"] for r in rows)
    gpt4 = h.call(tenant, "get_latency_trends", {"model_id": "gpt-4", "granularity": "day", "since": "2 days ago"})
    assert {r["deployment_id"] for r in gpt4.content["data"]} == {"gpt-4/aws", "gpt-4/azure"}
    assert all(r["period"].endswith("T00:00:00.000Z") for r in gpt4.content["data"])
    too_fine = h.call(tenant, "get_latency_trends", {"since": "40 days ago"})
    assert too_fine.error_code == "validation" and "granularity" in too_fine.content["message"]
    assert h.call(tenant, "get_latency_trends", {"granularity": "minute"}).error_code == "validation"


def test_quality_summary_aggregates_scores(platform) -> None:
    h, tenant = platform
    gpt4 = h.call(tenant, "get_quality_summary", {"model_id": "gpt-4"}).content["data"]
    assert {r["task_type"] for r in gpt4} == {"summarization", "coding", "chat", "extraction"}
    assert all(0.85 < r["avg_score"] < 0.95 and r["min_score"] <= r["avg_score"] <= r["max_score"] for r in gpt4)
    assert sum(r["sample_count"] for r in gpt4) == _count(h, tenant, llm_requests.c.model_id == "gpt-4",
                                                          llm_requests.c.quality_score.is_not(None))
    coding = h.call(tenant, "get_quality_summary", {"task_type": "coding"}).content["data"]
    assert {r["task_type"] for r in coding} == {"coding"} and len(coding) == 4


def test_request_volume_groups_and_totals(platform) -> None:
    h, tenant = platform
    now = utcnow()
    daily = h.call(tenant, "get_request_volume", {"group_by": "deployment", "since": "yesterday"}, now=now).content
    yesterday = (now - timedelta(days=1)).date().isoformat()
    assert {r["period"] for r in daily["data"]} == {yesterday, now.date().isoformat()}  # until defaults to now
    only = h.call(tenant, "get_request_volume", {"group_by": "deployment", "since": "yesterday", "until": "today"},
                  now=now).content
    assert {r["period"] for r in only["data"]} == {yesterday}
    assert set(daily["totals"]) == {"gpt-4/aws", "gpt-4/azure", "claude-3/anthropic", "llama-70b/k8s",
                                    "mistral-large/neocloud"}
    assert sum(t["requests"] for t in daily["totals"].values()) == sum(r["request_count"] for r in daily["data"])
    week = h.call(tenant, "get_request_volume", {}, now=now).content
    assert week["group_by"] == "tier" and set(week["totals"]) == {"premium", "standard", "budget"}
    assert sum(t["requests"] for t in week["totals"].values()) == _count(h, tenant)
    hourly = h.call(tenant, "get_request_volume", {"group_by": "backend", "since": "last 3h",
                                                   "granularity": "hour"}).content
    assert all(r["period"].endswith(":00:00.000Z") for r in hourly["data"])
    assert h.call(tenant, "get_request_volume", {"group_by": "colour"}).error_code == "validation"
    too_fine = h.call(tenant, "get_request_volume", {"since": "40 days ago", "granularity": "hour"})
    assert too_fine.error_code == "validation" and "granularity" in too_fine.content["message"]


def test_request_volume_cut_keeps_the_newest_periods_whole_and_says_so(platform, monkeypatch) -> None:
    h, tenant = platform
    now = utcnow()
    args = {"group_by": "deployment", "since": "last 6h", "granularity": "hour"}
    full = h.call(tenant, "get_request_volume", args, now=now).content
    assert full["truncated"] is False and len(full["data"]) > 20
    monkeypatch.setattr(embedded_llmops, "MAX_VOLUME_ROWS", 12)
    cut = h.call(tenant, "get_request_volume", args, now=now).content
    assert cut["truncated"] is True and "totals cover the whole window" in cut["note"]
    assert cut["totals"] == full["totals"]  # the cut is the listing's, never the totals
    newest = max(r["period"] for r in full["data"])
    assert max(r["period"] for r in cut["data"]) == newest  # the newest hour is never the part dropped
    for period in {r["period"] for r in cut["data"]}:  # and every hour shown is whole
        assert [r for r in cut["data"] if r["period"] == period] == [r for r in full["data"] if r["period"] == period]


def test_the_output_cap_never_skips_requests_between_pages(seeded: tuple[Path, str], tmp_path: Path) -> None:
    path, tenant = seeded
    shutil.copy(path, tmp_path / "kortex.db")
    h = Harness(make_settings(tmp_path, f"sqlite:///{tmp_path / 'kortex.db'}", tools={"result_cap_bytes": 4096}))
    try:
        args = {"since": "2 hours ago", "until": "1 hour ago", "limit": 100}
        first = h.call(tenant, "get_recent_requests", args)
        assert first.truncated and 0 < first.content["count"] < 100 and first.content["has_more"]
        items, pages = h.page_through(tenant, "get_recent_requests", args, "requests")
        ids = [r["id"] for r in items]
        window = (_ts(first.content["since"]), _ts(first.content["until"]))
        expected = _count(h, tenant, llm_requests.c.created_at >= window[0], llm_requests.c.created_at < window[1])
        assert len(ids) == len(set(ids)) == expected and pages > expected // 100 + 1
    finally:
        h.close()


def test_the_output_cap_keeps_the_latest_periods_of_a_series(seeded: tuple[Path, str], tmp_path: Path) -> None:
    path, tenant = seeded
    shutil.copy(path, tmp_path / "kortex.db")
    now = utcnow()
    args = {"since": "last 24h", "granularity": "hour"}
    roomy = Harness(make_settings(tmp_path, f"sqlite:///{tmp_path / 'kortex.db'}"))
    tight = Harness(make_settings(tmp_path, f"sqlite:///{tmp_path / 'kortex.db'}", tools={"result_cap_bytes": 4096}))
    try:
        for tool in ("get_latency_trends", "get_request_volume"):
            full = roomy.call(tenant, tool, args, now=now)
            cut = tight.call(tenant, tool, args, now=now)
            assert not full.truncated and cut.truncated and cut.content["truncated"] is True
            kept = cut.content["data"]
            assert 0 < len(kept) < len(full.content["data"])
            assert kept == full.content["data"][-len(kept):]  # the newest rows, oldest dropped
    finally:
        roomy.close()
        tight.close()


def test_lists_past_their_cap_say_truncated_instead_of_ending_silently(platform, monkeypatch) -> None:
    from kortex.tools.builtin import get_active_incidents, get_deployment_status, get_quality_summary

    h, tenant = platform
    whole = {
        "get_deployment_status": h.call(tenant, "get_deployment_status", {}).content["deployments"],
        "get_quality_summary": h.call(tenant, "get_quality_summary", {}).content["data"],
        "get_active_incidents": h.call(tenant, "get_active_incidents", {}).content["incidents"],
    }
    assert len(whole["get_deployment_status"]) == 5 and len(whole["get_quality_summary"]) > 2
    assert len(whole["get_active_incidents"]) == 1
    for tool in whole:
        result = h.call(tenant, tool, {})
        assert not result.truncated and "truncated" not in result.content, tool
    monkeypatch.setattr(get_deployment_status, "MAX_DEPLOYMENTS", 2)
    monkeypatch.setattr(get_quality_summary, "MAX_ROWS", 2)
    deployments = h.call(tenant, "get_deployment_status", {})
    assert deployments.truncated and deployments.content["deployments"] == whole["get_deployment_status"][:2]
    assert deployments.content["summary"]["total"] == 5 and "first 2 of 5" in deployments.content["note"]
    quality = h.call(tenant, "get_quality_summary", {})
    assert quality.truncated and quality.content["data"] == whole["get_quality_summary"][:2]
    with h.k.db.begin() as conn:  # a second open incident
        ingest.write(conn, tenant, "incidents", ingest.validate_batch("incidents", [
            {"ref": "INC-9000", "title": "queue backlog", "opened_at": isoformat(utcnow() - timedelta(minutes=5)),
             "target_type": "backend", "target_id": "k8s"}], now=utcnow()))
    monkeypatch.setattr(get_active_incidents, "MAX_INCIDENTS", 1)
    incidents = h.call(tenant, "get_active_incidents", {})
    assert incidents.truncated and incidents.content["count"] == 2 and len(incidents.content["incidents"]) == 1
    assert incidents.content["incidents"][0]["id"] == "INC-9000"  # the most recent is kept
