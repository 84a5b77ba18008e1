"""What a client does with step attempts: a step re-run after its worker died or stalled
streams again under a higher attempt, and events of the attempt it replaced are dropped."""

from __future__ import annotations

from typing import Any


class AttemptFilter:
    """Feed every event in stream order; ``accept`` says whether to show it."""

    def __init__(self) -> None:
        self.attempt = 0
        self._steps: set[int] = set()
        self.rerun_step: int | None = None  # set by accept() when a turn event re-runs a step

    def accept(self, event: str, data: dict[str, Any]) -> bool:
        self.rerun_step = None
        attempt = int(data.get("attempt") or 0)
        if attempt and attempt < self.attempt:
            return False  # written by an attempt that a later one replaced
        self.attempt = max(self.attempt, attempt)
        if event == "turn" and data.get("status") == "running":
            step = int(data.get("step") or 0)
            if step in self._steps:
                self.rerun_step = step
            self._steps.add(step)
        return True
