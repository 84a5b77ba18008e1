"""get_admin_info: the /admin/info envelope a product last reported (rfc-005 §6.2.7)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kortex.errors import NotFound
from kortex.timeparse import ensure_utc, isoformat
from kortex.tools.builtin.common import Product
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetAdminInfoInput(ToolInput):
    product: Product


def _uptime(info: dict[str, Any], ctx: ToolContext) -> int | None:
    if isinstance(info.get("uptime_s"), int | float):
        return int(info["uptime_s"])
    started = info.get("started_at")
    if not isinstance(started, str):
        return None
    try:
        return max(0, int((ctx.now - ensure_utc(datetime.fromisoformat(started.replace("Z", "+00:00"))))
                          .total_seconds()))
    except ValueError:
        return None


def run(args: GetAdminInfoInput, ctx: ToolContext) -> dict[str, Any]:
    info = ctx.sources.admin.get_admin_info(ctx.tenant_id, args.product)
    if info is None:
        raise NotFound(f"product {args.product!r} has not reported its /admin/info")
    reported = info.get("reported_at")
    return {
        "product": info.get("product", args.product),
        "version": info.get("version"),
        "uptime_s": _uptime(info, ctx),
        "health": info.get("health"),
        "build": info.get("build"),
        "config_hash": info.get("config_hash"),
        "config": info.get("config"),
        "feature_flags": info.get("feature_flags"),
        "reported_at": isoformat(reported) if isinstance(reported, datetime) else reported,
    }


SPEC = ToolSpec(
    name="get_admin_info",
    description=(
        "Fetch the /admin/info envelope of a product: version, uptime, health, build, configuration summary "
        "and feature flags, as the product last reported them."
    ),
    input_model=GetAdminInfoInput,
    run=run,
    category="lookup",
    # config and flags are summaries the product chose to publish; secret-shaped values are still scrubbed
    redact=("product", "version", "uptime_s", "health", "build", "config_hash", "config", "feature_flags",
            "reported_at", "truncated"),
)
