"""The built-in telemetry tools over the embedded store."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from kortex.messages import ToolCall
from kortex.storage.schema import telemetry_logs
from kortex.timeparse import utcnow
from kortex.tools.spec import ToolContext
from tests.conftest import Harness


def call(h: Harness, tenant: str, name: str, args: dict[str, Any]) -> Any:
    ctx = ToolContext(tenant_id=tenant, session_id=None, turn_id=None, call_id="c", step=0, now=utcnow(),
                      sources=h.k.sources, services={"cursors": h.k.cursors})
    return h.k.pipeline.run(ToolCall(id="c", name=name, arguments=args), ctx)


def test_get_logs_pages_through_every_match_without_gaps_or_repeats(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    args = {"product": "checkout", "time_range": "last 3h", "level": "error", "limit": 40}
    seen: list[tuple[str, str]] = []
    levels: set[str] = set()
    total = None
    cursor = None
    pages = 0
    while True:
        result = call(harness, tenant, "get_logs", {**args, **({"cursor": cursor} if cursor else {})})
        assert not result.is_error, result.content
        content = result.content
        total = content["total_matches"] if total is None else total
        assert content["total_matches"] == total
        seen += [(line["ts"], line["message"]) for line in content["lines"]]
        levels |= {line["level"] for line in content["lines"]}
        pages += 1
        cursor = content.get("next_cursor")
        if not cursor:
            break
    assert len(seen) == total and len(set(seen)) == total > 40
    assert pages == -(-total // 40)
    assert seen == sorted(seen, key=lambda x: x[0], reverse=True)  # newest first throughout
    assert levels == {"error"}


def test_get_logs_window_is_pinned_by_the_cursor(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    first = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "limit": 10})
    # New lines arriving between pages must not shift what page two returns.
    def add_line() -> None:
        with harness.k.db.begin() as conn:
            conn.execute(telemetry_logs.insert().values(
                tenant_id=tenant, product="checkout", ts=utcnow() - timedelta(seconds=1), severity=20, level="info",
                host="h", message="late arrival"))
    add_line()
    second = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "limit": 10,
                                                "cursor": first.content["next_cursor"]})
    assert not second.is_error
    assert "late arrival" not in [line["message"] for line in second.content["lines"]]
    assert second.content["lines"][0]["ts"] <= first.content["lines"][-1]["ts"]


def test_forged_or_foreign_cursors_are_rejected(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    first = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "limit": 5})
    cursor = first.content["next_cursor"]
    tampered = cursor[:-3] + ("AAA" if not cursor.endswith("AAA") else "BBB")
    bad = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "cursor": tampered})
    assert bad.is_error and bad.error_code == "validation"
    other_query = call(harness, tenant, "get_logs", {"product": "payments", "time_range": "last 3h",
                                                     "cursor": cursor})
    assert other_query.is_error and "different query" in other_query.content["message"]
    other_tenant = harness.tenant("other")
    stolen = call(harness, other_tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "limit": 5,
                                                      "cursor": cursor})
    assert stolen.is_error and stolen.error_code == "validation"


def test_page_size_is_capped_at_100(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    over = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "limit": 500})
    assert over.is_error and over.error_code == "validation"
    page = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h"})
    assert len(page.content["lines"]) == 100 and page.content["total_matches"] > 100


def test_logs_filter_by_text_and_level_and_stay_in_the_tenant(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    found = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h",
                                               "query": "POOL EXHAUSTED", "limit": 100})
    assert found.content["total_matches"] > 0
    assert all("pool exhausted" in line["message"] for line in found.content["lines"])
    warn = call(harness, tenant, "get_logs", {"product": "checkout", "time_range": "last 3h", "level": "warn"})
    assert {line["level"] for line in warn.content["lines"]} <= {"warn", "error", "fatal"}
    nobody = harness.tenant("nobody")
    empty = call(harness, nobody, "get_logs", {"product": "checkout", "time_range": "last 3h"})
    assert empty.content["lines"] == [] and empty.content["total_matches"] == 0
    assert "next_cursor" not in empty.content


def test_get_metrics_returns_series_and_statistics(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    result = call(harness, tenant, "get_metrics", {"product": "checkout",
                                                   "metric_name": "http_request_duration_seconds_p99",
                                                   "time_range": "last 3h"})
    content = result.content
    assert content["unit"] == "seconds" and 170 <= len(content["samples"]) <= 181
    stats = content["stats"]
    assert stats["min"] <= stats["p50"] <= stats["p95"] <= stats["p99"] <= stats["max"]
    assert stats["max"] > 1.0 and stats["min"] < 0.3
    coarse = call(harness, tenant, "get_metrics", {"product": "checkout", "metric_name":
                                                   "http_request_duration_seconds_p99", "time_range": "last 3h",
                                                   "step": "30m"})
    assert 6 <= len(coarse.content["samples"]) <= 7
    missing = call(harness, tenant, "get_metrics", {"product": "checkout", "metric_name": "nope",
                                                    "time_range": "last 3h"})
    assert missing.content["samples"] == [] and missing.content["stats"] is None
    assert "http_request_duration_seconds_p99" in missing.content["available_metrics"]


def test_metric_label_values_sent_as_numbers_are_taken_as_text(harness: Harness) -> None:
    from kortex.telemetry import ingest

    tenant = harness.tenant("labels")
    now = utcnow()
    items = [{"product": "api", "metric": "http_requests_total", "ts": (now - timedelta(minutes=i)).isoformat(),
              "value": float(code), "labels": {"code": str(code)}}
             for i in range(1, 30) for code in (200, 500)]
    with harness.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", ingest.validate_batch("metrics", items, now=now))
    base = {"product": "api", "metric_name": "http_requests_total", "time_range": "last 1h"}
    as_number = call(harness, tenant, "get_metrics", {**base, "labels": {"code": 500}})
    as_text = call(harness, tenant, "get_metrics", {**base, "labels": {"code": "500"}})
    assert not as_number.is_error and as_number.content["stats"] == as_text.content["stats"]
    assert [p["value"] for p in as_number.content["samples"]] == [p["value"] for p in as_text.content["samples"]]
    assert as_number.content["stats"]["min"] == as_number.content["stats"]["max"] == 500.0
    nested = call(harness, tenant, "get_metrics", {**base, "labels": {"code": [500]}})
    assert nested.is_error and nested.error_code == "validation"


def test_get_recent_deploys_lists_the_window_newest_first(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    recent = call(harness, tenant, "get_recent_deploys", {"product": "checkout", "time_range": "last 3h"})
    assert [d["version"] for d in recent.content["deploys"]] == ["v2.14.0"]
    day = call(harness, tenant, "get_recent_deploys", {"product": "checkout", "time_range": "P2D"})
    assert [d["version"] for d in day.content["deploys"]] == ["v2.14.0", "v2.13.2"]
    bad = call(harness, tenant, "get_recent_deploys", {"product": "checkout", "time_range": "last fortnight"})
    assert bad.is_error and bad.error_code == "validation" and "time" in bad.content["message"]


def test_get_recent_deploys_says_truncated_past_its_cap(harness: Harness) -> None:
    from kortex.telemetry import ingest
    from kortex.tools.builtin.get_recent_deploys import MAX_DEPLOYS

    tenant = harness.tenant("busy")
    now = utcnow()
    items = [{"product": "api", "ts": (now - timedelta(minutes=i)).isoformat(), "version": f"v{i}"}
             for i in range(MAX_DEPLOYS + 5)]
    with harness.k.db.begin() as conn:
        ingest.write(conn, tenant, "deploys", ingest.validate_batch("deploys", items, now=now))
    busy = call(harness, tenant, "get_recent_deploys", {"product": "api", "time_range": "last 6h"})
    assert not busy.is_error and busy.truncated and busy.content["truncated"] is True
    assert [d["version"] for d in busy.content["deploys"]] == [f"v{i}" for i in range(MAX_DEPLOYS)]
    quiet = call(harness, tenant, "get_recent_deploys", {"product": "api", "time_range": "last 30m"})
    assert len(quiet.content["deploys"]) == 30 and "truncated" not in quiet.content and not quiet.truncated


def test_the_database_stops_tool_queries_at_their_timeout(tmp_path) -> None:
    import pytest
    from sqlalchemy import text

    from kortex.errors import StorageError
    from kortex.storage.db import Database

    db = Database(f"sqlite:///{tmp_path / 't.db'}", statement_timeout=0.2)
    slow = text("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    with pytest.raises(StorageError), db.connect() as conn:
        conn.execute(slow).all()  # never ends by itself
    with db.connect() as conn:  # the connection is fine afterwards
        assert conn.execute(text("SELECT 1")).scalar() == 1
    db.dispose()
