"""get_quality_summary: quality scores per model and task type (llm-ops-agent-tools.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Identifier, Since, Until, since_until
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec


class GetQualitySummaryInput(ToolInput):
    model_id: Identifier | None = Field(None, description="Filter by model")
    task_type: Identifier | None = Field(None, description="Filter by task type, e.g. 'summarization'")
    since: Since | None = Field(None, description="Start time, default '7 days ago'")
    until: Until | None = Field(None, description="End time, default now")


#: (model, task type) rows one call returns; more say ``truncated`` (filter by model or task type)
MAX_ROWS = 500


def run(args: GetQualitySummaryInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = since_until(args.since, args.until, ctx, "7 days ago")
    rows = ctx.sources.llmops.quality_summary(ctx.tenant_id, args.model_id, args.task_type, start, end,
                                              limit=MAX_ROWS + 1)
    result: dict[str, Any] = {
        "data": [{"model_id": r.model_id, "task_type": r.task_type, "avg_score": r.avg_score,
                  "min_score": r.min_score, "max_score": r.max_score, "sample_count": r.sample_count}
                 for r in rows[:MAX_ROWS]],
        "since": isoformat(start), "until": isoformat(end)}
    if len(rows) > MAX_ROWS:
        result["truncated"] = True
    return result


SPEC = ToolSpec(
    name="get_quality_summary",
    description="Quality scores of LLM answers aggregated by model and task type (average, min, max, sample "
                "count). since defaults to '7 days ago'.",
    input_model=GetQualitySummaryInput,
    run=run,
    category="analysis",
    redact=("data", "since", "until", "truncated"),
    list_field="data",
)
