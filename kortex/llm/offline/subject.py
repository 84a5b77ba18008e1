"""What a question is about, resolved against what exists: the products ``list_products``
returned in this turn, matched by whole word, then by a hyphenated name's first part ("api"
for api-gateway), then by a close spelling; a tenant with one product means that one."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

from kortex.messages import ToolCall, ToolResult

_WORD = re.compile(r"[a-z0-9][a-z0-9._-]*")


def listed(done: Sequence[tuple[ToolCall, ToolResult]]) -> tuple[ToolCall, list[str]] | None:
    """The turn's latest successful list_products call and the names it returned."""
    for call, result in reversed(done):
        if call.name == "list_products" and not result.is_error and isinstance(result.content, dict):
            products: list[Any] = result.content.get("products") or []
            return call, [str(p.get("product")) for p in products if isinstance(p, dict) and p.get("product")]
    return None


def resolve(text: str, names: Sequence[str]) -> str | None:
    words = [w.strip("._-") for w in _WORD.findall(text.lower())]
    lowered = {n.lower(): n for n in names}
    for word in words:
        if word in lowered:
            return lowered[word]
    for word in words:
        if len(word) >= 3:
            starts = [n for low, n in lowered.items() if low.split("-")[0] == word]
            if len(starts) == 1:
                return starts[0]
    for word in words:
        if len(word) >= 4:
            close = difflib.get_close_matches(word, list(lowered), n=1, cutoff=0.85)
            if close:
                return lowered[close[0]]
    return names[0] if len(names) == 1 else None


__all__ = ["listed", "resolve"]
