"""Bound a tool result to a byte budget, flagging ``truncated`` instead of cutting silently.

The pipeline caps what the model will actually see: the allowlisted, scrubbed result (a
scrubbed string can be longer than the original). Top-level fields whose name starts with
``_`` are private to the tool (paging keys its ``on_truncate`` needs); they never reach the
model, so they do not count against the budget.

Order of measures: drop items from the end of the tool's list (the start, for a series kept by
its tail; never all of them, so a page always makes progress and its cursor moves), then
shorten long strings. A result that still
does not fit raises ``ResultTooLarge``: the model gets an error it can act on (narrow the
query), never an empty-looking success."""

from __future__ import annotations

import json
from typing import Any

from kortex.errors import ResultTooLarge
from kortex.tools.spec import ToolSpec

_MIN_STRING = 200
_WHOLE = frozenset({"next_cursor"})


def encoded_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())


def _public_size(value: dict[str, Any]) -> int:
    return encoded_size({k: v for k, v in value.items() if not k.startswith("_")})


def cap_result(
    result: dict[str, Any], spec: ToolSpec, limit: int, args: Any = None, ctx: Any = None
) -> tuple[dict[str, Any], bool]:
    """Return ``(result, truncated)``; the result fits in ``limit`` bytes of compact JSON."""
    if _public_size(result) <= limit:
        return result, bool(result.get("truncated", False))
    out = dict(result)
    field = spec.list_field or _largest_list(out)
    items = out.get(field) if field else None
    if field and isinstance(items, list) and len(items) > 1:
        tail = spec.keep == "tail"

        def first(n: int) -> list[Any]:
            return items[len(items) - n:] if tail else items[:n]

        lo, hi = 1, len(items)
        while lo < hi:  # the most items that still fit (at least one: the page must move on)
            mid = (lo + hi + 1) // 2
            trial = {**out, field: first(mid), "truncated": True}
            if _public_size(trial) <= limit:
                lo = mid
            else:
                hi = mid - 1
        if lo < len(items):
            out[field] = first(lo)
            out["truncated"] = True
            if spec.on_truncate is not None and not tail:  # paging continues after a kept head
                out = spec.on_truncate(out, args, lo, ctx)
                # The fix-up may add a field (a next_cursor the last page did not have): make room.
                while lo > 1 and _public_size(out) > limit:
                    lo -= 1
                    out = spec.on_truncate({**out, field: items[:lo]}, args, lo, ctx)
        if _public_size(out) <= limit:
            return out, True
    # Still too big: long strings are the remaining suspects.
    budget = max(_MIN_STRING, limit // 8)
    while budget >= _MIN_STRING:
        out = _shorten_strings(out, budget)
        out["truncated"] = True
        if _public_size(out) <= limit:
            return out, True
        budget //= 2
    raise ResultTooLarge(
        f"the result is larger than {limit} bytes even after trimming it; ask for less: a shorter time range, "
        "a narrower filter or a smaller limit")


def _largest_list(result: dict[str, Any]) -> str | None:
    lists = [(encoded_size(v), k) for k, v in result.items() if isinstance(v, list) and v and not k.startswith("_")]
    return max(lists)[1] if lists else None


def _shorten_strings(value: Any, budget: int) -> Any:
    if isinstance(value, str) and len(value) > budget:
        return value[:budget] + "…[truncated]"
    if isinstance(value, dict):  # private fields and cursors are used whole, or not at all
        return {k: (v if k in _WHOLE or (isinstance(k, str) and k.startswith("_")) else _shorten_strings(v, budget))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten_strings(v, budget) for v in value]
    return value
