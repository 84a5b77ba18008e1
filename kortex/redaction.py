"""Secret scrubbing and allowlist redaction, applied before anything reaches a model, an audit
row or a log line."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kortex.nesting import MAX_DEPTH
from kortex.text import storable

REDACTED = "[REDACTED]"

# ---- secret-looking names ------------------------------------------------------------------
# A name is split into words (snake, kebab, dotted and camelCase: "x-api-key", "awsSecretKey").
# It names a secret when a word is a credential word, or it contains one fused ("dbpassword"),
# or it is a key of something that is not a plain index ("stripe_key", "api_key", but neither
# "sort_key" nor "monkey"); unless another word says the value only describes the secret
# ("password_min_length", "token_ttl", "auth_type"). Booleans and nulls are never secrets.
# "header" is not such a word: "auth_header" and "secret_header" hold the header's value.
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
    "min limit policy mode algorithm alg version rotation strength format name names id_type "
    "path file location".split())
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# The last word of an exception's class: "KeyError: 'currency'" names the missing key, the
# evidence an operator needs, and "InvalidTokenError: expired" is a message, not a token.
_EXCEPTION_WORDS = frozenset({"error", "exception"})


@functools.lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """Whether a field or parameter called ``name`` holds a credential."""
    words = [w.lower() for w in _WORD.findall(name)]
    if not words or any(w in _DESCRIPTIVE for w in words) or words[-1] in _EXCEPTION_WORDS:
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    fused = "".join(words)
    if any(f in fused for f in _FUSED):
        return True
    return any(w in _KEY_WORDS for w in words) and not any(w in _PLAIN_KEYS for w in words)


# ---- secret-looking text -------------------------------------------------------------------
# What a URL's password holds after its first "/" or "@" (see _PATTERNS).
_URL_PART = r"""[^\s@/"'<>{}\[\](),;]"""
# One parameter of an Authorization header, name=value or name="value" (JSON-escaped too).
_AUTH_PARAM = r"""[\w-]+=(?:\\{0,3}"[^"\r\n]*"|[^\s,"'\\{}\[\]()<>&]+)"""

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
    # An Authorization header's whole value, whatever its scheme: "Token <t>", "Digest username=..,
    # response=..", "AWS4-HMAC-SHA256 Credential=.., Signature=..", a "Bearer <t>" too short for
    # the pattern above. After that one: a credential here stops at brackets, quotes and "&", so
    # it does not take in a neighbour's name or the "Bearer" it looks for; and a scheme is a
    # word, not a raw key, whose next word would be another field's ("YZq1X2 user=bob").
    # A value of one word, a raw key with no scheme, is left to the name=value rule below.
    (re.compile(r"""(?ix)
        ((?:authorization|auth[_-]?header)(?:\\{0,3}["'])?[ \t]*[:=][ \t]*(?:\\{0,3}["'])?)
        [a-z]{2,31}[0-9]?(?:-[a-z0-9]+){0,4}[ \t]+  # the scheme
        (?:""" + _AUTH_PARAM + r"""(?:[ \t]*,[ \t]*""" + _AUTH_PARAM + r""")*  # Digest, AWS4-HMAC-SHA256
           |\[REDACTED]  # a Bearer or Basic credential, replaced above
           |[^\s"',;<>\\{}\[\]()&]+)  # a token"""), r"\1" + REDACTED, ("auth",), True),
    # user:password@ in any URL or DSN, the user possibly empty (redis://:pw@cache). The password
    # may hold an unescaped "/" or "@" (pa/ss, p@ss): it runs to the last "@" before the host,
    # but not past a "//" (another URL), and after its first "/" or "@" not past a quote,
    # bracket, "," or ";" either (there it would take in the next field's name, and leave its
    # value as the host); and it does not start with a port and a path (https://host:8080/a/@b).
    # A user part holds no "[": that opens an IPv6 host (http://[::1]:8080/x@y has no password).
    # (the scheme starts at a word boundary and is short: otherwise every letter of a long word
    # would start a scan to its end, quadratic in the text; the password's scan stops at the next
    # "//", whitespace or "@", so scans from different URLs do not overlap)
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]{0,31}://[^\s:/@\[]*:)(?!\d{1,5}/)(?=[^\s@])"
                r"[^\s@/]*+(?:(?:/(?!/)|@(?=" + _URL_PART + r"*+@))" + _URL_PART + r"*+)*+@"),
     r"\1" + REDACTED + "@", ("://",), False),
    # webhook URLs carry their credential in the path
    (re.compile(r"(?i)(https?://hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s\"'<>]+"), r"\1" + REDACTED,
     ("hook",), True),
    (re.compile(r"(?i)(https?://(?:[\w-]+\.)*discord(?:app)?\.com/api/webhooks/)[^\s\"'<>]+"), r"\1" + REDACTED,
     ("hook",), True),
    (re.compile(r"(?i)(https?://[^\s/\"'<>]+(?:/[^\s/?#\"'<>]+)*/(?:webhooks?|hooks)/)[^\s?#\"'<>]+"),
     r"\1" + REDACTED, ("hook",), True),
    # AWS access key ids: long-term (AKIA) and temporary, from STS (ASIA); a secret access key
    # (40 characters of base64) has no shape of its own, but right after its key id it is one
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}(?:[\s:,;|]+[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])|\b)"), REDACTED,
     ("AKIA", "ASIA"), False),
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

# name=value, name: value, "name": "value", --name=value, query parameters (?token=...&sig=...)
# and the same JSON-escaped inside a string ({\"password\": \"...\"}).
# ("scheme://" is not an assignment: a URL's query parameters are looked at one by one)
# The pattern finds a name and its separator; the value is read (_VALUE) only after a secret's
# name, and the search goes on from the separator: a value may hold names of its own
# (msg="login ok password=hunter2", url=https://host/?token=...), which stepping over it misses.
# (A name cannot be followed by a name character, so its run is not backtracked into:
# possessive.)
_ASSIGNMENT = re.compile(r"""(?<![\w.-])(-{0,2}+[A-Za-z_][\w.-]{0,63}+)(?:\\{0,3}["'])?\s*+(?:=|:(?!//))\s*+""")
# A quoted value is taken whole, up to its closing quote on the line ("correct horse battery
# staple"); a quote after a backslash is an escaped one, inside the value. Else one word.
# (A quoted value's scan stops at the first closing quote of its kind, which no other name's
# opening quote can be inside of: scans do not overlap, and reading values stays linear.)
_VALUE = re.compile(r"""
    "(?P<dq>(?:[^"\\\r\n]++|\\.)*+)"
  | '(?P<sq>(?:[^'\\\r\n]++|\\.)*+)'
  | (?P<quote>\\{1,3}["'])(?P<eq>[^\r\n]*?)(?<!\\)(?P=quote)  # JSON-escaped
  | (?:\\{0,3}["'])?(?P<word>[^\s"',;&}<>]+)""", re.VERBOSE)

# A secret's name and its value with only a space between: "password hunter2", "secret
# wJalrXUtnFEMI/K7MDENG", "--password MyDumpPw99". Only a name that says credential outright or a
# command-line flag (_STRONG_NAME), and only a value that looks like a secret (_looks_secret):
# prose says "password reset failed for user", whose next word is a word.
# It is matched in the lower-cased text, from the credential word on (a case-insensitive
# pattern, or one that tries each word as the start of a name, costs several times more on
# every line that merely says "key"); the start of the name is found by looking back.
_BARE = re.compile(r"""(?P<stem>(?:--[a-z]|pass|secret|key|token)[\w.-]{0,40}+)[ \t]+(?P<value>[^\s"'<>,;&}=\[]+)""",
                   re.ASCII)
_BARE_LITERALS = ("pass", "secret", "key", "token", "--")
_STRONG_NAME = re.compile(r"""pass(?:word|wd|phrase)|secret
    |(?:api|access|private|signing|encryption|master|client)[._-]?key
    |(?:access|refresh|auth|session|api|id|bearer)[._-]?token""", re.VERBOSE)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_MAX_NAME = 64
# Characters a password has and a word of prose does not; not "-", "_", ".", "/" or ":", which
# names and paths have too ("secret db/prod/creds" names a secret, it is not one).
_PASSWORD_SYMBOLS = frozenset("!@#$%^&*+~|\\?")


def _looks_secret(word: str) -> bool:
    """A digit, a password symbol or a capital inside lower case: "hunter2", "wJalrXUtnFEMI";
    not "reset", "Reset", "OK" or "changed"."""
    return len(word) >= 6 and (
        any(c.isdigit() or c in _PASSWORD_SYMBOLS for c in word)
        or (any(c.islower() for c in word) and any(c.isupper() for c in word[1:])))


def _scrub_assignments(text: str) -> str:
    parts: list[str] = []
    done = 0
    for match in _ASSIGNMENT.finditer(text):
        # (a name inside a value already replaced is gone with it)
        if match.end() < done or not is_secret_key(match.group(1)):
            continue
        value = _VALUE.match(text, match.end())
        if value is None:
            continue
        group = value.lastgroup or "word"  # the one of dq, sq, eq and word that matched
        if value.group(group) in ("", REDACTED):
            continue
        parts += (text[done:value.start(group)], REDACTED)
        done = value.end(group)
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _scrub_bare(text: str) -> str:
    folded = text.lower()
    if len(folded) != len(text):  # a letter that lower-cases to two ("İ"): keep positions aligned
        folded = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    parts: list[str] = []
    done = pos = 0
    while (match := _BARE.search(folded, pos)) is not None:
        # A value that is kept may be a name of its own ("password secret_key wJalrXUtnFEMI"):
        # the search goes on from it, not after it.
        pos = value_start = match.start("value")
        start = match.start()
        while start > 0 and folded[start - 1] in _NAME_CHARS and match.start() - start < _MAX_NAME:
            start -= 1
        if start > 0 and folded[start - 1] in _NAME_CHARS:
            continue  # a long run of name characters, a path or a blob, not a name
        stem_end = match.end("stem")
        secret = text[value_start:match.end("value")].rstrip(".!?)")  # the sentence's punctuation
        if (_looks_secret(secret) and is_secret_key(text[start:stem_end])
                and (folded.startswith("--", start) or _STRONG_NAME.search(folded, start, stem_end))):
            parts += (text[done:value_start], REDACTED)
            done = pos = value_start + len(secret)
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


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
        text = _scrub_assignments(text)
    for literal in _BARE_LITERALS:
        if literal in folded:
            text = _scrub_bare(text)
            break
    return text


def scrub(value: Any, _depth: int = 0) -> Any:
    """Scrub every string in a JSON-like value (made storable too: a NUL or a lone surrogate a
    remote source sent becomes U+FFFD, where PostgreSQL would refuse the whole result, and a
    tool call would wait for the watchdog); values under secret-named keys are dropped
    (whole subtrees included), except booleans and nulls, which cannot leak one. Any depth:
    past ``MAX_DEPTH`` (more than anything Kortex takes in nests) a subtree is walked without
    recursion, so deep data (a remote source's, a plugin's) cannot raise RecursionError here."""
    if isinstance(value, str):
        return scrub_text(storable(value))
    if isinstance(value, dict):
        if _depth >= MAX_DEPTH:
            return _scrub_deep(value)
        return {k: (REDACTED if isinstance(k, str) and is_secret_key(k) and not _harmless(v) else scrub(v, _depth + 1))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        if _depth >= MAX_DEPTH:
            return _scrub_deep(value)
        return [scrub(v, _depth + 1) for v in value]
    return value


def _scrub_deep(value: Any) -> Any:
    """``scrub`` with a stack of its own: each container is made empty and filled in place, in
    its order (a dict's keys are set first), so no level costs a frame. Slower than the
    recursion, hence only for what nests past ``MAX_DEPTH``."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, value)]
    while stack:
        into, at, item = stack.pop()
        if isinstance(item, str):
            into[at] = scrub_text(storable(item))
        elif isinstance(item, dict):
            out: dict[Any, Any] = {}
            into[at] = out
            for k, v in item.items():
                if isinstance(k, str) and is_secret_key(k) and not _harmless(v):
                    out[k] = REDACTED
                else:
                    out[k] = None
                    stack.append((out, k, v))
        elif isinstance(item, list | tuple):
            items: list[Any] = [None] * len(item)
            into[at] = items
            stack.extend((items, n, v) for n, v in enumerate(item))
        else:
            into[at] = item
    return root[0]


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

# ---- credentials known literally --------------------------------------------------------------
# Scrubbing by pattern misses a credential of no known shape (``corp-llm-7f3a...``), and an
# upstream that refuses one often quotes it back: the credentials a request carried are taken
# out of what it answered literally.

#: the shortest start of a credential taken out where a cut text ends with it: a few characters
#: of a key give nothing away, and fewer would blank the endings of ordinary words
MIN_SECRET_TAIL = 4


def request_secrets(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The credentials among a request's headers (``authorization``, ``x-api-key``, ...): the
    value, or its part after an auth scheme (``Bearer <key>``: the key)."""
    found = set()
    for name, value in headers.items():
        if not is_secret_key(name):
            continue
        scheme, _, credential = value.strip().partition(" ")
        secret = credential.strip() or scheme
        if secret:
            found.add(secret)
    return tuple(sorted(found, key=len, reverse=True))


def without_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced wherever it occurs, and where ``text`` was cut
    inside one (it ends with a secret's first ``MIN_SECRET_TAIL`` or more characters), that
    start too."""
    for secret in sorted(secrets, key=len, reverse=True):  # a key inside a longer one: the longer first
        if not secret:
            continue
        text = text.replace(secret, REDACTED)
        for n in range(min(len(secret), len(text)), MIN_SECRET_TAIL - 1, -1):
            if text.endswith(secret[:n]):
                text = text[:-n] + REDACTED
                break
    return text
