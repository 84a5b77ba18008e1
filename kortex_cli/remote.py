"""A small client for a running Kortex API (sessions, messages, SSE events)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx

from kortex.errors import KortexError


class RemoteClient:
    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0) -> None:
        self._client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                    headers={"Authorization": f"Bearer {api_key}"})

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def _check(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {}
            raise KortexError(f"HTTP {response.status_code}: {error.get('message') or response.text[:200]}")
        return response.json()

    def create_session(self, name: str, model: str | None) -> str:
        body: dict[str, Any] = {"name": name}
        if model:
            body["model"] = model
        return str(self._check(self._client.post("/v1/sessions", json=body))["id"])

    def post_message(self, session_id: str, content: str, model: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"content": content}
        if model:
            body["model"] = model
        return self._check(self._client.post(f"/v1/sessions/{session_id}/messages", json=body))  # type: ignore[no-any-return]

    def providers(self) -> dict[str, Any]:
        return self._check(self._client.get("/v1/llm/providers"))  # type: ignore[no-any-return]

    def events(self, events_url: str, last_event_id: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        with self._client.stream("GET", events_url, headers=headers, timeout=httpx.Timeout(30, read=None)) as r:
            if r.status_code >= 400:
                r.read()
                self._check(r)
            for event, _id, data in parse_sse(r.iter_lines()):
                yield event, json.loads(data)
                if event == "done":
                    return


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str | None, str]]:
    """(event, id, data) per SSE message; comments (heartbeats) are skipped."""
    event, eid, data = "message", None, list[str]()
    for line in lines:
        if line == "":
            if data:
                yield event, eid, "\n".join(data)
            event, eid, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "id":
                eid = value
            elif name == "data":
                data.append(value)
