"""The LogQL subset ``get_logs.query`` accepts, parsed into a filter every log source applies.

    query     := plain-text | [selector] stage*
    selector  := "{" matcher ("," matcher)* "}"          labels: host, level, trace_id
    matcher   := label ("=" | "!=" | "=~" | "!~") string
    stage     := ("|=" | "!=" | "|~" | "!~") string       line contains / lacks / matches
    string    := "..." (backslash escapes) | `...` (raw)

Plain text (no selector, no operator) keeps its old meaning: the message contains it, ignoring
case. ``|=`` and ``!=`` are case-sensitive as in LogQL; regexes are RE2 (``kortex.regex``: linear time, no backreferences
or lookarounds) and may start with ``(?i)``. Regex matchers on labels are anchored, line regexes
are not (LogQL semantics).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kortex.errors import InvalidInput
from kortex.regex import MAX_PATTERN, anchored, compile_pattern

LABELS = ("host", "level", "trace_id")
MAX_QUERY = 500
MAX_REGEX = MAX_PATTERN
MAX_STAGES = 10

_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MATCH_OPS = ("=~", "!~", "!=", "=")
_LINE_OPS = ("|=", "!=", "|~", "!~")


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True, slots=True)
class LineFilter:
    op: str
    value: str

    @property
    def negated(self) -> bool:
        return self.op.startswith("!")

    @property
    def regex(self) -> bool:
        return self.op.endswith("~")


@dataclass(frozen=True, slots=True)
class LogFilter:
    matchers: tuple[Matcher, ...] = ()
    lines: tuple[LineFilter, ...] = ()
    plain: str | None = None  # case-insensitive "contains"


def _check_regex(pattern: str, whole: bool = False) -> str:
    if len(pattern) > MAX_REGEX:
        raise InvalidInput(f"regex is longer than {MAX_REGEX} characters")
    # Label matchers run anchored, so the anchored form is the one that must compile.
    compile_pattern(anchored(pattern) if whole else pattern)
    return pattern


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def done(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.take(token):
            raise self.error(f"expected {token!r}")

    def one_of(self, tokens: tuple[str, ...]) -> str | None:
        for token in tokens:
            if self.take(token):
                return token
        return None

    def label(self) -> str:
        self.skip()
        match = _LABEL.match(self.text, self.pos)
        if not match:
            raise self.error("expected a label name")
        self.pos = match.end()
        return match.group(0)

    def string(self) -> str:
        self.skip()
        if self.pos >= len(self.text):
            raise self.error("expected a quoted string")
        quote = self.text[self.pos]
        if quote == "`":
            end = self.text.find("`", self.pos + 1)
            if end < 0:
                raise self.error("unterminated `string`")
            value = self.text[self.pos + 1:end]
            self.pos = end + 1
            return value
        if quote != '"':
            raise self.error('expected a "quoted" string')
        out, i = [], self.pos + 1
        while i < len(self.text):
            ch = self.text[i]
            if ch == "\\" and i + 1 < len(self.text):
                nxt = self.text[i + 1]
                out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
                i += 2
                continue
            if ch == '"':
                self.pos = i + 1
                return "".join(out)
            out.append(ch)
            i += 1
        raise self.error('unterminated "string"')

    def error(self, what: str) -> InvalidInput:
        return InvalidInput(f"query: {what} at position {self.pos} of {self.text!r}; use plain text or "
                            'LogQL such as {level="error"} |= "timeout" != "healthz"')


def parse(text: str | None) -> LogFilter | None:
    """Parse a query; None or blank means no filter. Bad input raises ``InvalidInput``."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if len(text) > MAX_QUERY:
        raise InvalidInput(f"query is longer than {MAX_QUERY} characters")
    if not text.startswith("{") and not any(text.startswith(op) for op in _LINE_OPS):
        return LogFilter(plain=text)
    reader = _Reader(text)
    matchers: list[Matcher] = []
    if reader.take("{"):
        while not reader.take("}"):
            if matchers:
                reader.expect(",")
            label = reader.label()
            if label not in LABELS:
                raise InvalidInput(f"query: label {label!r} is not supported; use {', '.join(LABELS)} "
                                   "(the product is the product argument)")
            op = reader.one_of(_MATCH_OPS)
            if op is None:
                raise reader.error("expected =, !=, =~ or !~")
            value = reader.string()
            if op.endswith("~"):
                _check_regex(value, whole=True)
            matchers.append(Matcher(label, op, value))
    lines: list[LineFilter] = []
    while not reader.done():
        op = reader.one_of(_LINE_OPS)
        if op is None:
            if reader.peek("|"):
                raise InvalidInput("query: only line filters (|=, !=, |~, !~) are supported after the selector; "
                                   "parsers such as | json are not")
            raise reader.error("expected |=, !=, |~ or !~")
        value = reader.string()
        if op.endswith("~"):
            _check_regex(value)
        lines.append(LineFilter(op, value))
        if len(lines) > MAX_STAGES:
            raise InvalidInput(f"query: at most {MAX_STAGES} line filters")
    return LogFilter(matchers=tuple(matchers), lines=tuple(lines))


def postgres_pattern(pattern: str) -> str:
    """RE2 syntax to PostgreSQL's: the only common escape that differs is the word boundary,
    ``\\b``/``\\B`` in RE2 and ``\\y``/``\\Y`` in PostgreSQL (where ``\\b`` is a backspace)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append({"b": "\\y", "B": "\\Y"}.get(nxt, char + nxt))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_logql(selector: dict[str, str], flt: LogFilter | None, extra: tuple[Matcher, ...] = ()) -> str:
    """A LogQL query for Loki: our fixed label matchers, the filter's, then its line filters."""
    parts = [f"{k}={_quote(v)}" for k, v in selector.items()]
    lines: list[LineFilter] = []
    if flt is not None:
        parts += [f"{m.label}{m.op}{_quote(m.value)}" for m in flt.matchers]
        lines = list(flt.lines)
        if flt.plain is not None:
            lines.append(LineFilter("|~", "(?i)" + re.escape(flt.plain)))
    parts += [f"{m.label}{m.op}{_quote(m.value)}" for m in extra]
    query = "{" + ",".join(parts) + "}"
    return query + "".join(f" {f.op} {_quote(f.value)}" for f in lines)
