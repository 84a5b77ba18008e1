"""Secret scrubbing and allowlist redaction, applied before anything reaches a model, an audit
row or a log line."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

# ---- secret-looking names ------------------------------------------------------------------
# A name is split into words (snake, kebab, dotted and camelCase: "x-api-key", "awsSecretKey").
# It names a secret when a word is a credential word, or it contains one fused ("dbpassword"),
# or it is a key of something that is not a plain index ("stripe_key", "api_key", but neither
# "sort_key" nor "monkey"); unless another word says the value only describes the secret
# ("password_min_length", "token_ttl", "auth_type"). Booleans and nulls are never secrets.
_SECRET_WORDS = frozenset(
    "pass passwd password passwords passphrase pwd pw secret secrets token auth oauth authorization "
    "credential credentials cookie cookies webhook webhooks private privkey signature sig session sessionid "
    "jwt otp apikey bearer csrf xsrf hmac salt dsn".split())
_FUSED = ("password", "passwd", "passphrase", "secret", "credential", "apikey", "accesskey", "privatekey",
          "authtoken", "accesstoken", "refreshtoken", "sessiontoken", "webhook", "cookie")
_KEY_WORDS = frozenset({"key", "keys"})
# With "key": words of indexes and identifiers, whose keys are data, not credentials.
_PLAIN_KEYS = frozenset(
    "primary partition sort foreign cache shard routing group public idempotency dedup dedupe lookup hash "
    "index unique composite natural surrogate row column field label metric object bucket message event "
    "map dict sequence order".split())
# Words that make the value a property of a secret rather than the secret.
_DESCRIPTIVE = frozenset(
    "count length len size ttl timeout duration enabled disabled required type expiry expires expiration max "
    "min limit policy mode algorithm alg version rotation strength format name names header id_type "
    "path file location".split())
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")


@functools.lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """Whether a field or parameter called ``name`` holds a credential."""
    words = [w.lower() for w in _WORD.findall(name)]
    if not words or any(w in _DESCRIPTIVE for w in words):
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    fused = "".join(words)
    if any(f in fused for f in _FUSED):
        return True
    return any(w in _KEY_WORDS for w in words) and not any(w in _PLAIN_KEYS for w in words)


# ---- secret-looking text -------------------------------------------------------------------
# Each pattern with the literals one of which any match must contain, and whether they are
# looked for in the lower-cased text. Scrubbing runs on every string of every conversation a
# cloud model is sent, most of them a word or a number: a pattern whose literals are absent
# cannot match, so it is not run (a search for a literal costs a small fraction of a regex
# pass). A folded literal has only letters that nothing but themselves folds to under (?i):
# "basic" would miss "baſic" and "basıc", which the pattern matches, so it is "ba". A
# replacement leaves "[REDACTED]" where text was, which holds no literal and parts its
# neighbours, so it cannot bring in a literal the text did not have.
_PATTERNS: tuple[tuple[re.Pattern[str], str, tuple[str, ...], bool], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED, ("bearer", "ba"), True),
    # user:password@ in any URL or DSN
    # (the scheme starts at a word boundary and is short: otherwise every letter of a long word
    # would start a scan to its end, quadratic in the text)
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]{0,31}://[^\s:/@]+:)[^\s@/]+@"), r"\1" + REDACTED + "@", ("://",), False),
    # webhook URLs carry their credential in the path
    (re.compile(r"(?i)(https?://hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s\"'<>]+"), r"\1" + REDACTED,
     ("hook",), True),
    (re.compile(r"(?i)(https?://(?:[\w-]+\.)*discord(?:app)?\.com/api/webhooks/)[^\s\"'<>]+"), r"\1" + REDACTED,
     ("hook",), True),
    (re.compile(r"(?i)(https?://[^\s/\"'<>]+(?:/[^\s/?#\"'<>]+)*/(?:webhooks?|hooks)/)[^\s?#\"'<>]+"),
     r"\1" + REDACTED, ("hook",), True),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED, ("AKIA",), False),
    (re.compile(r"\bsk-(?:ant-)?[A-Za-z0-9_-]{20,}\b"), REDACTED, ("sk-",), False),
    (re.compile(r"\b[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}\b"), REDACTED, ("k_live_", "k_test_"), False),  # Stripe
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), REDACTED, ("AIza",), False),  # Google API keys
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), REDACTED, ("xox",), False),  # Slack tokens
    (re.compile(r"\bkx_[0-9a-f]{12}_[A-Za-z0-9]{20,}\b"), REDACTED, ("kx_",), False),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), REDACTED, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), False),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}\b"), REDACTED, ("github_pat_",), False),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), REDACTED, ("eyJ",), False),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"), REDACTED,
     ("-----BEGIN ",), False),
)
# name=value, name: value, "name": "value", and query parameters (?token=...&sig=...)
# ("scheme://" is not an assignment: a URL's query parameters are looked at one by one)
_ASSIGNMENT = re.compile(r"""(?<![\w.-])([A-Za-z_][\w.-]{0,63})(["']?\s*(?:=|:(?!//))\s*["']?)([^\s"',;&}<>]+)""")


def _assignment(match: re.Match[str]) -> str:
    name, sep, value = match.groups()
    if value == REDACTED or not is_secret_key(name):
        return match.group(0)
    return f"{name}{sep}{REDACTED}"


def scrub_text(text: str) -> str:
    """Replace credential-shaped substrings."""
    folded = text.lower()
    for pattern, replacement, literals, fold in _PATTERNS:
        haystack = folded if fold else text
        for literal in literals:  # a loop, not any(): a generator costs more than the lookups
            if literal in haystack:
                text = pattern.sub(replacement, text)
                break
    if "=" in text or ":" in text:
        text = _ASSIGNMENT.sub(_assignment, text)
    return text


def scrub(value: Any) -> Any:
    """Scrub every string in a JSON-like value; values under secret-named keys are dropped
    (whole subtrees included), except booleans and nulls, which cannot leak one."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and is_secret_key(k) and not _harmless(v) else scrub(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def _harmless(value: Any) -> bool:
    return value is None or isinstance(value, bool)


class Allowlist:
    """Output fields a tool may return, as paths: ``stats`` keeps a whole subtree,
    ``lines[].message`` keeps one field of every list item. Anything else is removed."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = frozenset(paths)
        if not self.paths:
            raise ValueError("an allowlist needs at least one path")
        self._ancestors = set()
        for path in self.paths:
            parts = _split(path)
            for i in range(1, len(parts)):
                self._ancestors.add(_join(parts[:i]))

    def apply(self, value: Any) -> Any:
        return self._walk(value, "")

    def _walk(self, value: Any, path: str) -> Any:
        if path and path in self.paths:
            return scrub(value)
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                if child in self.paths or child in self._ancestors:
                    out[key] = self._walk(item, child)
            return out
        if isinstance(value, list):
            child = f"{path}[]"
            if child in self.paths:
                return scrub(value)
            if child in self._ancestors:
                return [self._walk(item, child) for item in value]
            return []
        return scrub(value) if path in self._ancestors else None


_TOKEN = re.compile(r"\[\]|[^.\[\]]+")


def _split(path: str) -> list[str]:
    """``lines[].message`` -> ``["lines", "[]", "message"]``."""
    return _TOKEN.findall(path)


def _join(parts: list[str]) -> str:
    out = ""
    for part in parts:
        if part == "[]":
            out += "[]"
        else:
            out = f"{out}.{part}" if out else part
    return out
