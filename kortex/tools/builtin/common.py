"""Argument types and helpers shared by the built-in tools."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated

from pydantic import Field

from kortex.timeparse import parse_range
from kortex.tools.cursor import CursorCodec
from kortex.tools.spec import ToolContext

Product = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
          description="Product (service) name as registered, e.g. 'checkout'"),
]
TimeRange = Annotated[
    str,
    Field(min_length=1, max_length=200,
          description="ISO 8601 interval, e.g. '2026-04-07T14:00:00Z/PT30M', or relative: 'last 30m', "
                      "'last 6h', 'yesterday', 'PT1H'"),
]
MetricName = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:.]*$",
          description="Metric name, e.g. 'http_request_duration_seconds_p99'"),
]


def window(time_range: str, ctx: ToolContext) -> tuple[datetime, datetime]:
    return parse_range(time_range, now=ctx.now)


def cursors(ctx: ToolContext) -> CursorCodec:
    codec = ctx.services.get("cursors")
    if codec is None:
        raise RuntimeError("no cursor codec in the tool context")
    return codec  # type: ignore[no-any-return]


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return sorted_values[lo]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "min": round(ordered[0], 6), "max": round(ordered[-1], 6),
        "mean": round(sum(ordered) / len(ordered), 6),
        "p50": round(percentile(ordered, 0.50), 6), "p95": round(percentile(ordered, 0.95), 6),
        "p99": round(percentile(ordered, 0.99), 6),
    }
