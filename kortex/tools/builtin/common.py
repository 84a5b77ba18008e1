"""Argument types and helpers shared by the built-in tools."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from kortex.errors import InvalidInput
from kortex.telemetry.sources import DEPLOYMENT_PATTERN, ID_MAX, ID_PATTERN, METRIC_PATTERN, PRODUCT_PATTERN
from kortex.timeparse import EXAMPLES, MAX_SPAN, ensure_utc, isoformat, parse_instant, parse_range
from kortex.tools.cursor import CursorCodec
from kortex.tools.spec import ToolContext

Product = Annotated[
    str,
    Field(min_length=1, max_length=200, pattern=PRODUCT_PATTERN,
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
    Field(min_length=1, max_length=200, pattern=METRIC_PATTERN,
          description="Metric name, e.g. 'http_request_duration_seconds_p99'"),
]


Since = Annotated[
    str,
    Field(min_length=1, max_length=200,
          description="Start time: ISO 8601 instant or interval, or relative: '1 hour ago', 'last 30m', "
                      "'yesterday', 'PT30M'"),
]
Until = Annotated[
    str,
    Field(min_length=1, max_length=200, description="End time: ISO 8601 instant or relative ('now', '10 minutes ago')"),
]
# The same patterns ingest validates with (telemetry/sources.py): any stored id can be asked about.
Identifier = Annotated[
    str,
    Field(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN),
]
DeploymentId = Annotated[
    str,
    Field(min_length=3, max_length=200, pattern=DEPLOYMENT_PATTERN,
          description="Deployment id, '<model>/<backend>', e.g. 'gpt-4/aws'"),
]


def _label_values_as_text(value: Any) -> Any:
    """Models often send ``{"code": 500}``: label values are text, so plain numbers and booleans
    are taken as their text; anything else is left for validation to reject."""
    if isinstance(value, dict):
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, int | float) else v
                for k, v in value.items()}
    return value


Labels = Annotated[
    dict[str, Annotated[str, Field(max_length=500)]] | None,
    BeforeValidator(_label_values_as_text),
    Field(None, max_length=20, description="Label filters, e.g. {\"route\": \"/pay\", \"code\": \"500\"}"),
]
Cursor = Annotated[
    str | None,
    Field(None, max_length=4000, description="Opaque cursor returned by a prior call. Omit on the first page."),
]


def window(time_range: str, ctx: ToolContext) -> tuple[datetime, datetime]:
    return parse_range(time_range, now=ctx.now)


def _point(name: str, text: str, ctx: ToolContext) -> tuple[datetime, datetime | None]:
    """An instant, or the start (and implied end) of an interval such as 'last 30m'."""
    try:
        return parse_instant(text, now=ctx.now), None
    except InvalidInput:
        pass
    try:
        return parse_range(text, now=ctx.now)
    except InvalidInput as exc:
        raise InvalidInput(f"{name}: {exc.message}") from None


def since_until(since: str | None, until: str | None, ctx: ToolContext, default_since: str) -> tuple[datetime, datetime]:
    """The ``[since, until)`` window of an LLM-ops tool. ``until`` defaults to now, as
    llm-ops-agent-tools.md says ('yesterday' alone is yesterday 00:00 until now); an interval
    given as ``since`` ('2026-11-20/2026-11-21', 'last 30m') brings its own end."""
    start, implied_end = _point("since", since or default_since, ctx)
    if until is not None:
        end, _ = _point("until", until, ctx)
    else:
        end = implied_end or ctx.now
    if end <= start:
        raise InvalidInput(f"the window ends ({isoformat(end)}) before it starts ({isoformat(start)}); "
                           f"use e.g. {EXAMPLES}")
    if end - start > MAX_SPAN:
        raise InvalidInput(f"the window is longer than {MAX_SPAN.days} days")
    return start, end


def decode_time(value: Any) -> datetime:
    """A datetime that went through a cursor as ISO text."""
    try:
        return ensure_utc(datetime.fromisoformat(str(value).replace("Z", "+00:00")))
    except ValueError:
        raise InvalidInput("cursor is not valid; omit it to start from the first page") from None


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
