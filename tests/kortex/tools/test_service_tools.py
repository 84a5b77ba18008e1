"""The rfc-005 tools beyond logs, metrics and deploys, and LogQL filters, on the embedded store."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from kortex.storage.schema import telemetry_spans
from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from tests.conftest import Harness

P99 = "http_request_duration_seconds_p99"


def _write(h: Harness, tenant: str, kind: str, rows: list[dict]) -> None:
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, kind, rows)


# ---- get_logs: LogQL ----------------------------------------------------------------------


def test_logql_line_filters_are_case_sensitive_and_chain(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    base = {"product": "checkout", "time_range": "last 3h"}
    plain = harness.call(tenant, "get_logs", {**base, "query": "POOL EXHAUSTED"}).content
    exact = harness.call(tenant, "get_logs", {**base, "query": '|= "POOL EXHAUSTED"'}).content
    assert plain["total_matches"] > 100 and exact["total_matches"] == 0  # plain text ignores case, |= does not
    pool = harness.call(tenant, "get_logs", {**base, "query": '|= "pool" != "waiting"'}).content
    assert pool["total_matches"] == 3  # the three "starting ... pool max_size=10" lines
    assert all("pool" in line["message"] and "waiting" not in line["message"] for line in pool["lines"])
    slow = harness.call(tenant, "get_logs", {**base, "query": '{level="warn"} |~ "took [0-9]{4}ms"'}).content
    assert slow["total_matches"] > 0 and {line["level"] for line in slow["lines"]} == {"warn"}
    one_host = harness.call(tenant, "get_logs", {**base, "query": '{host=~"checkout-7d9f-[12]", level!="info"}'})
    assert {line["host"] for line in one_host.content["lines"]} == {"checkout-7d9f-1", "checkout-7d9f-2"}
    assert "info" not in {line["level"] for line in one_host.content["lines"]}
    errors = harness.call(tenant, "get_logs", {**base, "level": "error"}).content
    assert all(line.get("trace_id") for line in errors["lines"])  # the way to get_traces


def test_logql_that_we_cannot_run_is_a_validation_error(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    base = {"product": "checkout", "time_range": "last 3h"}
    for query, hint in (('{product="x"}', "not supported"), ('{host="a"} | json', "json"),
                        ('|= "unterminated', "unterminated"), ('|~ "(?=a)b"', "lookarounds"), ('|~ "(["', "invalid regex"),
                        ('{host~"a"}', "expected")):
        result = harness.call(tenant, "get_logs", {**base, "query": query})
        assert result.is_error and result.error_code == "validation", query
        assert hint in result.content["message"] and result.content["code"] == "INVALID_PARAMETER"


# Each of these takes Python's backtracking engine seconds to hours on one 28-character line;
# inside a SQLite step that held the GIL and froze the process (the timeout could not fire).
BACKTRACKERS = {"((a+))+$": 1, "(a{1,})+$": 1, "(a|a)*$": 7, "(\\w|a)*$": 7, ".*.*.*.*.*x": 1, "(a+)+$": 1}


def write_backtrack_bait(h: Harness, tenant: str) -> None:
    now = utcnow()
    bait = "a" * 27 + "!"
    rows = [{"product": "p", "ts": now - timedelta(minutes=i + 1), "level": "info", "severity": 20, "host": bait,
             "message": bait, "trace_id": None, "attrs": None} for i in range(5)]
    rows.append({**rows[0], "ts": now - timedelta(minutes=7), "host": "a" * 27, "message": "a" * 27})
    rows.append({**rows[0], "ts": now - timedelta(minutes=8), "host": "xylophone", "message": "xylophone"})
    _write(h, tenant, "logs", rows)


@pytest.mark.timeout(60)
def test_regexes_that_backtrack_run_in_linear_time(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    write_backtrack_bait(harness, tenant)
    for pattern, expected in BACKTRACKERS.items():
        lines = harness.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h",
                                                  "query": f"|~ `{pattern}`"})
        assert not lines.is_error and lines.content["total_matches"] == expected, (pattern, lines.content)
        negated = harness.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h",
                                                    "query": f"!~ `{pattern}`"}).content
        assert negated["total_matches"] == 7 - expected, pattern
    hosts = harness.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h",
                                              "query": '{host=~`(a|a)*`}'}).content  # anchored: whole value
    assert [line["host"] for line in hosts["lines"]] == ["a" * 27]
    folded = harness.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h",
                                               "query": '{host=~`(?i)XYLO.*`}'}).content
    assert [line["host"] for line in folded["lines"]] == ["xylophone"]


def test_log_pages_do_not_lose_lines_within_one_millisecond(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    at = utcnow().replace(microsecond=500_000) - timedelta(minutes=5)
    _write(harness, tenant, "logs", [
        {"product": "p", "ts": at + timedelta(microseconds=i * 7 % 30), "level": "info", "severity": 20, "host": "h",
         "message": f"line {i}", "trace_id": None, "attrs": None} for i in range(30)])
    lines, pages = harness.page_through(tenant, "get_logs", {"product": "p", "time_range": "last 1h", "limit": 7},
                                        "lines")
    assert sorted(line["message"] for line in lines) == sorted(f"line {i}" for i in range(30)) and pages == 5


# ---- get_traces ---------------------------------------------------------------------------


def test_get_traces_returns_the_span_tree_errors_and_logs(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    line = harness.call(tenant, "get_logs", {"product": "checkout", "time_range": "last 1h", "level": "error",
                                             "limit": 1}).content["lines"][0]
    trace = harness.call(tenant, "get_traces", {"request_id": line["trace_id"], "include_logs": True}).content
    root = trace["root"]
    assert trace["trace_id"] == line["trace_id"] and trace["span_count"] == 3
    assert (root["service"], root["operation"], root["status"]) == ("checkout", "POST /api/checkout", "error")
    children = {c["operation"]: c for c in root["children"]}
    acquire = children["orders-db: acquire connection"]
    assert acquire["duration_us"] == 5_000_000 and "pool max_size=10" in acquire["error"]
    assert 0 < acquire["start_us"] < root["duration_us"]
    assert {e["operation"] for e in trace["errors"]} == {"POST /api/checkout", "orders-db: acquire connection"}
    assert [entry["message"] for entry in trace["logs"]] == [line["message"]]
    with harness.k.db.connect() as conn:
        correlation = conn.scalar(select(telemetry_spans.c.request_id).where(
            telemetry_spans.c.trace_id == line["trace_id"], telemetry_spans.c.request_id.is_not(None)))
    by_correlation = harness.call(tenant, "get_traces", {"request_id": correlation}).content
    assert by_correlation["trace_id"] == line["trace_id"] and by_correlation["logs"] == []
    missing = harness.call(tenant, "get_traces", {"request_id": "0000000000000000"})
    assert missing.error_code == "not_found" and missing.content["code"] == "NOT_FOUND"
    stranger = harness.tenant("stranger")
    assert harness.call(stranger, "get_traces", {"request_id": line["trace_id"]}).error_code == "not_found"


def test_big_traces_page_100_spans_at_a_time_as_fragments_of_the_tree(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    start = utcnow() - timedelta(minutes=10)
    spans = [{"trace_id": "bigtrace01", "span_id": "s000", "parent_span_id": None, "request_id": None,
              "service": "api", "operation": "GET /", "start_ts": start, "duration_us": 10_000_000, "status": "ok",
              "error_message": None, "tags": {}}]
    for i in range(1, 250):  # a fan-out of 10 workers, each with its own chain of calls
        parent = "s000" if i <= 10 else f"s{i - 10:03d}"
        spans.append({**spans[0], "span_id": f"s{i:03d}", "parent_span_id": parent, "operation": f"op {i}",
                      "start_ts": start + timedelta(milliseconds=i), "duration_us": 1000})
    _write(harness, tenant, "spans", spans)
    _write(harness, tenant, "spans", spans[:5])  # a re-sent batch changes nothing
    seen: list[str] = []
    cursor, pages = None, 0

    def walk(node: dict) -> None:
        seen.append(node["span_id"])
        for child in node["children"]:
            walk(child)

    while True:
        content = harness.call(tenant, "get_traces", {"request_id": "bigtrace01",
                                                      **({"cursor": cursor} if cursor else {})}).content
        pages += 1
        assert content["span_count"] == 250
        before = set(seen)
        if pages == 1:
            walk(content["root"])
        else:
            assert content["root"] is None
        for fragment in content["fragments"]:
            assert fragment["parent_span_id"] in before  # attached to a span of an earlier page
            walk(fragment)
        cursor = content.get("next_cursor")
        if not cursor:
            break
    assert pages == 3 and len(seen) == len(set(seen)) == 250
    forged = harness.call(tenant, "get_traces", {"request_id": "bigtrace01", "cursor": cursor or "x.y"})
    assert forged.error_code == "validation"


# ---- compare_to_baseline ------------------------------------------------------------------


def test_compare_to_baseline_flags_the_regression_and_not_the_healthy_service(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    now = utcnow()
    bad = harness.call(tenant, "compare_to_baseline", {"product": "checkout", "metric_name": P99,
                                                       "time_range": "last 3h"}, now=now).content
    assert bad["baseline_window"] == "PT24H" and bad["baseline_samples"] > 300
    assert 0.2 < bad["baseline_mean"] < 0.22 and 0.01 < bad["baseline_stddev"] < 0.03
    assert 35 <= bad["anomaly_count"] <= 42 and bad["max_z_score"] > 50
    first = bad["first_anomaly_at"]
    onset = (now - timedelta(minutes=40)).isoformat()
    assert abs((utcnow().fromisoformat(first.replace("Z", "+00:00")) - utcnow().fromisoformat(onset))
               .total_seconds()) < 180
    early = [s for s in bad["samples"] if s["ts"] < first]
    assert early and all(not s["anomalous"] and abs(s["z_score"]) < 5 for s in early)
    healthy = harness.call(tenant, "compare_to_baseline", {"product": "payments", "metric_name": P99,
                                                           "time_range": "last 3h"}).content
    assert healthy["anomaly_count"] <= 2 and abs(healthy["max_z_score"]) < 5


def test_compare_to_baseline_without_history_or_data_says_so(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    now = utcnow()
    _write(harness, tenant, "metrics", [
        {"product": "new", "metric": "m", "ts": now - timedelta(minutes=m), "value": 1.0, "unit": None, "labels": {}}
        for m in range(1, 30)])
    fresh = harness.call(tenant, "compare_to_baseline", {"product": "new", "metric_name": "m",
                                                         "time_range": "last 1h"}).content
    assert fresh["baseline_mean"] is None and "nothing to compare" in fresh["note"]
    assert len(fresh["samples"]) == 29 and all(s["z_score"] is None for s in fresh["samples"])
    missing = harness.call(tenant, "compare_to_baseline", {"product": "new", "metric_name": "nope",
                                                           "time_range": "last 1h"}).content
    assert missing["samples"] == [] and missing["available_metrics"] == ["m"]
    bad = harness.call(tenant, "compare_to_baseline", {"product": "new", "metric_name": "m", "time_range": "soon"})
    assert bad.error_code == "validation"


def test_a_flat_baseline_gives_finite_z_scores(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    now = utcnow()
    rows = [{"product": "flat", "metric": "m", "ts": now - timedelta(minutes=m), "value": 1.0 if m > 60 else 1.5,
             "unit": None, "labels": {}} for m in range(1, 600)]
    _write(harness, tenant, "metrics", rows)
    result = harness.call(tenant, "compare_to_baseline", {"product": "flat", "metric_name": "m",
                                                          "time_range": "last 1h"}, now=now).content
    assert result["baseline_stddev"] == 0 and result["max_z_score"] == 50.0  # 0.5 over a floor of 1% of 1.0


def test_get_metrics_never_returns_more_than_500_points(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    day = harness.call(tenant, "get_metrics", {"product": "checkout", "metric_name": P99, "time_range": "P1D"})
    assert 0 < len(day.content["samples"]) <= 500 and day.content["step_s"] == 86400 / 500


# ---- get_incident_history -----------------------------------------------------------------


def test_incident_history_ranks_matches_and_filters(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    found = harness.call(tenant, "get_incident_history", {"query": "connection pool exhausted"}).content
    first = found["incidents"][0]
    assert first["id"] == "INC-0981" and first["status"] == "closed" and "max_size=50" in first["resolution_summary"]
    scores = [i["match_score"] for i in found["incidents"]]
    assert scores == sorted(scores, reverse=True)
    other = harness.call(tenant, "get_incident_history", {"query": "connection pool exhausted",
                                                          "product": "payments"}).content
    assert "INC-0981" not in [i["id"] for i in other["incidents"]]
    recent = harness.call(tenant, "get_incident_history", {"query": "connection pool", "time_range": "last 30d"})
    assert "INC-0981" not in [i["id"] for i in recent.content["incidents"]]  # opened 41 days ago
    assert harness.call(tenant, "get_incident_history", {"query": "kubernetes etcd"}).content["incidents"] == []
    stop_words = harness.call(tenant, "get_incident_history", {"query": "why is the"})
    assert stop_words.error_code == "validation"
    assert harness.call(tenant, "get_incident_history", {"query": "pool", "limit": 26}).error_code == "validation"
    stranger = harness.tenant("stranger")
    assert harness.call(stranger, "get_incident_history", {"query": "pool"}).content["incidents"] == []


def test_incident_history_pages_without_gaps_or_repeats(harness: Harness, harness_factory) -> None:
    tenant = harness.tenant("acme")
    now = utcnow()
    rows = [{"ref": f"INC-{i:04d}", "product": "disk", "title": f"disk full on node {i}" if i % 3 else "disk alarm",
             "severity": "warn", "opened_at": now - timedelta(days=i % 5, hours=i), "closed_at": None,
             "findings": "no space left" + (" disk full again" if i % 2 else ""), "resolution": "",
             "target_type": None, "target_id": None} for i in range(31)]
    _write(harness, tenant, "incidents", rows)
    items, pages = harness.page_through(tenant, "get_incident_history", {"query": "disk full", "limit": 7},
                                        "incidents")
    ids = [i["id"] for i in items]
    assert len(ids) == len(set(ids)) == 31 and pages == 5
    keys = [(-i["match_score"], i["opened_at"]) for i in items]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)  # best matches first across pages
    small = harness_factory(tools={"result_cap_bytes": 2048})
    capped, capped_pages = small.page_through(tenant, "get_incident_history", {"query": "disk full", "limit": 25},
                                              "incidents")
    assert [i["id"] for i in capped] == ids and capped_pages > 2  # the cap shrinks pages, never skips
    rows[0]["title"] = "disk full, resolved"
    _write(harness, tenant, "incidents", rows[:1])  # re-sending an incident updates it
    again = harness.call(tenant, "get_incident_history", {"query": "resolved"}).content["incidents"]
    assert [i["id"] for i in again] == ["INC-0000"]


# ---- get_admin_info -----------------------------------------------------------------------


def test_get_admin_info_reports_the_envelope_and_scrubs_secrets(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant)
    info = harness.call(tenant, "get_admin_info", {"product": "checkout"}).content
    assert info["version"] == "v2.14.0" and info["health"] == "degraded"
    assert info["config"]["orders_db.pool.max_size"] == 10 and info["build"]["commit"] == "9f3c2ab"
    assert 40 * 60 <= info["uptime_s"] <= 43 * 60
    _write(harness, tenant, "products", [{"product": "vault", "updated_at": utcnow(), "info": {
        "version": "1.0", "uptime_s": 5, "config": {"password": "hunter2", "dsn": "postgres://app:s3cret@db/x"}}}])
    vault = harness.call(tenant, "get_admin_info", {"product": "vault"}).content
    assert "hunter2" not in str(vault) and "s3cret" not in str(vault) and vault["uptime_s"] == 5
    missing = harness.call(tenant, "get_admin_info", {"product": "nope"})
    assert missing.error_code == "not_found" and missing.content["code"] == "NOT_FOUND"
    assert harness.call(harness.tenant("other"), "get_admin_info", {"product": "checkout"}).error_code == "not_found"


# ---- times that overflow ------------------------------------------------------------------


def test_times_past_the_calendar_are_validation_errors_in_every_tool(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    calls = [("get_logs", {"product": "checkout", "time_range": "last 99999999999 days"}),
             ("get_logs", {"product": "checkout", "time_range": "99999999999 days ago"}),
             ("get_metrics", {"product": "checkout", "metric_name": P99, "time_range": "now-99999999999d"}),
             ("get_metrics", {"product": "checkout", "metric_name": P99, "time_range": "9999-12-31T23:00:00Z/PT2H"}),
             ("get_metrics", {"product": "checkout", "metric_name": P99, "time_range": "last 1h",
                              "step": "99999999999999d"}),
             ("get_recent_deploys", {"product": "checkout", "time_range": "PT1H/0001-01-01T00:30:00Z"}),
             ("compare_to_baseline", {"product": "checkout", "metric_name": P99,
                                      "time_range": "0001-01-01T10:00:00Z/PT1H"}),
             ("get_latency_trends", {"since": "99999999999 days ago"}),
             ("get_request_volume", {"since": "0001-01-01T00:00:00Z", "until": "0001-01-02T00:00:00Z"})]
    for name, args in calls:
        result = harness.call(tenant, name, args)
        assert result.is_error and result.error_code == "validation", (name, args, result.content)
        assert any(w in result.content["message"] for w in ("range", "longer than", "since")), result.content
