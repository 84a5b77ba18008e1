"""A small client for a running Kortex API (sessions, messages, SSE events)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from kortex.errors import InvalidInput, KortexError, NotFound


def refusal(response: httpx.Response, fields: Mapping[str, str] | None = None) -> KortexError:
    """The one line for an error response: the API's message and, for a refused request, each
    field it named with why (``fields`` renames them, e.g. to the command's options); a body
    that is not the API's error JSON says the URL is not a Kortex API rather than quoting it."""
    status = response.status_code
    error = _error_object(response)
    if error is None:
        return KortexError(not_kortex(response))
    details = error.get("details")
    text = with_fields(str(error.get("message") or error.get("code") or "no message"), details, fields)
    kind = NotFound if status == 404 else InvalidInput if status == 422 else KortexError
    return kind(f"HTTP {status}: {text}", code=str(error.get("code") or "") or None, details=details)


def with_fields(message: str, details: object, fields: Mapping[str, str] | None = None) -> str:
    """``message`` and each field that ``details`` (the API's list of ``field`` and ``message``)
    names, with why, on one line; ``fields`` renames them, e.g. to the command's options."""
    text = _one_line(message)
    named = [d for d in details if isinstance(d, dict) and d.get("field")] if isinstance(details, list) else []
    if not named:
        return text
    fields = fields or {}
    why = [_one_line(str(d.get("message") or "")) for d in named]
    said = "; ".join(f"{fields.get(str(d['field']), d['field'])}: {w}" for d, w in zip(named, why, strict=True))
    # A message that only repeats a field's (with or without the field's name) is said once.
    return said if any(w and w in text for w in why) else f"{text}: {said}"


def json_body(response: httpx.Response) -> Any:
    """A successful response's JSON; a body that is none says the URL is not a Kortex API."""
    try:
        return response.json()
    except ValueError:
        raise KortexError(not_kortex(response)) from None


def not_kortex(response: httpx.Response) -> str:
    kind = response.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    return f"not a Kortex API (HTTP {response.status_code}, {kind}): is --url the API's address?"


def _error_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


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
            raise refusal(response)
        return json_body(response)

    def new_session(self, name: str, model: str | None) -> NewSession:
        """A session to make (``NewSession.create``)."""
        return NewSession(self, name, model)

    def question(self, session_id: str, content: str, model: str | None) -> Question:
        """A question to post to the session (``Question.post``)."""
        return Question(self, session_id, content, model)

    def cancel_turn(self, turn_id: str) -> dict[str, Any]:
        # Short: it runs while the user waits to get their prompt back.
        return self._check(self._client.post(f"/v1/turns/{turn_id}/cancel", timeout=10.0))  # type: ignore[no-any-return]

    def delete_session(self, session_id: str) -> None:
        response = self._client.delete(f"/v1/sessions/{session_id}", timeout=10.0)
        if response.status_code >= 400:
            raise refusal(response)

    def providers(self) -> dict[str, Any]:
        return self._check(self._client.get("/v1/llm/providers"))  # type: ignore[no-any-return]

    def events(self, events_url: str, last_event_id: str | None = None,
               on_break: Callable[[str], None] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """The turn's events until ``done``. A connection that breaks first is opened again
        with the id of the last event read (``Last-Event-ID``), so nothing is lost and nothing
        comes twice; ``on_break`` hears why, once a break. Past ``RESUME_FOR`` seconds without an
        event the last error goes out."""
        patience = Patience(on_break)
        while True:
            try:
                for event, eid, data in self._events_once(events_url, last_event_id):
                    patience.mended()
                    if eid:
                        last_event_id = eid
                    yield event, json.loads(data)
                    if event == "done":
                        return
                return
            except (httpx.TransportError, _Unavailable, _EndedEarly) as exc:
                patience.failed(exc)

    def _events_once(self, events_url: str, last_event_id: str | None) -> Iterator[tuple[str, str | None, str]]:
        headers = {"Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        with self._client.stream("GET", events_url, headers=headers, timeout=httpx.Timeout(30, read=None)) as r:
            if r.status_code >= 400:
                r.read()
                if r.status_code in AGAIN:
                    raise _Unavailable(r, refusal(r))
                self._check(r)
            if r.status_code == 204:
                return  # a finished turn with nothing after last_event_id
            if not r.headers.get("content-type", "").startswith("text/event-stream"):
                raise KortexError(not_kortex(r))
            yield from parse_sse(r.iter_lines())
        # Only a stream that ended before its done gets here (the reader stops at done): a
        # stopping API ends its streams so, and a proxy may. The turn goes on: read on.
        raise _EndedEarly("the stream ended before the turn did")


#: How long what failed for a passing reason is tried again: an API restarting (its warm stop
#: and a new process's start take a few seconds) or a proxy cutting a long response.
RESUME_FOR = 60.0
#: Answers worth asking again: a proxy in front of an API that is restarting.
AGAIN = frozenset({502, 503, 504})


class Patience:
    """Tries again, with backoff, what fails for a passing reason; ``on_break`` hears why, once
    a break (not at every attempt to mend it). Past ``RESUME_FOR`` seconds the error goes out."""

    def __init__(self, on_break: Callable[[str], None] | None) -> None:
        self.on_break = on_break
        self.mended()

    def mended(self) -> None:
        self._since: float | None = None
        self._pause = 0.25

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
            if self.on_break is not None:
                self.on_break(_why(exc))
        if now - self._since >= RESUME_FOR:
            raise (exc.error if isinstance(exc, _Unavailable) else exc) from None
        time.sleep(self._pause)
        self._pause = min(self._pause * 2, 4.0)


def get_patiently(client: httpx.Client, url: str, on_break: Callable[[str], None] | None = None,
                  **kwargs: Any) -> httpx.Response:
    """``client.get(url)``, asked again while the API is out of reach (``Patience``): a GET
    changes nothing, so asking twice is safe."""
    patience = Patience(on_break)
    while True:
        try:
            response = client.get(url, **kwargs)
            if response.status_code in AGAIN:
                raise _Unavailable(response, refusal(response))
            return response
        except (httpx.TransportError, _Unavailable) as exc:
            patience.failed(exc)


class _EndedEarly(Exception):
    """An event stream that ended, properly, before its turn's ``done``."""


class _Unavailable(Exception):
    """An answer that says to ask again soon (a proxy before an API that is restarting)."""

    def __init__(self, response: httpx.Response, error: KortexError) -> None:
        super().__init__(str(error))
        self.status, self.error = response.status_code, error


def _why(exc: BaseException) -> str:
    if isinstance(exc, _Unavailable):
        return f"HTTP {exc.status}"
    if isinstance(exc, _EndedEarly):
        return str(exc)
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


class _Keyed:
    """A POST under an Idempotency-Key of its own. One cut short (Ctrl-C) leaves no answer, but
    the server may have done it all the same: sent again with its key, it comes back with what
    the first one made rather than a second one, so that can be undone, not left behind."""

    #: How long the repeat may take: it runs while the user waits to get their prompt back.
    AGAIN_TIMEOUT = 10.0
    #: Answers that refuse the request itself (the session, its content, a turn already running
    #: in it): the first send was refused as well, since what it made would be the answer.
    REFUSED = frozenset({400, 404, 409, 413, 422})

    def __init__(self, client: RemoteClient, path: str, body: dict[str, Any]) -> None:
        self._client, self._path, self._body = client, path, body
        self._key = uuid.uuid4().hex
        self.sent = False  # whether the server may have the request: its body started out

    def _answer(self) -> Any:
        return self._client._check(self._send(None))

    def _answer_again(self) -> Any:
        """After a send cut short: the server's answer, asked again, or None when the first
        cannot have made anything (nothing of it left this process, or the server refuses it)."""
        if not self.sent:
            return None
        response = self._send(self.AGAIN_TIMEOUT)
        if response.status_code in self.REFUSED:
            return None
        return self._client._check(response)

    def _send(self, timeout: float | None) -> httpx.Response:
        return self._client._client.post(
            self._path, json=self._body, headers={"Idempotency-Key": self._key},
            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout, extensions={"trace": self._trace})

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        # httpcore's events ("http11.send_request_body.started"): until the body starts out, the
        # server has nothing to act on, and a Ctrl-C has nothing to undo.
        if event.endswith("send_request_body.started"):
            self.sent = True


class NewSession(_Keyed):
    """A session to make. Made, but its answer cut off, it is found again (``made_if_asked``)
    so that the command can delete it rather than leave it empty, named after its question."""

    def __init__(self, client: RemoteClient, name: str, model: str | None) -> None:
        super().__init__(client, "/v1/sessions", {"name": name, **({"model": model} if model else {})})

    def create(self) -> str:
        """The session's id."""
        return str(self._answer()["id"])

    def made_if_asked(self) -> str | None:
        """After a creation cut short: the id of the session it made, or None when it cannot
        have made one."""
        answer = self._answer_again()
        return None if answer is None else str(answer["id"])


class Question(_Keyed):
    """A question to post: cut short, the turn it may have made is found again
    (``turn_if_asked``), so that the turn can be cancelled, not left to run."""

    def __init__(self, client: RemoteClient, session_id: str, content: str, model: str | None) -> None:
        super().__init__(client, f"/v1/sessions/{session_id}/messages",
                         {"content": content, **({"model": model} if model else {})})

    def post(self) -> dict[str, Any]:
        """The server's answer: the turn (``turn_id``, ``session_id``, ``events_url``)."""
        return self._answer()  # type: ignore[no-any-return]

    def turn_if_asked(self) -> str | None:
        """After a post cut short: the id of the turn it made, or None when it cannot have made
        one (nothing of it left this process, or the server refuses it)."""
        answer = self._answer_again()
        return None if answer is None else str(answer["turn_id"])


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
