"""Queue and task names: the one place they are spelled."""

from __future__ import annotations

from enum import StrEnum


class Queue(StrEnum):
    TURNS = "turns"  # LLM steps: short CPU, long network waits
    TOOLS = "tools"  # tool calls: time-limited, fanned out in parallel
    BATCH = "batch"  # batch jobs: their items, and their turns' steps and tool calls


class TaskName(StrEnum):
    STEP = "kortex.turn.step"
    TOOL = "kortex.tool.run"
    WATCHDOG = "kortex.turn.watchdog"
    POSTMORTEM_ITEM = "kortex.postmortem.item"
