"""Turn tool results into findings: the deploy nearest to a metric's step (the metric tools find
the step), the dominant error pattern in the logs and what it usually means."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True, slots=True)
class Cause:
    pattern: re.Pattern[str]
    name: str
    advice: str
    search: str        # what to look for in past incidents
    config_hint: str   # configuration keys worth quoting from /admin/info
    # Whether a deploy commonly brings it: a pool shrunk or a leak shipped, yes; a certificate
    # running out or a disk filling up comes with time, so a deploy near it is a coincidence
    # until something else ties the two.
    deployable: bool = True


# Log patterns and the cause they point to: policy as data, first match wins. Words are
# matched whole ("oom" is not in "room", "429" is not in "14290").
CAUSES: tuple[Cause, ...] = (
    # Before the timeouts and refusals: a handshake that fails on a certificate often says so
    # next to "connection" or "timed out" words of its own.
    Cause(re.compile(r"\bcert(?:ificate)?[ _]?(?:has |is )?(?:expired|not yet valid)|\bexpired (?:tls |ssl |x509 )?"
                     r"cert", re.I),
          "an expired TLS certificate",
          "renew the certificate the errors name (ours or the dependency's) and reload what serves it",
          "certificate expired", "cert", deployable=False),
    Cause(re.compile(r"\bx509\b|\bcertificate[ _]verify[ _]failed|\bunknown (?:certificate )?authority\b|"
                     r"\bself[ -]signed certificate\b|\bbad certificate\b", re.I),
          "a TLS certificate that fails verification",
          "find which certificate the errors name and whether its chain, issuer or host name is wrong",
          "certificate verify failed", "cert"),
    Cause(re.compile(r"\bpool (is )?exhausted|\bwaiting for a connection|\btoo many connections|\bconnection pool\b",
                     re.I),
          "database connection-pool exhaustion",
          "find what holds the connections (long transactions, leaks) and whether a change lowered the pool size",
          "connection pool exhausted", "pool"),
    Cause(re.compile(r"\bout of memory\b|\boom(?:[ _-]?killed)?\b|\bmemoryerror\b|\bheap space\b", re.I), "memory exhaustion",
          "check memory limits and recent changes in allocation; restart the affected hosts", "out of memory", "memory"),
    Cause(re.compile(r"\bdeadlock", re.I), "database deadlocks",
          "look at the transactions named in the deadlock reports and their lock order", "deadlock", "lock"),
    Cause(re.compile(r"\brate[ _-]?limit|\b429\b|\bthrottl", re.I), "upstream rate limiting",
          "lower the request rate or raise the quota with the upstream", "rate limit", "rate"),
    Cause(re.compile(r"\btimed?[ _-]?out", re.I), "upstream timeouts",
          "find which dependency is slow with traces and its own metrics", "timeout", "timeout"),
    Cause(re.compile(r"\bconnection refused\b|\bno route to host\b|\bname resolution\b|\bdns\b", re.I),
          "network or dependency outage", "check the health of the dependency named in the errors",
          "connection refused", "host"),
    Cause(re.compile(r"\bdisk full\b|\bno space left\b|\benospc\b|\bdisk quota exceeded\b", re.I), "disk full",
          "free disk space or grow the volume", "disk full", "disk", deployable=False),
)
# Who is behind a cause, when the log line says so.
CULPRITS: tuple[re.Pattern[str], ...] = (
    re.compile(r"held by (job [A-Za-z0-9_.-]+)"),
    re.compile(r"\b(job [A-Za-z0-9_.-]+)\b"),
)



def parse_ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def clock(ts: datetime) -> str:
    return ts.strftime("%H:%M UTC")


def fmt_value(value: float, unit: str | None) -> str:
    """A value as its result holds it, rounded: no unit conversion and no exponent (65,535, not
    6.55e+04), so a reader finds the number in the result it cites."""
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if unit == "ratio":
        return text
    return f"{text} {'s' if unit == 'seconds' else unit}" if unit else text


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def nearest_deploy(deploys: list[dict[str, Any]], onset: datetime) -> tuple[dict[str, Any], timedelta] | None:
    """The latest deploy that landed up to 30 minutes before the change (or 5 after)."""
    best = None
    for deploy in deploys:
        gap = onset - parse_ts(deploy["ts"])
        if timedelta(minutes=-5) <= gap <= timedelta(minutes=30) and (best is None or gap < best[1]):
            best = (deploy, gap)
    return best


def classify(text: str) -> Cause | None:
    return next((cause for cause in CAUSES if cause.pattern.search(text)), None)


def culprit(text: str) -> str | None:
    for pattern in CULPRITS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def fmt_ms(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.0f} ms"


def fmt_us(value: float) -> str:
    return fmt_ms(value / 1000)
