"""The umbrella's output: one compact table of figures, each beside its baseline from the
same run, the ratio and the issue's goal for it; notes (CPU by process, errors) under it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    part: str
    measure: str
    kortex: float | None
    baseline: float | None
    unit: str = ""
    # "<= 1.5x" / ">= 0.5x": the ratio at most / at least; "<= 5" (no x): Kortex's own figure
    # at most (an absolute goal, in the row's unit); empty: informative.
    goal: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.kortex is None or self.baseline is None or self.baseline == 0:
            return None
        return self.kortex / self.baseline

    @property
    def met(self) -> bool | None:
        if not self.goal:
            return None
        value = self.ratio if self.goal.endswith("x") else self.kortex
        if value is None:
            return None
        bound = float(self.goal.split()[1].rstrip("x"))
        return value <= bound if self.goal.startswith("<=") else value >= bound


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def note(self, part: str, text: str) -> None:
        self.notes.append(f"{part}: {text}")

    def as_json(self) -> dict[str, Any]:
        return {"rows": [{**asdict(r), "ratio": r.ratio, "met": r.met} for r in self.rows], "notes": self.notes,
                "raw": self.raw}

    def render(self) -> str:
        head = f"{'part':10} {'measure':34} {'kortex':>10} {'baseline':>10} {'ratio':>7}  {'goal':9} "
        lines = [head, "-" * len(head)]
        for r in self.rows:
            ratio = "" if r.ratio is None else f"{r.ratio:.0f}x" if r.ratio >= 100 else f"{r.ratio:.2f}x"
            met = {True: "ok", False: "MISSED", None: ""}[r.met]
            lines.append(f"{r.part:10} {(r.measure + (f' ({r.unit})' if r.unit else '')):34} {fmt(r.kortex):>10} "
                         f"{fmt(r.baseline):>10} {ratio:>7}  {r.goal:9} {met}{('  ' + r.note) if r.note else ''}")
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"
