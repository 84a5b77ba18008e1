"""Check a final answer against the turn that produced it: every citation must name a call of
this turn that succeeded, and every number it quotes should be found in a tool result.

Models are told to cite tool call ids in square brackets (``[call_ab12]``, or several as
``[call_a, call_b]``). A bracketed token counts as a citation when it is one of the turn's call
ids or looks like one (``call_…``, ``toolu_…``, ``fc_…``); Markdown links (``[text](url)``) and
ordinary bracketed words do not. A citation is *dangling* when it names no call of this turn
(an earlier turn's, or an invented one) or a call whose result was an error.

Numbers: each number in the answer (decimals, versions, percentages) must appear in the
question or in some tool result of the turn, as written, as a result's value rounded to the
answer's precision (2.6 for 2.6049), in seconds where the result has milliseconds or
microseconds, as a percentage where it has a ratio ("37%" for 0.373), or as the number of items
in one of a result's lists. Small counting words ("3 probes", "step 2") are left alone:
integers below 10 are not checked. What is not found is listed, not removed: the answer the
client saw stands, the flags say how far to trust it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kortex.llm.wire import dumps_text
from kortex.messages import AssistantMessage, Message, ToolMessage, UserMessage

_BRACKETS = re.compile(r"\[([^\[\]\n]{1,300})\](?!\()")
# One character after the prefix is enough: a model that invents "[call_1]" cites nothing real.
_ID_SHAPE = re.compile(r"^(?:call|toolu|tool|fc)_[A-Za-z0-9_\-]{1,120}\Z")
_SPLIT = re.compile(r"[\s,;]+")
# 1,234.5 · 2.60 · v2.14.0 · 99.9% · 503 · 9.3x · 200ms (a unit may follow; not inside a word or an id)
_NUMBER = re.compile(r"(?<![\w.\-/])v?(\d{1,3}(?:,\d{3})+|\d+)((?:\.\d+)*)(?![\d])")
_DIGITS = re.compile(r"\d+")
_PERCENT = re.compile(r"\s?%")
MAX_LISTED = 50


@dataclass(frozen=True, slots=True)
class Citation:
    id: str
    tool: str | None  # None: no call of this turn has this id
    ok: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "ok": self.ok}


@dataclass(frozen=True, slots=True)
class Grounding:
    citations: list[Citation] = field(default_factory=list)
    uncited_numbers: list[str] = field(default_factory=list)

    @property
    def dangling(self) -> list[str]:
        return [c.id for c in self.citations if not c.ok]

    @property
    def grounded(self) -> bool:
        return not self.dangling and not self.uncited_numbers

    def summary(self) -> dict[str, Any]:
        return {"cited": sum(1 for c in self.citations if c.ok), "dangling": self.dangling,
                "uncited_numbers": self.uncited_numbers}

    def as_dict(self) -> dict[str, Any]:
        """What the stored message keeps: the citations and the summary."""
        return {"citations": [c.as_dict() for c in self.citations], **self.summary()}


@dataclass
class _Turn:
    question: str = ""
    tools: dict[str, str] = field(default_factory=dict)   # call id -> tool name
    ok: dict[str, bool] = field(default_factory=dict)     # call id -> its result was not an error
    # each result's content as stored: read as text (and its lists counted) only when the answer
    # quotes a number to look for
    results: list[Any] = field(default_factory=list)


def _this_turn(history: Sequence[Message]) -> _Turn:
    last_user = max((i for i, m in enumerate(history) if isinstance(m, UserMessage)), default=-1)
    turn = _Turn(question=history[last_user].content if last_user >= 0 else "")  # type: ignore[union-attr]
    for message in history[last_user + 1:]:
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                turn.tools[call.id] = call.name
        elif isinstance(message, ToolMessage):
            result = message.result
            turn.ok[result.call_id] = not result.is_error
            turn.results.append(result.content)
    return turn


def _count_lists(value: Any, out: set[float], depth: int = 0) -> None:
    """"12 deploys" counts a result's list: the count is in the result though no digit is."""
    if depth > 8:
        return
    if isinstance(value, list):
        out.add(float(len(value)))
        for item in value[:1000]:
            _count_lists(item, out, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _count_lists(item, out, depth + 1)


def citations(answer: str, history: Sequence[Message]) -> list[Citation]:
    turn = _this_turn(history)
    return _citations(answer, turn)


def _citations(answer: str, turn: _Turn) -> list[Citation]:
    seen: dict[str, Citation] = {}
    for match in _BRACKETS.finditer(answer):
        for token in _SPLIT.split(match.group(1).strip()):
            token = token.strip("`'\"")
            if not token or token in seen or not (token in turn.tools or _ID_SHAPE.match(token)):
                continue
            seen[token] = Citation(id=token, tool=turn.tools.get(token), ok=turn.ok.get(token, False))
    return list(seen.values())


def _numbers_in(text: str) -> set[str]:
    return {m.group(0).lstrip("v").replace(",", "") for m in _NUMBER.finditer(text)}


def _percents_in(text: str) -> set[str]:
    """The numbers written as a percentage ("37%", "6.5 %")."""
    return {m.group(0).lstrip("v").replace(",", "") for m in _NUMBER.finditer(text)
            if _PERCENT.match(text, m.end())}


def uncited_numbers(answer: str, history: Sequence[Message]) -> list[str]:
    return _uncited(answer, _this_turn(history))


def _uncited(answer: str, turn: _Turn) -> list[str]:
    # Citation ids carry digits of their own: take them out before looking for numbers.
    text = _BRACKETS.sub(" ", answer)
    # Small counting words ("3 probes", "step 2") are never checked: an answer quoting nothing
    # else is done before any tool result is read (results are the big part of the work).
    tokens = [t for t in sorted(_numbers_in(text), key=text.find) if not _counting(t)]
    if not tokens:
        return []
    written: set[str] = set()
    values: set[float] = set()
    sources = [turn.question]
    for content in turn.results:
        _count_lists(content, values)
        sources.append(content if isinstance(content, str) else dumps_text(content))  # as the model read it
    for source in sources:
        numbers = _numbers_in(source)
        # Every digit run of a result counts as written there: an answer's "14:31 UTC" quotes
        # the 14 and 31 of a result's "2026-04-07T14:31:02Z", where no number stands alone.
        written |= numbers
        written.update(_DIGITS.findall(source))
        for token in numbers:
            if token.count(".") <= 1:
                try:
                    values.add(float(token))
                except ValueError:
                    pass
    # Units the writers convert: milliseconds and microseconds quoted as seconds ("3.9 s" for
    # a result's 3900 ms, "2.7 s" for 2734000 µs).
    scaled = values | {v / 1000 for v in values} | {v / 1_000_000 for v in values}
    percents: set[str] | None = None
    missing: list[str] = []
    for token in tokens:
        if token in written:
            continue
        if token.count(".") <= 1:
            number = float(token)
            decimals = len(token.split(".")[1]) if "." in token else 0
            if any(round(v, decimals) == number for v in scaled):
                continue
            # A ratio quoted as a percentage ("37%" for an error_rate of 0.373); only where the
            # answer writes "%", so a bare 37 is not found in every 0.37 of the results.
            if percents is None:
                percents = _percents_in(text)
            if token in percents and any(round(v * 100, decimals) == number for v in values):
                continue
        missing.append(token)
        if len(missing) >= MAX_LISTED:
            break
    return missing


def _counting(token: str) -> bool:
    """An integer below 10 written without a decimal point: a counting word, not quoted data."""
    return "." not in token and float(token) < 10


def successful_calls(history: Sequence[Message]) -> list[Citation]:
    """The calls of the turn an answer may cite: those whose result was not an error."""
    turn = _this_turn(history)
    return [Citation(id=call_id, tool=tool, ok=True) for call_id, tool in turn.tools.items() if turn.ok.get(call_id)]


def check(answer: str, history: Sequence[Message], *, numbers: bool = True) -> Grounding:
    """The answer's citations and the numbers it quotes from nowhere."""
    turn = _this_turn(history)
    return Grounding(citations=_citations(answer, turn), uncited_numbers=_uncited(answer, turn) if numbers else [])


__all__ = ["Citation", "Grounding", "check", "citations", "successful_calls", "uncited_numbers"]
