"""Rank candidate causes as an SRE would: a change that lands before the onset beats one that does
not, a cause that names one host, version or change beats a vague one, and a cause two kinds of
evidence point at (a logged campaign and a traffic metric that rose right after it) beats one only
a single source shows; among equals, a cause the logs name outright wins."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# What a metric measures, read from its name: first match wins.
METRIC_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"requests?_(rate|total|count|per)|\brps\b|qps|throughput|traffic", re.I), "incoming traffic"),
    (re.compile(r"file_descriptors|\bfds?\b", re.I), "open file descriptors"),
    (re.compile(r"memory|resident|heap|rss", re.I), "memory use"),
    (re.compile(r"cpu", re.I), "CPU use"),
    (re.compile(r"disk|volume|filesystem", re.I), "disk use"),
    (re.compile(r"queue|backlog|lag", re.I), "queue depth"),
    (re.compile(r"connections", re.I), "connections in use"),
    (re.compile(r"cache_hit", re.I), "cache hit ratio"),
    (re.compile(r"duration|latency|p99|p95", re.I), "latency"),
    (re.compile(r"error|fail|5xx", re.I), "failures"),
)
# Words in a log line or a logged change that speak of what a metric of that kind measures.
KIND_WORDS: dict[str, tuple[str, ...]] = {
    "incoming traffic": ("campaign", "traffic", "surge", "load", "shedding", "subscribers"),
    "open file descriptors": ("open files", "descriptor", "ulimit"),
    "memory use": ("memory", "oom", "heap", "leak"),
    "CPU use": ("cpu", "throttl"),
    "disk use": ("disk", "no space", "volume", "enospc"),
    "queue depth": ("queue", "backlog", "poison", "redeliver"),
    "connections in use": ("connection", "pool"),
    "cache hit ratio": ("cache", "ttl", "expired"),
    "latency": ("slow", "took", "timeout", "timed out"),
    "failures": ("fail", "error", "rejected"),
}


def kind_of(metric: str) -> str | None:
    return next((kind for pattern, kind in METRIC_KINDS if pattern.search(metric)), None)


def speaks_of(kind: str | None, text: str) -> bool:
    """Whether ``text`` (a log line, a logged change) is about what a metric of ``kind`` measures."""
    low = text.lower()
    return kind is not None and any(word in low for word in KIND_WORDS.get(kind, ()))


_COMPOUND = re.compile(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+|[a-z]{7,}")
_PART = re.compile(r"[a-z]{5,}")
_COMMON = frozenset("error errors failed request requests service upstream connection applied enabled disabled "
                    "started finished".split())


def _names(text: str) -> set[str]:
    found: set[str] = set()
    for name in _COMPOUND.findall(text.lower()):
        found.add(name)
        found.update(_PART.findall(name))  # invoice_lines_rework and ix_invoice_lines_id share "invoice"
    return found - _COMMON


def shared_names(a: str, b: str) -> set[str]:
    """Names two texts share (new_ranker, invoice_lines, a long word): one speaks of the other."""
    return _names(a) & _names(b)


@dataclass
class Hypothesis:
    cause: str                 # the cause in words, its evidence cited
    confirm: str               # what would confirm it
    precedes: bool             # a change that landed before the onset
    specific: bool             # names one host, version, flag or change
    sources: set[str] = field(default_factory=set)   # kinds of evidence that point at it
    kind: str = ""             # what it blames: deploy, change, dependency, logs, metric
    classified: bool = False   # names a known cause (evidence.CAUSES) the logs spell out

    @property
    def score(self) -> int:
        return 2 * self.precedes + self.specific + len(self.sources)


def rank(candidates: list[Hypothesis]) -> list[Hypothesis]:
    """Best first; among equals, one that names a known cause the logs spell out ("x509:
    certificate has expired") before one that only stands next to the onset, then the order
    the candidates were found in (stable sort)."""
    return sorted(candidates, key=lambda h: (-h.score, not h.classified))


__all__ = ["Hypothesis", "kind_of", "rank", "shared_names", "speaks_of"]
