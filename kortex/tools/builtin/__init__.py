"""The built-in investigation tools. Adding one is a module plus one line here."""

from __future__ import annotations

from kortex.tools.builtin import get_logs, get_metrics, get_recent_deploys
from kortex.tools.spec import ToolSpec

BUILTIN_TOOLS: tuple[ToolSpec, ...] = (
    get_logs.SPEC,
    get_metrics.SPEC,
    get_recent_deploys.SPEC,
)
