"""get_recent_deploys: deploy events of a product in a time range (rfc-005 §6.2.5)."""

from __future__ import annotations

from typing import Any

from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Product, TimeRange, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetRecentDeploysInput(ToolInput):
    product: Product
    time_range: TimeRange


#: newest deploys one call returns; a busier window says ``truncated`` so the model narrows it
MAX_DEPLOYS = 200


def run(args: GetRecentDeploysInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = window(args.time_range, ctx)
    deploys = ctx.sources.deploys.list_deploys(ctx.tenant_id, args.product, start, end, limit=MAX_DEPLOYS + 1)
    result: dict[str, Any] = {
        "deploys": [
            {"ts": isoformat(d.ts), "version": d.version, "actor": d.actor, "host": d.host,
             "duration_s": d.duration_s, "status": d.status, "commit": d.commit, "rolled_back": d.rolled_back}
            for d in deploys[:MAX_DEPLOYS]
        ]
    }
    if len(deploys) > MAX_DEPLOYS:
        result["truncated"] = True
    return result


SPEC = ToolSpec(
    name="get_recent_deploys",
    description="List deploy events of a product within a time range, newest first. Use it to correlate "
                "a change in behaviour with a release.",
    input_model=GetRecentDeploysInput,
    run=run,
    category="analysis",
    redact=("deploys[].ts", "deploys[].version", "deploys[].actor", "deploys[].host", "deploys[].duration_s",
            "deploys[].status", "deploys[].commit", "deploys[].rolled_back", "truncated"),
    list_field="deploys",
)
