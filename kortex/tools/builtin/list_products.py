"""list_products: what exists — the products the tenant's telemetry names, so a model can
resolve the subject of a question ("the app", "storefront", "ledger") against real names
instead of guessing one from the question's words; asked about one product, the metrics it reports,
so a model can survey every one of them instead of guessing a metric's name."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from kortex.errors import UpstreamError
from kortex.telemetry.sources import ProductSeen
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Product, TimeRange, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

MAX_PRODUCTS = 200
MAX_METRICS = 100


class ListProductsInput(ToolInput):
    time_range: TimeRange = Field("last 24h", description="Seen in metrics, logs or deploys within this range; "
                                                          "admin info and incidents count whenever reported")
    product: Product | None = Field(None, description="Only this product, with the names of the metrics it reports")


@runtime_checkable
class FindsProduct(Protocol):
    """A product source that can look one product up (the embedded store)."""

    def find_product(self, tenant_id: str, product: str, start: datetime, end: datetime) -> ProductSeen | None: ...


def run(args: ListProductsInput, ctx: ToolContext) -> dict[str, Any]:
    source = ctx.sources.products
    if source is None:
        raise UpstreamError("no telemetry source here can list products")
    start, end = window(args.time_range, ctx)
    if args.product is not None and isinstance(source, FindsProduct):
        # Asked in the source: picked out of the newest MAX_PRODUCTS, an older product was missing.
        one = source.find_product(ctx.tenant_id, args.product, start, end)
        found = [one] if one is not None else []
    else:
        found = source.list_products(ctx.tenant_id, start, end, limit=MAX_PRODUCTS + 1)
        if args.product is not None:
            found = [p for p in found if p.product == args.product]
    result: dict[str, Any] = {"products": [{"product": p.product, "seen_in": list(p.seen_in),
                                            "last_seen": isoformat(p.last_seen)} for p in found[:MAX_PRODUCTS]]}
    if len(found) > MAX_PRODUCTS:
        result["truncated"] = True
    if args.product is not None:
        result["metrics"] = ctx.sources.metrics.list_metrics(ctx.tenant_id, args.product)[:MAX_METRICS]
    return result


SPEC = ToolSpec(
    name="list_products",
    description="List the products (services) this tenant's telemetry names, most recently seen first, with which "
                "kinds of telemetry name them. Use it to find the exact product a question is about; with product, "
                "it also lists the metrics that product reports.",
    input_model=ListProductsInput,
    run=run,
    category="analysis",
    redact=("products[].product", "products[].seen_in", "products[].last_seen", "truncated", "metrics"),
    list_field="products",
)
