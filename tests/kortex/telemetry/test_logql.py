"""The LogQL subset get_logs accepts."""

from __future__ import annotations

import pytest

from kortex.errors import InvalidInput
from kortex.telemetry.logql import LineFilter, LogFilter, Matcher, parse, to_logql


def test_plain_text_stays_a_case_insensitive_contains() -> None:
    assert parse("pool exhausted") == LogFilter(plain="pool exhausted")
    assert parse("  ") is None and parse(None) is None


def test_selectors_and_line_filters() -> None:
    parsed = parse('{host=~"web-[0-9]+", level!="debug"} |= "timeout" != `healthz` |~ "5\\\\d\\\\d" !~ "(?i)retry"')
    assert parsed == LogFilter(
        matchers=(Matcher("host", "=~", "web-[0-9]+"), Matcher("level", "!=", "debug")),
        lines=(LineFilter("|=", "timeout"), LineFilter("!=", "healthz"), LineFilter("|~", "5\\d\\d"),
               LineFilter("!~", "(?i)retry")))
    assert parse('|= "say \\"hi\\""').lines == (LineFilter("|=", 'say "hi"'),)
    assert parse("{}").matchers == ()


@pytest.mark.parametrize("query", ['{service="x"}', '{host="a"', '{host="a"} | json', '|= unquoted', '{host=a}',
                                   '|~ "(a)\\\\1"', '|~ "(?=x)y"', '{host=~"(?<!a)b"}', '|~ "("', '|= "x" ' * 12,
                                   "x" * 501, '|~ "' + "a" * 201 + '"'])
def test_unsupported_or_broken_queries_are_rejected(query: str) -> None:
    with pytest.raises(InvalidInput):
        parse(query)


def test_to_logql_escapes_values_and_keeps_plain_text_case_insensitive() -> None:
    flt = parse('{host="a\\"b"} |= "x"')
    assert to_logql({"product": 'ch"eck'}, flt, (Matcher("level", "=~", "error|fatal"),)) == \
        '{product="ch\\"eck",host="a\\"b",level=~"error|fatal"} |= "x"'
    assert to_logql({"product": "p"}, parse("a.b")) == '{product="p"} |~ "(?i)a\\\\.b"'


@pytest.mark.parametrize("pattern", ["((a+))+$", "(a{1,})+$", "(a|a)*$", "(\\w|a)*$", ".*.*.*.*.*x", "(a+)+$"])
def test_patterns_that_backtrack_in_python_are_accepted(pattern: str) -> None:
    """RE2 matches them in linear time, so there is nothing to refuse (the old guard missed
    most of them anyway)."""
    assert parse(f"|~ `{pattern}`").lines == (LineFilter("|~", pattern),)
    assert parse(f"{{host=~`{pattern}`}}").matchers == (Matcher("host", "=~", pattern),)
