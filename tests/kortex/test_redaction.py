from __future__ import annotations

import pytest

from kortex.redaction import REDACTED, Allowlist, scrub, scrub_text


@pytest.mark.parametrize("text,secret", [
    ("Authorization: Bearer eyJhbGciOi.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", "eyJzdWIiOiIxMjM0"),
    ("connecting to postgres://app:s3cr3t@db:5432/orders", "s3cr3t"),
    ("key AKIAIOSFODNN7EXAMPLE used", "AKIAIOSFODNN7EXAMPLE"),
    ("api_key=sk-ant-REDACTME0123456789abcdef", "REDACTME0123"),
    ("password: hunter2 rejected", "hunter2"),
    ("kortex key kx_0123456789ab_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123", "ABCDEFGHIJKLMNOP"),
])
def test_secrets_are_scrubbed(text: str, secret: str) -> None:
    cleaned = scrub_text(text)
    assert secret not in cleaned and REDACTED in cleaned


def test_innocent_text_is_untouched() -> None:
    text = "connection pool exhausted: timed out after 5000ms (pool max_size=10)"
    assert scrub_text(text) == text


def test_secret_named_keys_are_dropped() -> None:
    assert scrub({"user": "bob", "password": "x", "nested": [{"api_key": "y"}]}) == {
        "user": "bob", "password": REDACTED, "nested": [{"api_key": REDACTED}]}


def test_allowlist_keeps_listed_paths_only() -> None:
    allow = Allowlist(["lines[].ts", "lines[].message", "stats", "total"])
    value = {"lines": [{"ts": 1, "message": "m", "host": "h"}], "stats": {"a": {"b": 1}}, "total": 3,
             "internal": {"x": 1}}
    assert allow.apply(value) == {"lines": [{"ts": 1, "message": "m"}], "stats": {"a": {"b": 1}}, "total": 3}
    with pytest.raises(ValueError):
        Allowlist([])
