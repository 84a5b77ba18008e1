"""A small SSE client for the integration tests."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import httpx

from kortex_cli.attempts import AttemptFilter
from kortex_cli.remote import parse_sse


@dataclass
class Event:
    event: str
    id: str | None
    data: dict[str, Any]


def read_events(url: str, key: str, *, last_event_id: str | None = None, stop_after: int | None = None,
                timeout: float = 30, comments: list[str] | None = None, raw: bool = False) -> list[Event]:
    """Read until ``done`` (or ``stop_after`` events); heartbeat comments go to ``comments``.
    Events of superseded step attempts are dropped as a client should, unless ``raw``."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    if last_event_id:
        headers["Last-Event-ID"] = last_event_id
    out: list[Event] = []
    timer = threading.Timer(timeout, lambda: None)
    timer.start()
    try:
        with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(timeout)) as response:
            response.raise_for_status()

            def lines():
                for line in response.iter_lines():
                    if line.startswith(":") and comments is not None:
                        comments.append(line)
                    yield line

            attempts = AttemptFilter()
            for event, eid, data in parse_sse(lines()):
                body = json.loads(data)
                if not raw and not attempts.accept(event, body):
                    continue
                out.append(Event(event, eid, body))
                if event == "done" or (stop_after is not None and len(out) >= stop_after):
                    break
    finally:
        timer.cancel()
    return out
