"""Parse the time expressions models and operators write: ISO 8601 instants, durations and
intervals, and relative forms such as "last 30m", "1 hour ago", "yesterday", "PT30M".

All results are timezone-aware UTC datetimes between 1970 and 2200. Bad input raises
``InvalidInput`` with a message a model can act on, never ``OverflowError``: magnitudes are
checked before a timedelta is built, and date arithmetic that leaves the calendar is refused.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from kortex.errors import InvalidInput

_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")
_ISO_DURATION = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?|an?)\s*([a-z]+)\s+ago\s*$")
_NOW_MINUS = re.compile(r"^\s*now\s*-\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")  # Grafana style: now-30m
_LAST = re.compile(r"^\s*(?:last|past|previous)\s+(?:(\d+(?:\.\d+)?)\s*)?([a-z]+)\s*$")

MAX_SPAN = timedelta(days=366)
#: instants outside this range are refused (telemetry has none; arithmetic near year 1 or 9999 overflows)
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)

EXAMPLES = "'last 30m', '1 hour ago', 'yesterday', 'PT30M', '2026-04-07T14:00:00Z/PT30M'"


def utcnow() -> datetime:
    return datetime.now(UTC)


def ensure_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_duration(text: str) -> timedelta:
    """ISO 8601 duration (``PT30M``, ``P1DT2H``, ``P2W``) or short form (``30m``, ``2 hours``)."""
    raw = text.strip()
    if not raw:
        raise InvalidInput("empty duration")
    match = _ISO_DURATION.match(raw.upper())
    if match and raw.upper() not in ("P", "PT"):
        parts = {k: float(v) for k, v in match.groupdict().items() if v}
        if not parts:
            raise InvalidInput(f"invalid ISO 8601 duration {text!r}")
        seconds = (
            parts.get("w", 0) * 604800 + parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600
            + parts.get("m", 0) * 60 + parts.get("s", 0)
        )
        return _checked(seconds, text)
    short = _SHORT.match(raw.lower())
    if short and short.group(2) in _UNITS:
        return _checked(float(short.group(1)) * _UNITS[short.group(2)], text)
    raise InvalidInput(f"invalid duration {text!r}; use e.g. 'PT30M', '30m', '2 hours'")


def _checked(seconds: float, text: str) -> timedelta:
    """A positive duration of at most MAX_SPAN, checked as a number before it becomes a
    timedelta (which overflows past about 2.7 million years)."""
    if not math.isfinite(seconds) or seconds > MAX_SPAN.total_seconds():
        raise InvalidInput(f"duration {text!r} is longer than {MAX_SPAN.days} days")
    if seconds <= 0:
        raise InvalidInput(f"duration {text!r} must be positive")
    return timedelta(seconds=seconds)


def _in_range(moment: datetime, text: str) -> datetime:
    if not EARLIEST <= moment < LATEST:
        raise InvalidInput(f"time {text!r} is out of range; use a time between {EARLIEST.year} and {LATEST.year}")
    return moment


def shift(moment: datetime, delta: timedelta, text: str = "") -> datetime:
    """``moment + delta``, as ``InvalidInput`` when it leaves the supported range."""
    try:
        return _in_range(moment + delta, text or f"{isoformat(moment)} {'+' if delta >= timedelta(0) else '-'} "
                                                  f"{abs(delta)}")
    except OverflowError:
        raise InvalidInput(f"time {text!r} is out of range") from None


def _start_of_day(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def parse_instant(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO 8601 instant or a relative one: ``now``, ``today``, ``yesterday``, ``3 hours ago``,
    ``an hour ago``, ``now-30m``."""
    now = ensure_utc(now or utcnow())
    raw = text.strip()
    low = raw.lower()
    if low == "now":
        return now
    if low == "today":
        return _start_of_day(now)
    if low == "yesterday":
        return _start_of_day(now) - timedelta(days=1)
    ago = _AGO.match(low) or _NOW_MINUS.match(low)
    if ago:
        amount, unit = ago.group(1), ago.group(2)
        if unit not in _UNITS:
            raise InvalidInput(f"unknown time unit {unit!r} in {text!r}")
        count = 1.0 if amount in ("a", "an") else float(amount)
        return shift(now, -_checked(count * _UNITS[unit], text), text)
    try:
        parsed = ensure_utc(datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00")))
    except (ValueError, OverflowError):  # OverflowError: an offset that pushes year 1 or 9999 over the edge
        raise InvalidInput(f"invalid time {text!r}; use ISO 8601 or e.g. {EXAMPLES}") from None
    return _in_range(parsed, text)


def parse_range(text: str, *, now: datetime | None = None) -> tuple[datetime, datetime]:
    """A time window ``(start, end)`` from an ISO interval or a relative expression.

    Forms: ``start/end``, ``start/PT30M``, ``PT30M/end``, ``PT30M`` (the last 30 minutes),
    ``last 30m``, ``last hour``, ``yesterday``, ``today``, ``1 hour ago``, ``an hour ago``, ``now-1h``
    (from then until now).
    """
    now = ensure_utc(now or utcnow())
    raw = (text or "").strip()
    if not raw:
        raise InvalidInput(f"empty time range; use e.g. {EXAMPLES}")
    low = raw.lower()
    if "/" in raw:
        left, _, right = raw.partition("/")
        left_is_dur = left.strip().upper().startswith("P")
        right_is_dur = right.strip().upper().startswith("P")
        if left_is_dur and right_is_dur:
            raise InvalidInput(f"interval {text!r} needs at least one instant")
        if left_is_dur:
            end = parse_instant(right, now=now)
            start = shift(end, -parse_duration(left), text)
        elif right_is_dur:
            start = parse_instant(left, now=now)
            end = shift(start, parse_duration(right), text)
        else:
            start, end = parse_instant(left, now=now), parse_instant(right, now=now)
        return _ordered(start, end, text)
    if low == "yesterday":
        start = _start_of_day(now) - timedelta(days=1)
        return start, start + timedelta(days=1)
    if low == "today":
        return _start_of_day(now), now
    last = _LAST.match(low)
    if last:
        amount, unit = last.group(1) or "1", last.group(2)
        if unit not in _UNITS:
            raise InvalidInput(f"unknown time unit {unit!r} in {text!r}")
        return shift(now, -_checked(float(amount) * _UNITS[unit], text), text), now
    if raw.upper().startswith("P"):
        return shift(now, -parse_duration(raw), text), now
    if _AGO.match(low) or _NOW_MINUS.match(low) or low == "now":
        return _ordered(parse_instant(raw, now=now), now, text)
    try:
        return _ordered(parse_instant(raw, now=now), now, text)
    except InvalidInput:
        raise InvalidInput(f"invalid time range {text!r}; use e.g. {EXAMPLES}") from None


def _ordered(start: datetime, end: datetime, text: str) -> tuple[datetime, datetime]:
    if end <= start:
        raise InvalidInput(f"time range {text!r} ends before it starts")
    if end - start > MAX_SPAN:
        raise InvalidInput(f"time range {text!r} is longer than {MAX_SPAN.days} days")
    return start, end


def isoformat(moment: datetime) -> str:
    """RFC 3339 with millisecond precision and a ``Z`` suffix, as the tool schemas show."""
    return ensure_utc(moment).isoformat(timespec="milliseconds").replace("+00:00", "Z")
