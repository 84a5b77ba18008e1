"""Where a series stepped: the split that best separates it into two means, and whether that step
stands out from the noise before it. The metric tools return it so that any model quotes the
onset, the two levels and how many samples each holds from a result instead of working them out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kortex.telemetry.sources import Sample
from kortex.timeparse import ensure_utc, isoformat

MIN_SAMPLES = 8      # fewer points say nothing about a step
MIN_SIDE = 3         # each side of the split keeps at least this many
MIN_RATIO = 1.5      # the level moved by half again, or to two thirds or less
NOISE = 3.0          # and by more than three standard deviations of the level before


@dataclass(frozen=True, slots=True)
class ChangePoint:
    onset: datetime
    before: float            # mean before the onset
    after: float             # mean from the onset on
    before_samples: int
    after_samples: int
    ratio: float             # after / before (inf from zero)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChangePoint:
        """A step as a tool result carried it."""
        before, after = float(data["before_mean"]), float(data["after_mean"])
        return cls(onset=ensure_utc(datetime.fromisoformat(str(data["onset"]).replace("Z", "+00:00"))), before=before, after=after,
                   before_samples=int(data["before_samples"]), after_samples=int(data["after_samples"]),
                   ratio=after / before if before else math.inf)

    def as_dict(self) -> dict[str, Any]:
        return {"onset": isoformat(self.onset), "before_mean": round(self.before, 6),
                "after_mean": round(self.after, 6), "before_samples": self.before_samples,
                "after_samples": self.after_samples,
                "direction": "up" if self.after > self.before else "down"}


def find(points: Sequence[tuple[datetime, float]]) -> ChangePoint | None:
    """The significant step in ``points`` (oldest first), if there is one."""
    values = [v for _, v in points]
    n = len(values)
    if n < MIN_SAMPLES:
        return None
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    best, split = -1.0, 0
    for i in range(MIN_SIDE, n - MIN_SIDE + 1):
        left = prefix[i] / i
        right = (prefix[n] - prefix[i]) / (n - i)
        score = abs(right - left) * math.sqrt(i * (n - i) / n)  # a two-sample t-like score
        if score > best:
            best, split = score, i
    before_vals, after_vals = values[:split], values[split:]
    before = sum(before_vals) / len(before_vals)
    after = sum(after_vals) / len(after_vals)
    spread = math.sqrt(sum((v - before) ** 2 for v in before_vals) / max(1, len(before_vals) - 1))
    ratio = after / before if before else math.inf
    if not (ratio >= MIN_RATIO or ratio <= 1 / MIN_RATIO) or abs(after - before) <= NOISE * max(spread, 1e-9):
        return None
    return ChangePoint(onset=points[split][0], before=before, after=after, before_samples=len(before_vals),
                       after_samples=len(after_vals), ratio=ratio)


def of_samples(samples: Sequence[Sample]) -> dict[str, Any] | None:
    """A metric series' step as a tool result carries it (null: none)."""
    found = find([(s.ts, s.value) for s in samples])
    return found.as_dict() if found else None


__all__ = ["ChangePoint", "find", "of_samples"]
