"""Text every entry point takes as PostgreSQL can store it: no NUL character.

PostgreSQL's text and jsonb cannot hold NUL (``\\u0000``). Refused here, it is the caller's
mistake, a 422 that names the field; left to the driver, it looks like an outage (503). What a
model writes cannot be refused that way: its NULs are replaced instead (``without_nul``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

from kortex.errors import InvalidInput

NUL = "\x00"
REPLACEMENT = "\ufffd"  # Unicode's own mark for a character that could not be kept


def check_no_nul(value: str | None, field: str) -> None:
    """InvalidInput (422, naming ``field``) when ``value`` holds a NUL character."""
    if value is not None and NUL in value:
        raise InvalidInput(f"{field} must not contain NUL (\\u0000) characters", code="validation",
                           details=[{"field": field, "message": "contains a NUL character"}])


def _storable(value: str) -> str:
    if NUL in value:
        raise ValueError("contains a NUL character")  # pydantic names the field
    return value


def without_nul(text: str) -> str:
    """``text`` with every NUL replaced by U+FFFD (the same object when it has none)."""
    return text.replace(NUL, REPLACEMENT)


#: a request model's string field: refused by its validation, like any other bad value
Storable = Annotated[str, AfterValidator(_storable)]


__all__ = ["NUL", "REPLACEMENT", "Storable", "check_no_nul", "without_nul"]
