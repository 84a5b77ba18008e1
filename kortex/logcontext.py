"""Which request, task, tenant, session and turn a log record belongs to, and JSON lines.

The ids live in context variables, set where the work starts: the API's request middleware
(``request_id``) and authentication (``tenant_id``), a Celery task's start (``task_id`` and the
ids in its arguments), a step once claimed (``tenant_id``, ``session_id``, ``turn_id``). Asyncio
tasks copy them when created and the step engine's I/O threads run in the step's context, so
every record written inside a turn's work carries them: a text line ends its first line with
them (``[turn=… session=… request=…]``), ``KORTEX_LOG_FORMAT=json`` writes one JSON object per
line with them as fields. Records are scrubbed of secrets before either format (kortex/logsafe.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

FIELDS = ("request_id", "task_id", "tenant_id", "session_id", "turn_id")
_VARS: dict[str, ContextVar[str | None]] = {f: ContextVar(f"kortex_{f}", default=None) for f in FIELDS}
FORMAT_ENV = "KORTEX_LOG_FORMAT"


def bind(**ids: str | None) -> list[Token[str | None]]:
    """Set ids for the rest of this context (a task, a thread's run); ``unbind`` undoes it."""
    return [_VARS[name].set(value) for name, value in ids.items() if name in _VARS]


def unbind(tokens: list[Token[str | None]]) -> None:
    for token in reversed(tokens):
        token.var.reset(token)


@contextlib.contextmanager
def bound(**ids: str | None) -> Iterator[None]:
    tokens = bind(**ids)
    try:
        yield
    finally:
        unbind(tokens)


def current() -> dict[str, str]:
    return {name: value for name, var in _VARS.items() if (value := var.get()) is not None}


class ContextFilter(logging.Filter):
    """Puts the current ids on each record (``record.kortex``) for the formatters."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.kortex = current()
        return True


#: each id's name on a text line, the narrowest piece of work first
TEXT_NAMES = (("turn_id", "turn"), ("session_id", "session"), ("tenant_id", "tenant"), ("task_id", "task"),
              ("request_id", "request"))


def text_ids(ids: Mapping[str, str]) -> str:
    """`` [turn=… session=… request=…]`` for the ids there are; empty when there are none."""
    named = " ".join(f"{short}={ids[name]}" for name, short in TEXT_NAMES if ids.get(name))
    return f" [{named}]" if named else ""


class TextIds(logging.Formatter):
    """A handler's own text formatter (the API's, Celery's coloured one, uvicorn's), its line
    unchanged but for the work's ids at the end of the first line: before a traceback, and
    where ``grep <turn id>`` finds it whatever the format put first."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record)
        ids = text_ids(getattr(record, "kortex", None) or current())
        if not ids:
            return text
        head, newline, rest = text.partition("\n")
        return head + ids + newline + rest


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the ids, the (scrubbed) traceback."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        body.update(getattr(record, "kortex", None) or current())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            body["exc"] = record.exc_text
        if record.stack_info:
            body["stack"] = record.stack_info
        return json.dumps(body, ensure_ascii=False, default=str)


def log_format() -> str:
    value = os.environ.get(FORMAT_ENV, "text").strip().lower()
    return value if value in ("text", "json") else "text"


def configure(logger: logging.Logger | None = None, fmt: str | None = None) -> None:
    """Give ``logger``'s handlers (the root's by default) the ids filter and a formatter that
    writes them: for ``json`` the JSON formatter, for ``text`` their own wrapped in ``TextIds``.
    Idempotent; call after whatever (Celery, uvicorn) set the handlers up."""
    fmt = fmt or log_format()
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, ContextFilter) for f in handler.filters):
            handler.addFilter(ContextFilter())
        if fmt == "json":
            if not isinstance(handler.formatter, JsonFormatter):
                handler.setFormatter(JsonFormatter())
        elif not isinstance(handler.formatter, TextIds | JsonFormatter):
            handler.setFormatter(TextIds(handler.formatter))


__all__ = ["FIELDS", "FORMAT_ENV", "TEXT_NAMES", "ContextFilter", "JsonFormatter", "TextIds", "bind", "bound",
           "configure", "current", "log_format", "text_ids", "unbind"]
