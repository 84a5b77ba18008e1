from __future__ import annotations

import pytest

from kortex.redaction import REDACTED, Allowlist, is_secret_key, scrub, scrub_text


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


@pytest.mark.parametrize("name", [
    "password", "db_password", "DB_PASSWORD", "aws_secret_access_key", "x-api-key", "X-Api-Key", "stripe_key", "pass",
    "pwd", "webhook", "slack_webhook_url", "slackWebhookUrl", "apiKey", "APIKey", "privateKey", "private_key",
    "client_secret", "access_token", "refresh-token", "authToken", "Authorization", "set-cookie", "session_id",
    "X-Amz-Signature", "sig", "credentials", "dbpassword", "mysecret", "encryption_key", "license_key", "ssh_key",
    "orders_db.password", "key",
])
def test_secret_names_are_recognised_by_their_words(name: str) -> None:
    assert is_secret_key(name)
    assert scrub({name: "s3cr3t-value"}) == {name: REDACTED}


@pytest.mark.parametrize("name", [
    "monkey", "keyboard", "passport", "bypass", "compass", "author", "sort_key", "partition_key", "public_key",
    "cache_key", "max_tokens", "input_tokens", "password_min_length", "token_ttl", "auth_type", "api_key_name",
    "orders_db.pool.max_size", "routing_decision", "deployment_id", "version", "health",
])
def test_innocent_names_are_kept(name: str) -> None:
    assert not is_secret_key(name)
    assert scrub({name: "value"}) == {name: "value"}


def test_whole_secret_subtrees_go_and_flags_stay() -> None:
    config = {"db": {"credentials": {"user": "app", "password": "x"}, "host": "db1"}, "auth_enabled": True,
              "webhook": None, "pool": {"max_size": 10}}
    assert scrub(config) == {"db": {"credentials": REDACTED, "host": "db1"}, "auth_enabled": True, "webhook": None,
                             "pool": {"max_size": 10}}


@pytest.mark.parametrize("text,secret", [
    ("callback https://api.example.com/cb?user=bob&access_token=tok123abc&lang=en", "tok123abc"),
    ("GET /download?X-Amz-Signature=deadbeef0123&X-Amz-Date=20260101", "deadbeef0123"),
    ("azure https://acct.blob.core.windows.net/c/f?sv=2022&sig=AbCdEf%2Bgh", "AbCdEf%2Bgh"),
    ("maps https://maps.googleapis.com/api?key=AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIzaSyA-1234"),
    ("notify https://hooks.slack.com/services/T0001/B0001/XXXXXXXXXXXXXXXXXXXXXXXX", "XXXXXXXXXXXX"),
    ("discord https://discord.com/api/webhooks/1234567/abcDEF-ghiJKL", "abcDEF-ghiJKL"),
    ("posting to https://ci.example.com/generic-webhook/hooks/0a1b2c3d4e5f", "0a1b2c3d4e5f"),
    ("db_password=hunter2 retrying", "hunter2"),
    ('{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG"}', "wJalrXUtnFEMI"),
    ("header x-api-key: 0123456789abcdef", "0123456789abcdef"),
    ("stripe sk_live_0123456789abcdefABCD charged", "sk_live_0123"),
    ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890"),
])
def test_urls_and_assignments_with_credentials_are_scrubbed(text: str, secret: str) -> None:
    cleaned = scrub_text(text)
    assert secret not in cleaned and REDACTED in cleaned


def test_scrubbing_keeps_ordinary_assignments_and_times() -> None:
    text = "at 14:30:02 pool max_size=10 max_tokens=4096 ratio: 0.5 url=https://example.com/a?page=2&sort=asc"
    assert scrub_text(text) == text


_FRAGMENTS = (
    "Bearer eyJhbGciOi.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", "BEARER abcdefgh12345", "basic dXNlcjpwYXNz",
    "postgres://app:s3cr3t@db:5432/orders", "REDIS://:pw@cache", "HTTPS://HOOKS.SLACK.COM/services/T1/B2/XYZ",
    "https://Discord.com/api/webhooks/1/abc", "https://ci.example.com/a/WebHooks/0a1b2c", "AKIAIOSFODNN7EXAMPLE",
    "sk-ant-REDACTME0123456789abcdef", "rk_test_0123456789abcdefAB", "AIzaSyA-1234567890abcdefghijklmnopqrstu",
    "xoxp-1234567890-abc", "kx_0123456789ab_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123", "ghs_" + "a" * 30,
    "github_pat_" + "B" * 22, "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
    "password", "api_key", "token", "max_size", "checkout", "14:30:02", "ratio", "0.5", "[REDACTED]",
    "?access_token=", "&sig=", "https://example.com/a?page=2", "sk", "-", "AKI", "hoo", "k", "_live_",
)


def test_skipping_a_pattern_whose_literals_are_absent_changes_no_result() -> None:
    """scrub_text runs a pattern only when the text holds one of its literals; over texts built
    from secrets, near misses and separators, the result is the same as running every pattern."""
    import random

    from kortex.redaction import _ASSIGNMENT, _PATTERNS, _assignment

    def every_pattern(text: str) -> str:
        for pattern, replacement, _literals, _fold in _PATTERNS:
            text = pattern.sub(replacement, text)
        return _ASSIGNMENT.sub(_assignment, text)

    rng = random.Random(9)
    separators = (" ", "", "\n", "=", ": ", '"', "/", "@", ",")
    redacted = 0
    for _ in range(3000):
        parts = rng.choices(_FRAGMENTS, k=rng.randint(1, 6))
        text = "".join(part + rng.choice(separators) for part in parts)
        expected = every_pattern(text)
        assert scrub_text(text) == expected, text
        redacted += expected != text
    assert redacted > 1000  # the corpus does exercise the patterns


def test_a_folded_literal_is_found_in_every_text_its_pattern_matches() -> None:
    """A case-insensitive pattern also matches letters that are not the ASCII ones ("ſ" for s,
    "ı" and "İ" for i): each letter of its literals must be one that every such match
    lower-cases back to, or a text the pattern matches could skip it."""
    import re
    import sys

    from kortex.redaction import _PATTERNS

    every = "".join(map(chr, range(sys.maxunicode + 1)))
    for _pattern, _replacement, literals, fold in _PATTERNS:
        if not fold:
            continue
        for letter in set("".join(literals)):
            matched = re.findall("(?i)" + re.escape(letter), every)
            odd = [c for c in matched if c.lower() != letter]
            assert not odd, (literals, letter, odd)
    for text in ("Baſic dXNlcjpwYXNzd29yZA==", "basıc dXNlcjpwYXNzd29yZA==", "BASİC dXNlcjpwYXNzd29yZA=="):
        assert "dXNlcjpw" not in scrub_text(text)
