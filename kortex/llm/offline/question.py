"""Read an operator's question: which product, which symptom, which time window, whether it is
about the LLM platform, and any request or trace id it names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

SYMPTOM_WORDS: dict[str, tuple[str, ...]] = {
    "latency": ("slow", "latency", "p99", "p95", "lag", "laggy", "sluggish", "timeout", "timing out",
                "response time", "delay", "hang"),
    "errors": ("error", "errors", "failing", "fails", "failed", "failure", "500", "5xx", "exception",
               "crash", "down", "broken", "outage"),
}
_STOP = frozenset(
    "why what whats how when where who which is are was were be been the a an our my your their its it "
    "this that these those so very really too service services api app apps system prod production "
    "slow down failing broken today now right currently suddenly since there here with for in on of to "
    "from and or but not any some all getting seeing having being do does did can could should would "
    "please tell me us explain check look happened happening going wrong issue issues problem problems "
    "latency errors error p99 p95 hour hours minute minutes last past".split()
)
_PRODUCT_PATTERNS = (
    re.compile(r"\b(?:is|are|was|were|does|did|has|have)\s+(?:the\s+|our\s+)?([a-z0-9][a-z0-9._-]*)"
               r"(?:\s+(?:service|api|app))?\s+(?:so\s+|really\s+|very\s+)?(?:slow|down|failing|erroring|broken|"
               r"timing|returning|throwing|lagging|having|seeing|degraded|unhealthy|flaky|erroring)"),
    re.compile(r"\b([a-z0-9][a-z0-9._-]*)(?:\s+(?:service|api|app))?\s+(?:latency|errors?|p99|p95|outage|"
               r"slowness|timeouts?|failures?)\b"),
    # a lookahead, so "going on with the search service" can still match at "with"
    re.compile(r"(?=\b(?:for|in|on|of|with|from|about)\s+(?:the\s+|our\s+)?([a-z0-9][a-z0-9._-]*))"),
)
# Words that put a question on the LLM platform: a strong one is enough, weak ones need company.
LLM_STRONG = ("llm", "gpt", "llama", "claude", "mistral", "gemini", "qwen", "inference", "tokens", "language model",
              "model latency", "models")
LLM_WEAK = ("model", "backend", "backends", "deployment", "deployments", "tier", "premium", "budget users",
            "users", "routing", "router", "requests", "answers", "completions")
_LLM_REQUEST = re.compile(r"\b(req_[a-z0-9]{4,64})\b")
_TRACE = re.compile(r"\b(?:trace|request|correlation)(?:\s+id)?\s*[:#]?\s*([a-z0-9][a-z0-9._:-]{7,99})\b")
_HEX = re.compile(r"\b([0-9a-f]{16,32})\b")
_LAST = re.compile(r"\b(?:last|past)\s+(?:(\d+)\s*)?(m|min|mins|minutes?|h|hrs?|hours?|d|days?)\b")
_SINCE = re.compile(r"\bsince\s+(\d{1,2}):(\d{2})\b")


@dataclass(frozen=True, slots=True)
class Intent:
    product: str | None
    symptoms: tuple[str, ...]   # "latency", "errors"; both when unclear
    window: str                 # a time_range argument for the tools
    domain: str = "service"     # "service" | "llm"
    request_id: str | None = None  # an LLM request id (req_...)
    trace_id: str | None = None    # a trace or correlation id of a service request
    text: str = ""              # the question, lower case, for matching names found in evidence

    def mentions(self, name: str) -> bool:
        return bool(name) and re.search(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", self.text) is not None


def _product(text: str) -> str | None:
    for pattern in _PRODUCT_PATTERNS:
        for match in pattern.finditer(text):
            candidate = match.group(1).strip("._-")
            if candidate and candidate not in _STOP and not candidate.isdigit():
                return candidate
    return None


def _window(text: str) -> str:
    last = _LAST.search(text)
    if last:
        unit = last.group(2)[0]
        return f"last {last.group(1) or 1}{unit}"
    since = _SINCE.search(text)
    if since:
        hour, minute = int(since.group(1)), int(since.group(2))
        if hour < 24 and minute < 60:
            start = datetime.now(UTC).replace(hour=hour, minute=minute, second=0, microsecond=0)
            if start > datetime.now(UTC):
                start -= timedelta(days=1)
            return f"{start.strftime('%Y-%m-%dT%H:%M:%SZ')}/now"
    return "last 3h"


def _domain(text: str) -> str:
    words = set(re.findall(r"[a-z0-9_-]+", text))
    def has(w: str) -> bool:
        # Inside a hyphenated name a word counts only as a model's family before its size or
        # version (gpt-4, llama-70b); inference-gateway and tokens-api are services' names.
        return w in text if " " in w else w in words or any(
            x.startswith(w + "-") and x[len(w) + 1:len(w) + 2].isdigit() for x in words)
    if any(has(w) for w in LLM_STRONG) or sum(has(w) for w in LLM_WEAK) >= 2:
        return "llm"
    return "service"


def _ids(text: str) -> tuple[str | None, str | None]:
    request = _LLM_REQUEST.search(text)
    if request:
        return request.group(1), None
    trace = _TRACE.search(text) or _HEX.search(text)
    if trace and any(ch.isdigit() for ch in trace.group(1)):
        return None, trace.group(1)
    return None, None


def read_question(question: str) -> Intent:
    text = question.lower()
    symptoms = tuple(name for name, words in SYMPTOM_WORDS.items() if any(w in text for w in words))
    request_id, trace_id = _ids(text)
    domain = "llm" if request_id else _domain(text)
    product = _product(text)
    if trace_id and product == trace_id:
        product = None
    return Intent(product=product, symptoms=symptoms or ("latency", "errors"), window=_window(text), domain=domain,
                  request_id=request_id, trace_id=trace_id, text=text)
