"""Log lines group into templates: variable parts masked, counted, timed, by host, split at a moment."""

from __future__ import annotations

from datetime import timedelta

from kortex.telemetry.logtemplates import group, template
from kortex.telemetry.sources import LogLine
from kortex.timeparse import utcnow


def test_variable_parts_are_masked_and_words_are_kept() -> None:
    assert template("call to inventory took 1480ms (reserve stock)") == "call to inventory took <n> (reserve stock)"
    assert template("consumer crashed on message id 88f1") == "consumer crashed on message id <id>"
    assert template("lookup users-db.internal on 10.0.0.2:53 failed") == "lookup users-db.internal on <ip> failed"
    assert template("TLS handshake failed: x509: certificate has expired") == \
        "TLS handshake failed: x509: certificate has expired"


def test_templates_count_time_hosts_and_the_split() -> None:
    now = utcnow()
    lines = [LogLine(id=i, ts=now - timedelta(minutes=i), level="error", host=f"web-{1 if i % 10 else 2}",
                     message=f"request {i} took {100 + i}ms") for i in range(1, 31)]
    lines.append(LogLine(id=99, ts=now, level="warn", host="web-1", message="queue full"))
    [top, other] = group(lines, split_at=now - timedelta(minutes=10, seconds=30))
    assert top["template"] == "request <n> took <n>" and top["count"] == 30
    assert (top["before"], top["after"]) == (20, 10)
    assert top["hosts"] == [{"host": "web-1", "count": 27}, {"host": "web-2", "count": 3}]
    assert top["first_ts"] < top["last_ts"] and top["levels"] == {"error": 30}
    assert other["count"] == 1 and other["example"] == "queue full"
    assert "before" not in group(lines)[0]
