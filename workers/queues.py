"""Queue and task names: the one place they are spelled."""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    TURNS = "turns"  # LLM steps: short CPU, long network waits
    TOOLS = "tools"  # tool calls: time-limited, fanned out in parallel


class TaskName(StrEnum):
    STEP = "kortex.turn.step"
    TOOL = "kortex.tool.run"
    WATCHDOG = "kortex.turn.watchdog"
