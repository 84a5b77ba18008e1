"""list_products names what the tenant's telemetry knows of, newest first, and nothing of
another tenant's."""

from __future__ import annotations

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
