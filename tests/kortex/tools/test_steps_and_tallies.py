"""The aggregates a model quotes come from the tools: the step a metric took (onset, both levels,
how many samples each holds), the metrics a product reports, and a page of LLM requests by status
and by user with their shares."""

from __future__ import annotations

from datetime import timedelta

from kortex.telemetry import changepoint, ingest
from kortex.timeparse import utcnow
from tests.conftest import Harness


def _step_series(h: Harness, tenant: str, *, metric: str = "queue_depth", after: float = 40.0) -> None:
    now = utcnow()
    rows = [{"product": "api", "metric": metric, "ts": now - timedelta(minutes=m), "unit": None,
             "value": after if m <= 30 else 10.0 + (m % 3) * 0.1, "labels": {}} for m in range(1, 181)]
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", rows)


def test_both_metric_tools_return_the_step_and_its_sample_counts(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _step_series(harness, tenant)
    args = {"product": "api", "metric_name": "queue_depth", "time_range": "last 3h"}
    for tool in ("compare_to_baseline", "get_metrics"):
        step = harness.call(tenant, tool, args).content["change_point"]
        assert step["before_samples"] > 100 and step["after_samples"] == 30
        assert step["after_mean"] == 40.0 and 10.0 <= step["before_mean"] <= 10.2 and step["direction"] == "up"
    baseline = harness.call(tenant, "compare_to_baseline", args).content
    assert baseline["baseline_samples"] <= 1 and baseline["stats"]["max"] == 40.0


def test_a_steady_series_has_no_step() -> None:
    now = utcnow()
    flat = [(now - timedelta(minutes=m), 10.0 + (m % 5) * 0.5) for m in range(120, 0, -1)]
    assert changepoint.find(flat) is None
    assert changepoint.find(flat[:5]) is None  # too few points to say anything


def test_list_products_names_the_metrics_of_one_product(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    _step_series(harness, tenant)
    _step_series(harness, tenant, metric="http_requests_rate", after=900.0)
    one = harness.call(tenant, "list_products", {"product": "api"}).content
    assert [p["product"] for p in one["products"]] == ["api"]
    assert one["metrics"] == ["http_requests_rate", "queue_depth"]
    assert "metrics" not in harness.call(tenant, "list_products", {}).content


def test_recent_requests_come_with_their_tallies(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "noisy-neighbour")
    page = harness.call(tenant, "get_recent_requests", {"deployment_id": "llama-70b/k8s", "since": "1 hour ago",
                                                         "limit": 100}).content
    rows = page["requests"]
    assert sum(page["by_status"].values()) == len(rows)
    failed = sum(1 for r in rows if r["status"] != "success")
    assert page["failed_pct"] == round(100 * failed / len(rows), 1)
    top = page["by_user"][0]
    assert top["user_id"] == "globex-batch"
    assert top["count"] == sum(1 for r in rows if r["user_id"] == "globex-batch")
    assert top["share_pct"] == round(100 * top["count"] / len(rows), 1)


def test_get_logs_groups_every_matching_line_into_templates(harness: Harness) -> None:
    tenant = harness.tenant("acme")
    harness.seed(tenant, "checkout-deploy-regression")
    args = {"product": "checkout", "time_range": "last 3h", "level": "warn"}
    now = utcnow()  # one clock for both calls: a line at a window edge must not slip in between them
    plain = harness.call(tenant, "get_logs", args, now=now).content
    assert "templates" not in plain
    grouped = harness.call(tenant, "get_logs", {**args, "group": True, "split_at": "30 minutes ago"},
                           now=now).content
    assert grouped["grouped_all"] and grouped["grouped_lines"] == plain["total_matches"] > len(plain["lines"])
    assert sum(t["count"] for t in grouped["templates"]) == grouped["grouped_lines"]
    assert grouped["before_split"] + grouped["after_split"] == grouped["grouped_lines"]
    assert all(t["before"] + t["after"] == t["count"] for t in grouped["templates"])
    counts = [t["count"] for t in grouped["templates"]]
    assert counts == sorted(counts, reverse=True)
    bad = harness.call(tenant, "get_logs", {**args, "group": True, "split_at": "whenever"})
    assert bad.is_error
