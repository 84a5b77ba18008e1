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
    "redis://:RedisS3cretPw@cache", "--password", "--", "password hunter2", "Secret", "KEY", "apiKey", "hunter2",
    "ASIAQWERTYUIOPASDFGH", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "Authorization: Token ", "Digest", "auth",
    "AUTH_HEADER", 'a="b c"', "\\\"", "'", "ASI", "tok", "pas",
)


def test_skipping_a_pattern_whose_literals_are_absent_changes_no_result() -> None:
    """scrub_text runs a pattern only when the text holds one of its literals; over texts built
    from secrets, near misses and separators, the result is the same as running every pattern."""
    import random

    from kortex.redaction import _PATTERNS, _scrub_assignments, _scrub_bare

    def every_pattern(text: str) -> str:
        for pattern, replacement, _literals, _fold in _PATTERNS:
            text = pattern.sub(replacement, text)
        return _scrub_bare(_scrub_assignments(text))

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


# Each leaked before: the audit of ingested telemetry, and its unconfirmed cases (db_password= and
# x-api-key: were scrubbed already, above).
_AUDITED_LEAKS = [
    ("cache connect failed redis://:RedisS3cretPw@cache:6379/0", "RedisS3cretPw"),
    ("worker started: /usr/bin/mysqldump --password=MyDumpPw99 --all-databases", "MyDumpPw99"),
    ('auth failed for password="correct horse battery staple"', "horse battery staple"),
    ("upstream call: Authorization: Token ghx9ABCDEF0123456789secretvalue", "ghx9ABCDEF"),
    ('Authorization: Digest username="bob", realm="api", response="6629fae49393a05397450978507c4ef1"', "6629fae4"),
    ("Proxy-Authorization: Negotiate YIIGhgYJKoZIhvcSAQICAQBuggZ1MIIGcaADAgEF", "YIIGhgYJ"),
    ('{"Authorization": "Token ghx9ABCDEF0123456789"}', "ghx9ABCDEF"),
    ("Authorization: Bearer short", "short"),  # under the 8 characters the Bearer pattern wants
    ('payload={\\"password\\": \\"EscapedPw123\\", \\"user\\": \\"bob\\"}', "EscapedPw123"),
    ("assumed role creds ASIAQWERTYUIOPASDFGH expire at 12:00", "ASIAQWERTYUIOPASDFGH"),
    ("creds ASIAQWERTYUIOPASDFGH wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("secret wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
    ("db dsn postgresql://app:pa/ssw0rd@db:5432/app", "pa/ssw0rd"),
    ("db dsn postgresql://app:p@ssw0rd@db:5432/app", "ssw0rd"),
    ("login failed, password hunter2 rejected", "hunter2"),
    ("PASSWORD Hunter2xyz", "Hunter2xyz"),
    ("mysqldump --password MyDumpPw99 --all-databases", "MyDumpPw99"),
    ("--verbose --api-key 0a1b2c3d4e5f", "0a1b2c3d4e5f"),
    ("auth_header=hunter2xyz", "hunter2xyz"),
    ("secret_header: hunter2xyz", "hunter2xyz"),
    ("x-auth-header: Token ghx9ABCDEF0123456789", "ghx9ABCDEF"),
    ("password='it is a secret'", "is a secret"),
    # a name inside another's value was stepped over with it
    ("callback_url=https://api.example.com/cb?access_token=tok123abc&lang=en", "tok123abc"),
    ('{"password": "ab\\"cd ef"}', "cd ef"),  # an escaped quote inside the value
]


@pytest.mark.parametrize("text,secret", _AUDITED_LEAKS)
def test_audited_leaks_are_scrubbed(text: str, secret: str) -> None:
    cleaned = scrub_text(text)
    assert secret not in cleaned and REDACTED in cleaned


@pytest.mark.parametrize("text,expected", [
    ("cache: redis://:RedisS3cretPw@cache:6379/0", "cache: redis://:[REDACTED]@cache:6379/0"),
    ("mysqldump --password=MyDumpPw99 --all-databases", "mysqldump --password=[REDACTED] --all-databases"),
    ('auth failed for password="correct horse battery staple" user=bob',
     'auth failed for password="[REDACTED]" user=bob'),
    ("Authorization: Digest username=\"u\", response=\"6629fae4\" status=401", "Authorization: [REDACTED] status=401"),
    ("Authorization: Bearer abcdefghijkl1234", "Authorization: [REDACTED]"),
    ("Authorization: YZq1X24931 user=bob", "Authorization: [REDACTED] user=bob"),  # no scheme: one word
    ('headers={"Authorization": "Token abc123", "Accept": "*/*"}',
     'headers={"Authorization": "[REDACTED]", "Accept": "*/*"}'),
    ('{\\"password\\": \\"EscapedPw123\\", \\"user\\": \\"bob\\"}',
     '{\\"password\\": \\"[REDACTED]\\", \\"user\\": \\"bob\\"}'),
    ("postgresql://app:pa/ssw0rd@db:5432/app", "postgresql://app:[REDACTED]@db:5432/app"),
    ("login failed, password hunter2. retrying", "login failed, password [REDACTED]. retrying"),
    ('msg="login ok password=hunter2 user=bob"', 'msg="login ok password=[REDACTED] user=bob"'),
    ("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
     "SignedHeaders=host;x-amz-date, Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe", "Authorization: [REDACTED]"),
])
def test_only_the_secret_goes(text: str, expected: str) -> None:
    assert scrub_text(text) == expected


@pytest.mark.parametrize("text", [
    "password reset failed for user bob",
    "Password Reset Failed for user 42",
    "password changed. user=bob",
    "secret rotation due in 3 days",
    'MountVolume.SetUp failed: secret "db-creds-2" not found',
    "secret db/prod/creds not found",
    "error: option --password requires an argument",
    "token bucket refilled, api key lookups at 2000/s",
    "authorization header missing",
    "https://social.example.com:8443/users/@alice posted",
    "http://[::1]:8080/x@y and http://[2001:db8::1]:9090/graph@x",  # IPv6 hosts, not passwords
    'level=error msg="upstream timeout after 5003ms" host=web-1',
    '{"ts": "2026-01-01T00:00:00Z", "route": "/api/v1/orders", "status": 504}',
    "auth_header_name=X-Auth-Token",
])
def test_prose_and_ordinary_values_stay_readable(text: str) -> None:
    assert scrub_text(text) == text


@pytest.mark.parametrize("text", [text for text, _secret in _AUDITED_LEAKS])
def test_scrubbing_twice_changes_nothing_more(text: str) -> None:
    once = scrub_text(text)
    assert scrub_text(once) == once


# Each repeated makes a pattern start over and over where it cannot match: an opening quote
# never closed, a URL with no "@", a secret's name with no value, a run of name characters...
_NEAR_MISSES = ['a="', "a='b=\\\"", 'a=\\"', 'a="\\\\', "x://u:", "x://:1/", "x://u:p/", "password ", "--password ",
                "password a!", "a-", "a", '"', "\\", ":", "=", "@", "authorization ", "secretkeytoken"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unit", _NEAR_MISSES)
def test_a_megabyte_of_near_misses_is_scrubbed_in_linear_time(unit: str) -> None:
    """Every pattern is linear: a line of 1 MB built to restart a scan at each of its
    characters (a quadratic one would take hours, not seconds) comes back whole."""
    text = unit * ((1 << 20) // len(unit))
    assert len(scrub_text(text)) == len(text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("unit,redacted", [
    ("x://u:p@", "x://u:[REDACTED]@"),
    ('password="a b" ', 'password="[REDACTED]" '),
    ("password hunter2 ", "password [REDACTED] "),
    ("Authorization: Token a=b,c=\"d\" ", "Authorization: [REDACTED] "),
    ('Authorization: Digest a="b", ', "Authorization: [REDACTED], "),
])
def test_a_megabyte_of_secrets_is_scrubbed_in_linear_time(unit: str, redacted: str) -> None:
    count = (1 << 20) // len(unit)
    assert scrub_text(unit * count) == redacted * count


@pytest.mark.parametrize("text", [
    "KeyError: 'currency' in price_v2.compute_quote",
    "TokenExpiredError: the session expired at 14:02",
    "builtins.KeyError: 'api_key' missing from the request",
    'raise AuthException: "login refused for user bob"',
])
def test_an_exception_class_is_not_a_secret_s_name(text: str) -> None:
    # The exception's message is the evidence (which key was missing), not a credential.
    assert not is_secret_key(text.split(":")[0].split()[-1])
    assert scrub_text(text) == text


def test_a_secret_after_an_exception_class_still_goes() -> None:
    cleaned = scrub_text("AuthError: login refused, password=hunter2xyz token: tok123abc456")
    assert "hunter2xyz" not in cleaned and "tok123abc456" not in cleaned
    assert cleaned.startswith("AuthError: login refused, password=")
