"""Secret scrubbing and allowlist redaction, applied before anything reaches a model, an audit
row or a log line."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

_SECRET_KEYS = re.compile(
    r"(?i)^(password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|api[_-]?key|"
    r"authorization|cookie|set-cookie|private_key|credentials?)$"
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (re.compile(r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|authorization)(\"?\s*[=:]\s*\"?)"
                r"[^\s\"',;&]+"), r"\1\2" + REDACTED),
    (re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+@"), r"\1" + REDACTED + "@"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bsk-(?:ant-)?[A-Za-z0-9_-]{20,}\b"), REDACTED),
    (re.compile(r"\bkx_[0-9a-f]{12}_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), REDACTED),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"), REDACTED),
)


def scrub_text(text: str) -> str:
    """Replace credential-shaped substrings."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrub(value: Any) -> Any:
    """Scrub every string in a JSON-like value; values under secret-named keys are dropped."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and _SECRET_KEYS.match(k) else scrub(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


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
