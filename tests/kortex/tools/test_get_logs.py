"""get_logs on the embedded store: a cursor keeps the first page's window to the microsecond, a
missing label equals "" for every matcher (as in LogQL), and plain text matches in any case, in
any script. The checks take a harness, so tests/integration/test_embedded_pg.py runs them on
PostgreSQL too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kortex.telemetry import ingest
from tests.conftest import Harness

T0 = datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC)


def _line(ts: datetime, message: str, trace_id: str | None = None) -> dict[str, Any]:
    return {"product": "p", "ts": ts, "severity": 20, "level": "info", "host": "h", "message": message,
            "trace_id": trace_id}


def _write(h: Harness, tenant: str, lines: list[dict[str, Any]]) -> None:
    with h.k.db.begin() as conn:
        ingest.write(conn, tenant, "logs", lines)


def check_cursor_keeps_the_window_to_the_microsecond(h: Harness) -> None:
    tenant = h.tenant("window")
    # The window starts 500 µs after 10:00:00; a line 200 µs after it is outside, three are in.
    _write(h, tenant, [_line(T0 + timedelta(microseconds=200), "outside"),
                       *(_line(T0 + timedelta(seconds=s), f"in {s}") for s in (1, 2, 3))])
    args = {"product": "p", "time_range": "2026-11-27T10:00:00.000500Z/PT1H", "limit": 1}
    pages: list[dict[str, Any]] = []
    cursor = None
    while len(pages) < 10:
        result = h.call(tenant, "get_logs", {**args, **({"cursor": cursor} if cursor else {})})
        assert not result.is_error, result.content
        pages.append(result.content)
        cursor = result.content.get("next_cursor")
        if not cursor:
            break
    assert [line["message"] for page in pages for line in page["lines"]] == ["in 3", "in 2", "in 1"]
    assert [page["total_matches"] for page in pages] == [3, 3, 3]


def check_a_missing_label_equals_the_empty_string(h: Harness) -> None:
    tenant = h.tenant("labels")
    now = datetime.now(UTC)
    _write(h, tenant, [_line(now - timedelta(minutes=5), "with", trace_id="t1"),
                       _line(now - timedelta(minutes=4), "without"),
                       _line(now - timedelta(minutes=3), "without again")])

    def messages(query: str) -> list[str]:
        result = h.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h", "query": query})
        assert not result.is_error, result.content
        return sorted(line["message"] for line in result.content["lines"])

    without, with_one = ["without", "without again"], ["with"]
    assert messages('{trace_id=""}') == messages('{trace_id=~""}') == without
    assert messages('{trace_id!=""}') == messages('{trace_id!~""}') == with_one
    assert messages('{trace_id="t1"}') == with_one
    assert messages('{trace_id!="t1"}') == without


def check_plain_text_matches_in_any_case_and_script(h: Harness) -> None:
    tenant = h.tenant("unicode")
    now = datetime.now(UTC)
    _write(h, tenant, [_line(now - timedelta(minutes=2), "ÉCHEC de connexion à la base"),
                       _line(now - timedelta(minutes=1), "Ошибка: TIMEOUT")])

    def count(query: str) -> int:
        result = h.call(tenant, "get_logs", {"product": "p", "time_range": "last 1h", "query": query})
        assert not result.is_error, result.content
        return int(result.content["total_matches"])

    assert count("échec") == count("ÉCHEC") == count("Échec De") == 1
    assert count("ошибка") == count("timeout") == 1
    assert count("échecs") == count("100%") == 0


def test_a_cursor_keeps_the_window_to_the_microsecond(harness: Harness) -> None:
    check_cursor_keeps_the_window_to_the_microsecond(harness)


def test_a_missing_label_equals_the_empty_string(harness: Harness) -> None:
    check_a_missing_label_equals_the_empty_string(harness)


def test_plain_text_matches_in_any_case_and_script(harness: Harness) -> None:
    check_plain_text_matches_in_any_case_and_script(harness)
