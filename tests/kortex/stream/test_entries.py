"""Entries as the hub reads them, and where a reconnecting reader resumes."""

from __future__ import annotations

import pytest

from kortex.errors import InvalidInput
from kortex.stream.entries import START, Entry, entries_from_raw, parse_id, resume_id


def test_raw_entries_keep_type_and_body_and_skip_other_fields() -> None:
    raw = [
        ["1-0", ["t", "text", "d", '{"delta":"a"}', "a", "2", "s", "7"]],  # the writers' order, extra fields
        ["1-1", ["s", "8", "a", "2", "d", '{"delta":"b"}', "t", "text"]],   # any order
        ["1-2", {"t": "done", "d": "{}", "a": "2"}],                       # a client that parsed fields
        ["1-3", ["a", "2"]],                                                # neither: still an entry
    ]
    assert entries_from_raw(raw) == [
        Entry("1-0", "text", '{"delta":"a"}'), Entry("1-1", "text", '{"delta":"b"}'),
        Entry("1-2", "done", "{}"), Entry("1-3", "", "{}"),
    ]


@pytest.mark.parametrize("value, expected", [
    (None, START), ("", START), ("nonsense", START), ("1-2-3", START), ("12-3", "12-3"),
    ("1-2\n", START),  # not an id (``$`` matched before a final newline, and Redis refused it: 503)
    ("18446744073709551615-18446744073709551614", "18446744073709551615-18446744073709551614"),
])
def test_resume_points(value: str | None, expected: str) -> None:
    assert resume_id(value) == expected


def test_an_id_with_a_final_newline_is_not_an_id() -> None:
    with pytest.raises(ValueError):
        parse_id("1-2\n")


@pytest.mark.parametrize("value", ["18446744073709551615-18446744073709551615", "99999999999999999999-0",
                                   "1-18446744073709551616"])
def test_ids_out_of_range_are_refused_naming_the_header(value: str) -> None:
    with pytest.raises(InvalidInput) as err:
        resume_id(value)
    assert err.value.details == [{"field": "Last-Event-ID", "message": "out of range"}]
