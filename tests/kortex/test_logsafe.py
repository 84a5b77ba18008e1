"""Log records are scrubbed of secrets, message and traceback alike."""

from __future__ import annotations

import io
import logging

import pytest

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


# The lines the telemetry audit found unscrubbed, each with the secret it leaked.
_AUDITED = [
    ("cache connect failed redis://:RedisS3cretPw@cache:6379/0", "RedisS3cretPw"),
    ("worker started: /usr/bin/mysqldump --password=MyDumpPw99 --all-databases", "MyDumpPw99"),
    ('auth failed for password="correct horse battery staple"', "horse battery staple"),
    ("upstream call: Authorization: Token ghx9ABCDEF0123456789secretvalue", "ghx9ABCDEF"),
    ('payload={\\"password\\": \\"EscapedPw123\\", \\"user\\": \\"bob\\"}', "EscapedPw123"),
    ("assumed role creds ASIAQWERTYUIOPASDFGH secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("assumed role creds ASIAQWERTYUIOPASDFGH", "ASIAQWERTYUIOPASDFGH"),
    ("db dsn postgresql://app:pa/ssw0rd@db:5432/app", "pa/ssw0rd"),
    ("login failed, password hunter2 rejected", "hunter2"),
]


@pytest.mark.parametrize("line,secret", _AUDITED)
def test_the_audited_leaks_are_scrubbed_from_messages_and_tracebacks(line: str, secret: str) -> None:
    log, out = _logger("test.logsafe.audit")
    log.warning("telemetry line: %s", line)
    try:
        raise RuntimeError(line)
    except RuntimeError:
        log.exception("ingest failed")
    text = out.getvalue()
    assert secret not in text and text.count("[REDACTED]") >= 2 and "ingest failed" in text
