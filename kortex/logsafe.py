"""Secrets never reach a log line: a handler filter that scrubs every record's message and
traceback with the same rules as tool output and audit rows (kortex/redaction.py).

Code already avoids logging secrets; this catches what it cannot control: a library's
exception that quotes a DSN with its password, an upstream error body echoing a token.
"""

from __future__ import annotations

import logging

from kortex.redaction import scrub_text

_formatter = logging.Formatter()


class ScrubSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return True
        clean = scrub_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        # Formatters reuse exc_text when set, so a scrubbed traceback is what gets written.
        if record.exc_info and not record.exc_text:
            record.exc_text = _formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub_text(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub_text(record.stack_info)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to every handler of ``logger`` (the root logger by default), once."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, ScrubSecrets) for f in handler.filters):
            handler.addFilter(ScrubSecrets())


__all__ = ["ScrubSecrets", "install"]
