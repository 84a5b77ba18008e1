"""Linear-time regular expressions (RE2) for patterns a model or a user wrote.

Python's ``re`` backtracks: ``(a|a)*$`` or ``.*.*.*.*.*x`` take exponential or high-polynomial
time on a short line, and inside one SQLite step (which holds the GIL) nothing can stop them,
not even the statement timeout. RE2, the engine Loki and Prometheus use, matches in time
linear in the text, so the cost of a match is bounded by the pattern's and the line's length.
RE2 has no backreferences or lookarounds; neither has LogQL.
"""

from __future__ import annotations

import functools
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships neither a py.typed marker nor stubs

from kortex.errors import InvalidInput

MAX_PATTERN = 200       # characters a caller may write
_WRAPPER = len("(?i)^(?:)$")  # what anchoring adds around a pattern
MAX_PROGRAM_MEM = 1 << 20  # bytes RE2 may use for one compiled pattern (a cap on its size)
#: the SQL function name embedded SQLite databases know (see ``storage/db.py``)
SQLITE_FUNCTION = "kortex_re2"
#: the SQL function for a substring in any case, in any script, on SQLite (whose LIKE folds
#: ASCII letters only); registered on a connection by its first user (telemetry/embedded.py)
SQLITE_ICONTAINS = "kortex_icontains"


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False      # bad patterns are the caller's business, not stderr's
    options.never_capture = True    # matching only: no submatch bookkeeping
    options.max_mem = MAX_PROGRAM_MEM
    return options


_OPTIONS = _options()


@functools.lru_cache(maxsize=512)
def compile_pattern(pattern: str) -> Any:
    """A compiled RE2 pattern; ``InvalidInput`` for a pattern that is too long or not RE2."""
    if len(pattern) > MAX_PATTERN + _WRAPPER:
        raise InvalidInput(f"regex is longer than {MAX_PATTERN} characters")
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidInput(f"invalid regex {pattern!r}: {detail} (RE2 syntax: no backreferences or "
                           "lookarounds)") from None


def anchored(pattern: str) -> str:
    """``pattern`` matching a whole value (LogQL label matchers). A leading ``(?i)`` stays in
    front: PostgreSQL accepts embedded options only at the very start of a pattern."""
    if pattern.startswith("(?i)"):
        return "(?i)^(?:" + pattern[4:] + ")$"
    return "^(?:" + pattern + ")$"


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (unanchored, as LogQL's ``|~``)."""
    return compile_pattern(pattern).search(text) is not None


def sqlite_search(pattern: str | None, text: str | None) -> int | None:
    """The SQL function ``kortex_re2(pattern, text)``: 1, 0, or NULL when either is NULL."""
    if pattern is None or text is None:
        return None
    return 1 if search(pattern, text) else 0


@functools.lru_cache(maxsize=256)
def _folded(text: str) -> str:
    return text.casefold()


def sqlite_icontains(needle: str | None, text: str | None) -> int | None:
    """The SQL function ``kortex_icontains(needle, text)``: 1 when ``text`` holds ``needle`` in
    any case (Unicode case folding: "échec" finds "ÉCHEC"), 0 when not, NULL when either is NULL."""
    if needle is None or text is None:
        return None
    return 1 if _folded(needle) in text.casefold() else 0
