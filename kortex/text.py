"""Text every entry point takes as PostgreSQL can store it: no NUL character, no lone surrogate.

PostgreSQL's text and jsonb cannot hold NUL (``\\u0000``), and no UTF-8 database can hold a lone
surrogate (``\\ud800``-``\\udfff``: Python's JSON decoder accepts one as an escape, and a command
line's undecodable bytes arrive as such; psycopg cannot encode it). Refused here, it is the
caller's mistake, a 422 that names the field; left to the driver, it looks like an outage (503).
What a model writes cannot be refused that way: such characters are replaced instead
(``storable``).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from kortex.errors import InvalidInput

NUL = "\x00"
REPLACEMENT = "\ufffd"  # Unicode's own mark for a character that could not be kept
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _problem(value: str) -> str | None:
    if NUL in value:
        return "contains a NUL character"
    if not value.isascii() and _UNSTORABLE.search(value):  # ASCII, nearly all text, is never scanned
        return "is not valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"
    return None


def check_storable(value: str | None, field: str) -> None:
    """InvalidInput (422, naming ``field``) when ``value`` holds a NUL or a lone surrogate."""
    problem = None if value is None else _problem(value)
    if problem is not None:
        raise InvalidInput(f"{field} {problem}", code="validation",
                           details=[{"field": field, "message": problem}])


def _storable(value: str) -> str:
    problem = _problem(value)
    if problem is not None:
        raise ValueError(problem)  # pydantic names the field
    return value


def storable(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD (the same object when it has
    none)."""
    if NUL not in text and (text.isascii() or not _UNSTORABLE.search(text)):
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


#: a request model's string field: refused by its validation, like any other bad value
Storable = Annotated[str, AfterValidator(_storable)]


__all__ = ["NUL", "REPLACEMENT", "Storable", "check_storable", "storable"]
