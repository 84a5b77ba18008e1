"""list_products names what the tenant's telemetry knows of, newest first (past any per-table cut),
one product by name however many are newer, and nothing of another tenant's."""

from __future__ import annotations

from datetime import datetime, timedelta

from kortex.telemetry import ingest
from kortex.timeparse import utcnow
from tests.conftest import Harness


def test_the_products_a_scenario_seeds_are_listed_for_its_tenant_only(harness: Harness) -> None:
    acme, other = harness.tenant("acme"), harness.tenant("other")
    harness.seed(acme, "noisy-neighbour")
    result = harness.call(acme, "list_products", {})
    assert not result.is_error
    products = {p["product"]: p for p in result.content["products"]}
    assert products and all(p["seen_in"] and p["last_seen"] for p in products.values())
    assert harness.call(other, "list_products", {}).content["products"] == []
    newest = [p["last_seen"] for p in result.content["products"]]
    assert newest == sorted(newest, reverse=True)


def test_a_window_before_any_telemetry_lists_only_what_is_reported_whole(harness: Harness) -> None:
    acme = harness.tenant("acme")
    harness.seed(acme, "checkout-deploy-regression")
    recent = {p["product"] for p in harness.call(acme, "list_products", {}).content["products"]}
    assert "checkout" in recent
    old = harness.call(acme, "list_products", {"time_range": "2020-01-01T00:00:00Z/2020-01-02T00:00:00Z"})
    assert all(set(p["seen_in"]) <= {"admin", "incidents"} for p in old.content["products"])


def _logs_of(h: Harness, tenant: str, products: list[tuple[str, datetime]]) -> None:
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "logs", [{"product": name, "ts": ts, "severity": 20, "level": "info", "host": "h",
                                             "message": "x"} for name, ts in products])


def check_one_product_is_found_however_many_are_newer(h: Harness) -> None:
    tenant = h.tenant("many")
    now = utcnow()
    _logs_of(h, tenant, [(f"svc-{i:03d}", now - timedelta(minutes=i + 1)) for i in range(250)])
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "metrics", [{"product": "svc-249", "metric": "cpu", "ts": now - timedelta(hours=5),
                                                "value": 1.0, "unit": None, "labels": {}}])
    oldest = h.call(tenant, "list_products", {"product": "svc-249"}).content
    assert [(p["product"], p["seen_in"]) for p in oldest["products"]] == [("svc-249", ["metrics", "logs"])]
    assert oldest["metrics"] == ["cpu"] and "truncated" not in oldest
    assert h.call(tenant, "list_products", {"product": "svc-999"}).content["products"] == []


def check_the_newest_are_listed_first_past_the_per_table_cut(h: Harness) -> None:
    tenant = h.tenant("newest")
    now = utcnow()
    # 900 products, newer the later their name: past 4 x 201 rows a table's cut must keep the newest.
    _logs_of(h, tenant, [(f"svc-{i:03d}", now - timedelta(seconds=(900 - i) * 10)) for i in range(900)])
    listed = h.call(tenant, "list_products", {}).content
    assert listed["truncated"] is True
    assert [p["product"] for p in listed["products"]] == [f"svc-{i:03d}" for i in range(899, 699, -1)]


def test_one_product_is_found_however_many_are_newer(harness: Harness) -> None:
    check_one_product_is_found_however_many_are_newer(harness)


def test_the_newest_are_listed_first_past_the_per_table_cut(harness: Harness) -> None:
    check_the_newest_are_listed_first_past_the_per_table_cut(harness)
