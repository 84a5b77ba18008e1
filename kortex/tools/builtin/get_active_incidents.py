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
    found = ctx.sources.incidents.incidents_at(
        ctx.tenant_id, None, target_type=args.target_type, target_ids=(args.target_id,) if args.target_id else (),
        limit=MAX_INCIDENTS + 1)
    cut = len(found) > MAX_INCIDENTS
    found = found[:MAX_INCIDENTS]
    incidents = [
        {"id": i.ref, "target_type": i.target_type or ("product" if i.product else None),
         "target_id": i.target_id or i.product, "title": i.title, "severity": i.severity,
         "started_at": isoformat(i.opened_at),
         "duration_minutes": max(0, int((ctx.now - i.opened_at).total_seconds() // 60)),
         "findings": i.findings}
        for i in found
    ]
    result: dict[str, Any] = {"incidents": incidents, "count": len(incidents)}
    if cut:
        result["truncated"] = True
    return result


SPEC = ToolSpec(
    name="get_active_incidents",
    description="Incidents that are open right now, optionally only those about a deployment, model, backend "
                "or product (target_type) or one target (target_id).",
    input_model=GetActiveIncidentsInput,
    run=run,
    category="lookup",
    redact=("incidents", "count", "truncated"),
    list_field="incidents",
)
