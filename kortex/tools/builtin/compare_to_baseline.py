"""compare_to_baseline: a metric over a time range against its 24-hour baseline (rfc-005 §6.2.4).

The baseline is the 24 hours just before the range (it rolls with the range): its mean and
standard deviation give every sample in the range a z-score; |z| >= 3 is an anomaly. A flat
baseline (stddev 0) would make every deviation infinite, so z uses a floor of 1% of the mean.
``baseline_samples`` says how much the baseline holds: a z-score against one or two samples is no
evidence. ``change_point`` is where the range itself stepped, if it did (kortex/telemetry/changepoint.py)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from kortex.telemetry import changepoint
from kortex.telemetry.sources import MetricQuery, downsample
from kortex.timeparse import isoformat
from kortex.tools.builtin.common import Labels, MetricName, Product, TimeRange, stats, window
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec

BASELINE = timedelta(hours=24)
THRESHOLD = 3.0
MAX_POINTS = 500


class CompareToBaselineInput(ToolInput):
    product: Product
    metric_name: MetricName
    time_range: TimeRange
    labels: Labels


def _z(value: float, mean: float, scale: float) -> float:
    return round((value - mean) / scale, 2)


def run(args: CompareToBaselineInput, ctx: ToolContext) -> dict[str, Any]:
    start, end = window(args.time_range, ctx)
    metrics = ctx.sources.metrics
    labels = args.labels or {}
    base = metrics.query_metric(ctx.tenant_id, MetricQuery(product=args.product, metric=args.metric_name,
                                                           start=start - BASELINE, end=start, labels=labels))
    current = metrics.query_metric(ctx.tenant_id, MetricQuery(product=args.product, metric=args.metric_name,
                                                              start=start, end=end, labels=labels))
    values = [s.value for s in base.samples]
    result: dict[str, Any] = {
        "baseline_window": "PT24H",
        "baseline_start": isoformat(start - BASELINE),
        "baseline_samples": len(values),
        "unit": current.unit or base.unit,
        "threshold": THRESHOLD,
        "series": max(base.series, current.series),
        "truncated": base.truncated or current.truncated,
        "stats": stats([s.value for s in current.samples]),
        "change_point": changepoint.of_samples(current.samples),
    }
    if base.truncated or current.truncated:
        result["note"] = "only the most recent part of a window fits; narrow the time range"
    if not values:
        result.update(baseline_mean=None, baseline_stddev=None, anomaly_count=0, max_z_score=None,
                      samples=[{"ts": isoformat(s.ts), "value": round(s.value, 6), "z_score": None, "anomalous": False}
                               for s in current.samples[:MAX_POINTS]],
                      note="no data in the 24 hours before the range; nothing to compare against")
    else:
        mean = sum(values) / len(values)
        stddev = math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))
        scale = max(stddev, abs(mean) * 0.01, 1e-9)
        zs = [_z(s.value, mean, scale) for s in current.samples]
        anomalies = [(s, z) for s, z in zip(current.samples, zs, strict=True) if abs(z) >= THRESHOLD]
        shown = current.samples
        if len(shown) > MAX_POINTS:  # the flags of averaged points come from the averages
            shown = downsample(shown, (end - start).total_seconds() / MAX_POINTS, origin=start)
        result.update(
            baseline_mean=round(mean, 6), baseline_stddev=round(stddev, 6),
            samples=[{"ts": isoformat(s.ts), "value": round(s.value, 6), "z_score": _z(s.value, mean, scale),
                      "anomalous": abs(_z(s.value, mean, scale)) >= THRESHOLD} for s in shown],
            sample_count=len(current.samples),
            anomaly_count=len(anomalies),
            max_z_score=max(zs, key=abs) if zs else None,
            first_anomaly_at=isoformat(anomalies[0][0].ts) if anomalies else None,
        )
    if not current.samples:
        result["available_metrics"] = metrics.list_metrics(ctx.tenant_id, args.product)[:50]
    return result


SPEC = ToolSpec(
    name="compare_to_baseline",
    description=(
        "Compare a metric of a product over a time range with its rolling 24-hour baseline (the 24 hours "
        "before the range). Returns the baseline mean and stddev, every sample with its z-score and an "
        "anomaly flag (|z| >= 3), the anomaly count and the largest z-score; the range's min/max/mean/p50/p95/p99; "
        "baseline_samples (a baseline of a "
        "few samples proves nothing); and change_point: where the range stepped (onset, mean and sample count "
        "before and after), or null."
    ),
    input_model=CompareToBaselineInput,
    run=run,
    category="analysis",
    redact=("baseline_window", "baseline_start", "baseline_samples", "baseline_mean", "baseline_stddev", "unit",
            "threshold", "samples[].ts", "samples[].value", "samples[].z_score", "samples[].anomalous",
            "sample_count", "anomaly_count", "max_z_score", "first_anomaly_at", "note", "available_metrics",
            "series", "truncated", "stats", "change_point"),
    list_field="samples",
    keep="tail",  # oldest first: a cut keeps the newest points, the ones an investigation is about
)
