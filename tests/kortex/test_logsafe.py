"""Log records are scrubbed of secrets, message and traceback alike."""

from __future__ import annotations

import io
import logging

from kortex import logsafe


def _logger(name: str) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logsafe.install(logger)
    logsafe.install(logger)  # idempotent
    assert len(handler.filters) == 1
    return logger, out


def test_messages_and_their_arguments_are_scrubbed() -> None:
    log, out = _logger("test.logsafe.msg")
    log.warning("connecting to %s with %s", "postgresql://kortex:hunter2@db:5432/k", "Bearer sk-abcdefghijkl1234")
    log.info("nothing secret about %d rows", 3)
    text = out.getvalue()
    assert "hunter2" not in text and "sk-abcdefghijkl1234" not in text
    assert "postgresql://kortex:[REDACTED]@db:5432/k" in text and "nothing secret about 3 rows" in text


def test_tracebacks_are_scrubbed() -> None:
    log, out = _logger("test.logsafe.exc")
    try:
        raise RuntimeError("upstream said: Authorization: Bearer tok_live_0123456789abcdef")
    except RuntimeError:
        log.exception("call failed")
    text = out.getvalue()
    assert "call failed" in text and "Traceback" in text and "RuntimeError" in text
    assert "tok_live_0123456789abcdef" not in text
