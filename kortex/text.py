"""Text every entry point takes as PostgreSQL can store it: no NUL character, no lone surrogate.

PostgreSQL's text and jsonb cannot hold NUL (``\\u0000``), and no UTF-8 database can hold a lone
surrogate (``\\ud800``-``\\udfff``: Python's JSON decoder accepts one as an escape, and a command
line's undecodable bytes arrive as such; psycopg cannot encode it). Refused here, it is the
caller's mistake, a 422 that names the field; left to the driver, it looks like an outage (503).
What a model writes cannot be refused that way: such characters are replaced instead
(``storable``).

A name (a session's, a key's, a tenant's) is stricter: one line that terminals, log lines, Flower
and UIs print as they find it, so it holds no control character either (Unicode's Cc: C0, DEL,
C1). ESC or the C1 CSI (``\\x9b``) starts an escape sequence that recolours or rewrites the
screen around it, a line break forges a log line, BEL rings. Message content and tool arguments
are not names: their lines and tabs are the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator

from kortex.errors import InvalidInput

NUL = "\x00"
REPLACEMENT = "\ufffd"  # Unicode's own mark for a character that could not be kept
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: Cc (C0, DEL, C1), and what reorders or breaks a line where it is shown: the line and
#: paragraph separators, and the bidirectional overrides and isolates (U+202A-202E,
#: U+2066-2069: a name that reads "invoice" and sorts, greps and logs as something else)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
#: what ``one_line`` turns into one space: runs of controls and whitespace (a tab, a line break)
_BREAKS = re.compile("[\\s\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def _problem(value: str) -> str | None:
    if NUL in value:
        return "contains a NUL character"
    if not value.isascii() and _UNSTORABLE.search(value):  # ASCII, nearly all text, is never scanned
        return "is not valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"
    return None


def _refuse(problem: str | None, field: str) -> None:
    if problem is not None:
        raise InvalidInput(f"{field} {problem}", code="validation",
                           details=[{"field": field, "message": problem}])


def _validator(find: Callable[[str], str | None]) -> Callable[[str], str]:
    """A pydantic validator refusing what ``find`` finds (pydantic names the field)."""
    def check(value: str) -> str:
        problem = find(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return check


def check_storable(value: str | None, field: str) -> None:
    """InvalidInput (422, naming ``field``) when ``value`` holds a NUL or a lone surrogate."""
    _refuse(None if value is None else _problem(value), field)


def _name_problem(value: str) -> str | None:
    problem = _problem(value)
    if problem is not None:
        return problem
    found = _CONTROL.search(value)
    if found is not None:  # its code point, not itself: an echoed escape sequence would act again
        return f"contains a control character (U+{ord(found.group()):04X}): a name is one line of printable text"
    return None


def check_name(value: str | None, field: str) -> None:
    """InvalidInput (422, naming ``field``) when ``value`` is not storable or holds a control
    character. Whitespace at its ends and its length are the caller's rules."""
    _refuse(None if value is None else _name_problem(value), field)


def one_line(text: str) -> str:
    """Free text made a name (e.g. a question's start naming its session): every run of
    whitespace and control characters one space, the ends stripped, unstorable characters
    replaced."""
    return _BREAKS.sub(" ", storable(text)).strip()


def storable(text: str) -> str:
    """``text`` with every NUL and lone surrogate replaced by U+FFFD (the same object when it has
    none)."""
    if NUL not in text and (text.isascii() or not _UNSTORABLE.search(text)):
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


#: a request model's string field: refused by its validation, like any other bad value
Storable = Annotated[str, AfterValidator(_validator(_problem))]
#: a request model's name field: storable, and no control character (a 422 naming the field)
Name = Annotated[str, AfterValidator(_validator(_name_problem))]


__all__ = ["NUL", "REPLACEMENT", "Name", "Storable", "check_name", "check_storable", "one_line", "storable"]
