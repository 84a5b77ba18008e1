"""get_active_incidents: incidents open right now (llm-ops-agent-tools.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kortex.telemetry.sources import ID_MAX, ID_PATTERN
from kortex.timeparse import isoformat
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetActiveIncidentsInput(ToolInput):
    target_type: Literal["deployment", "model", "backend", "product"] | None = Field(
        None, description="Only incidents about this kind of target")
    target_id: str | None = Field(None, min_length=1, max_length=ID_MAX, pattern=ID_PATTERN,
                                  description="Only incidents about this target, e.g. 'aws' or 'gpt-4/aws'")


#: open incidents one call lists, most recent first; more say ``truncated`` (narrow by target)
MAX_INCIDENTS = 100


def run(args: GetActiveIncidentsInput, ctx: ToolContext) -> dict[str, Any]:
    target_ids = (args.target_id,) if args.target_id else ()
    found = ctx.sources.incidents.incidents_at(ctx.tenant_id, None, target_type=args.target_type,
                                               target_ids=target_ids, limit=MAX_INCIDENTS + 1)
    cut = len(found) > MAX_INCIDENTS
    incidents = [
        {"id": i.ref, "target_type": i.target_type or ("product" if i.product else None),
         "target_id": i.target_id or i.product, "title": i.title, "severity": i.severity,
         "started_at": isoformat(i.opened_at),
         "duration_minutes": max(0, int((ctx.now - i.opened_at).total_seconds() // 60)),
         "findings": i.findings}
        for i in found[:MAX_INCIDENTS]
    ]
    if not cut:
        return {"incidents": incidents, "count": len(incidents)}
    # count is how many are open, the figure a model quotes: past the cap the source counts them.
    count = ctx.sources.incidents.count_incidents_at(ctx.tenant_id, None, target_type=args.target_type,
                                                     target_ids=target_ids)
    return {"incidents": incidents, "count": count, "truncated": True,
            "note": f"only {len(incidents)} of {count} open incidents are listed, the most recent (count is all "
                    "of them); filter by target_type or target_id"}


SPEC = ToolSpec(
    name="get_active_incidents",
    description="Incidents that are open right now, optionally only those about a deployment, model, backend "
                "or product (target_type) or one target (target_id).",
    input_model=GetActiveIncidentsInput,
    run=run,
    category="lookup",
    redact=("incidents", "count", "truncated", "note"),
    list_field="incidents",
)
