"""What the command line says when a command fails: one line naming what was unreachable or
wrong and what to do, never a traceback (``KORTEX_DEBUG=1`` shows it) and never a secret.

Libraries quote the URL they failed on, password included, so every message is scrubbed.
"""

from __future__ import annotations

import os

from kortex.errors import KortexError
from kortex.redaction import scrub_text

DEBUG_ENV = "KORTEX_DEBUG"


def describe(exc: BaseException, *, migrating: bool = False) -> str:
    """The one line for ``exc``; ``migrating``: it came from ``kortex migrate``, which is no
    remedy for it then."""
    return scrub_text(_describe(exc, migrating))


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else exc.__class__.__name__


def _describe(exc: BaseException, migrating: bool) -> str:
    if isinstance(exc, KortexError):
        return str(exc)
    import httpx
    import redis
    import sqlalchemy.exc

    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return f"not a usable URL ({_first_line(exc)}): write it as http(s)://host:port"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        where = _request_url(exc)
        return f"cannot reach the Kortex API{where}: {_first_line(exc)}"
    if isinstance(exc, httpx.HTTPError):
        return f"the Kortex API{_request_url(exc)} failed: {exc.__class__.__name__}: {_first_line(exc)}"
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        cause = exc.orig if exc.orig is not None else exc
        return f"cannot use the database: {_first_line(cause)}"
    if isinstance(exc, sqlalchemy.exc.ProgrammingError):
        reason = _first_line(exc.orig or exc)
        if exc.statement is None:  # refused before any query: the driver rejected how to connect
            return f"cannot connect to the database ({reason}): check the options in KORTEX_DATABASE_URL"
        if migrating:
            return f"the database refused a migration ({reason})"
        return f"the database refused a query ({reason}): is it migrated? run 'kortex migrate'"
    if isinstance(exc, sqlalchemy.exc.DatabaseError) and not isinstance(
            exc, sqlalchemy.exc.IntegrityError | sqlalchemy.exc.DataError):
        # e.g. SQLite's "file is not a database": the URL names something that is not one
        return (f"cannot use the database ({_first_line(exc.orig or exc)}): check that KORTEX_DATABASE_URL "
                "(or the embedded SQLite file) is a Kortex database")
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis: {_first_line(exc)}"
    if isinstance(exc, OSError):
        return f"{exc.__class__.__name__}: {_first_line(exc)}"
    return (f"unexpected {exc.__class__.__name__}: {_first_line(exc)} "
            f"(set {DEBUG_ENV}=1 for the traceback)")


def _request_url(exc: BaseException) -> str:
    try:
        request = exc.request  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is attached
        return ""
    url = request.url
    return f" at {url.scheme}://{url.host}{f':{url.port}' if url.port else ''}"
