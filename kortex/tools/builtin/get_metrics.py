"""get_metrics: a metric series of a product with summary statistics (rfc-005 §6.2.2)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kortex.telemetry import changepoint
from kortex.telemetry.sources import MetricQuery, downsample
from kortex.timeparse import isoformat, parse_duration
from kortex.tools.builtin.common import Labels, MetricName, Product, TimeRange, stats, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

MAX_POINTS = 500


class GetMetricsInput(ToolInput):
    product: Product
    metric_name: MetricName
    time_range: TimeRange
    labels: Labels
    step: str | None = Field(None, max_length=20, description="Resolution, e.g. '1m', '5m', '1h'")


def run(args: GetMetricsInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = window(args.time_range, ctx)
    span = (end - start).total_seconds()
    step_s = parse_duration(args.step).total_seconds() if args.step else None
    finest = span / MAX_POINTS
    if step_s is not None:
        step_s = max(step_s, finest)
    series = ctx.sources.metrics.query_metric(
        ctx.tenant_id,
        MetricQuery(product=args.product, metric=args.metric_name, start=start, end=end,
                    labels=args.labels or {}, step_s=step_s),
    )
    samples = series.samples
    if len(samples) > MAX_POINTS:  # never more than MAX_POINTS points, whatever the source holds
        step_s = finest
        samples = downsample(samples, step_s, origin=start)
    result: dict[str, Any] = {
        "samples": [{"ts": isoformat(s.ts), "value": round(s.value, 6)} for s in samples],
        "stats": stats([s.value for s in series.samples]),
        "change_point": changepoint.of_samples(series.samples),
        "unit": series.unit,
        "step_s": step_s,
        "series": series.series,
        "truncated": series.truncated,
    }
    if series.series > 1:
        result["note"] = (f"{series.series} series matched; every point is their average. Filter with labels "
                          "to see one of them.")
    if series.truncated:
        result["note"] = (result.get("note", "") + " Only the most recent part of the window fits; narrow "
                          "the time range or set a coarser step.").strip()
    if not samples:
        result["available_metrics"] = (ctx.sources.metrics.list_metrics(ctx.tenant_id, args.product))[:50]
    return result


SPEC = ToolSpec(
    name="get_metrics",
    description=(
        "Query a named metric of a product within a time range. Returns the time series (at most 500 "
        "points), min/max/mean/p50/p95/p99 and change_point: where the series stepped (onset, mean and sample "
        "count before and after), or null. Several matching series (label sets) are averaged into one; "
        "labels narrow them. When the metric has no data, lists the metrics that exist."
    ),
    input_model=GetMetricsInput,
    run=run,
    category="query",
    redact=("samples[].ts", "samples[].value", "stats", "change_point", "unit", "step_s", "series", "note", "truncated",
            "available_metrics"),
    list_field="samples",
    keep="tail",  # oldest first: a cut keeps the newest points, the ones an investigation is about
)
