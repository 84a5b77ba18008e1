"""RE2 for user-written patterns: linear time, RE2 syntax, and the SQL function SQLite uses."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from kortex.errors import InvalidInput
from kortex.regex import MAX_PATTERN, anchored, compile_pattern, search
from kortex.storage.db import Database


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("pattern", "bait", "hit"), [
    ("((a+))+$", "a" * 5000 + "!", False), ("(a{1,})+$", "a" * 5000 + "!", False), ("(a|a)*$", "a" * 5000 + "!", True),
    ("(\\w|a)*$", "a" * 5000 + "!", True), (".*.*.*.*.*x", "a" * 5000, False), ("(x+x+)+y", "x" * 5000, False),
])
def test_backtracking_patterns_match_in_linear_time(pattern: str, bait: str, hit: bool) -> None:
    assert search(pattern, bait) is hit


def test_rejects_what_re2_cannot_run_and_overlong_patterns() -> None:
    for bad in ("(a)\\1", "(?=a)", "(?<!a)b", "(", "a" * (MAX_PATTERN + 20)):
        with pytest.raises(InvalidInput):
            compile_pattern(bad)
    assert search("(?P<n>x)y", "axy") and search("(?i)TIMEOUT", "request timeout")


def test_anchoring_keeps_a_leading_case_flag_first() -> None:
    assert anchored("(?i)web-[12]") == "(?i)^(?:web-[12])$" and anchored("a|b") == "^(?:a|b)$"
    assert search(anchored("a|b"), "b") and not search(anchored("a|b"), "ab")


def test_sqlite_connections_have_the_re2_function(tmp_path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with db.connect() as conn:
            got = conn.execute(text("SELECT kortex_re2(:p, :t), kortex_re2(:p, 'b'), kortex_re2(:p, NULL)"),
                               {"p": "(a|a)*$", "t": "a" * 40 + "!"}).one()
        assert tuple(got) == (1, 1, None)
    finally:
        db.dispose()
