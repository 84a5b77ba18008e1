"""A telemetry source's bearer token never reaches what the model reads, however the upstream
echoes it.

A remote source (Prometheus, Loki, or a proxy in front of either) may quote the credential it
was sent: in an error body, in an error carried by a 200 answer (``"status": "error"``), in the
data itself (a gateway's access log in Loki). Whatever a source quotes goes to the model (and to
the stored tool result, the turn's event stream and ``kortex ask``), so the token is taken out
in every spelling an answer may use: as sent, JSON-escaped, with "/" as "\\/" (base64 tokens hold
"/"), with Go's ``\\u0026 \\u003c \\u003e`` escapes, percent-encoded. Under the sources, the tool
pipeline takes the sources' credentials out of every error message word for word.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from kortex.errors import UpstreamError
from kortex.messages import ToolCall
from kortex.telemetry.http import BoundedClient, spellings
from kortex.tools.pipeline import ToolPipeline
from kortex.tools.policy import ToolPolicy
from kortex.tools.registry import ToolRegistry
from kortex.tools.spec import ToolContext, ToolInput, ToolSpec
from tests.conftest import Harness

Answer = Callable[[str, str], tuple[int, bytes]]  # (path, token) -> (status, body)


class Upstream:
    """A real HTTP server answering every GET with ``answer(path, token)``: (status, body)."""

    def __init__(self, answer: Answer) -> None:
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                token = self.headers.get("authorization", "").partition(" ")[2]
                upstream.seen.append(token)
                status, body = answer(urlsplit(self.path).path, token)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.seen: list[str] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _go_json(value: Any) -> str:
    """JSON as Go's encoding/json writes it: ``& < >`` as \\u0026 \\u003c \\u003e."""
    return json.dumps(value).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _status_error_in_200(path: str, token: str) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "error", "errorType": "bad_data",
                            "error": f"token {token} is not valid for this org"}).encode()


def _escaped_slash_in_401(path: str, token: str) -> tuple[int, bytes]:
    # JSON as PHP, Jackson (some configurations) and many gateways write it: "/" as "\/"
    text = json.dumps({"status": "error", "errorType": "unauthorized", "error": f"token {token} rejected"})
    return 401, text.replace("/", "\\/").encode()


def _go_escapes_in_401(path: str, token: str) -> tuple[int, bytes]:
    return 401, _go_json({"status": "error", "errorType": "unauthorized", "error": f"token {token} rejected"}).encode()


def _percent_encoded_in_403(path: str, token: str) -> tuple[int, bytes]:
    return 403, f"forbidden: GET {path} for {quote(token, safe='')}".encode()  # a proxy quoting a URL


ANSWERS: dict[str, Answer] = {"200-status-error": _status_error_in_200, "401-escaped-slash": _escaped_slash_in_401,
                              "401-go-escapes": _go_escapes_in_401, "403-percent-encoded": _percent_encoded_in_403}
SOURCES = {"prometheus": ("metrics", "get_metrics"), "loki": ("logs", "get_logs")}


def _unescaped(text: str) -> str:
    """What a reader (a model) makes of the escapes: a token hidden only by them is not hidden."""
    for escape, char in (("\\/", "/"), ("\\u0026", "&"), ("\\u003c", "<"), ("\\u003e", ">"), ("%2F", "/"),
                         ("%3D", "="), ("%26", "&"), ("%3C", "<"), ("%3E", ">")):
        text = text.replace(escape, char)
    return text


@pytest.fixture
def token() -> str:
    # a base64 bearer token holds "/" (Grafana Cloud's glc_..., many others); "&<>" for Go's escapes
    return f"glc_{uuid.uuid4().hex[:16]}/{uuid.uuid4().hex[:8]}&<{uuid.uuid4().hex[:8]}>=="


def _harness(harness_factory: Any, source: str, url: str, token: str) -> Harness:
    kind = SOURCES[source][0]
    return harness_factory(telemetry={  # type: ignore[no-any-return]
        kind: source, source: {"url": url, "single_tenant": True, "bearer_token": token,
                               **({"org_id_from_tenant": False} if source == "loki" else {})}})


def _args(tool: str) -> dict[str, Any]:
    return {"product": "checkout", "time_range": "last 1h", **({"metric_name": "latency_ms"}
                                                                if tool == "get_metrics" else {})}


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("source", list(SOURCES))
def test_a_source_token_echoed_in_an_error_never_reaches_the_model(
        harness_factory: Any, token: str, source: str, answer: str) -> None:
    upstream = Upstream(ANSWERS[answer])
    try:
        h = _harness(harness_factory, source, upstream.url, token)
        tool = SOURCES[source][1]
        result = h.call(h.tenant("acme"), tool, _args(tool))
    finally:
        upstream.close()
    assert upstream.seen and upstream.seen[0] == token  # the source sent it, and the upstream quoted it back
    assert result.is_error and result.error_code == "upstream"
    seen_by_model = json.dumps(result.content)
    assert token not in _unescaped(json.loads(seen_by_model)["message"]), seen_by_model
    if source == "loki" or answer != "403-percent-encoded":  # Prometheus quotes JSON errors only
        assert "REDACTED" in seen_by_model  # the upstream's words are kept, the token is not


def test_a_token_in_the_logs_loki_returns_never_reaches_the_model(harness_factory: Any, token: str) -> None:
    now_ns = time.time_ns()

    def answer(path: str, sent: str) -> tuple[int, bytes]:
        if path.endswith("/query_range"):
            return 200, json.dumps({"status": "success", "data": {"resultType": "streams", "result": [{
                "stream": {"product": "checkout", "level": "error", "host": f"gw-{sent}"},
                "values": [[str(now_ns - 60_000_000_000), f"refused {sent} (org 7)"],
                           [str(now_ns - 30_000_000_000), "checkout latency p99 2.3s"]]}]}}).encode()
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [now_ns / 1e9, "2"]}]}}).encode()

    upstream = Upstream(answer)
    try:
        h = _harness(harness_factory, "loki", upstream.url, token)
        result = h.call(h.tenant("acme"), "get_logs", _args("get_logs"))
    finally:
        upstream.close()
    assert not result.is_error, result.content
    seen_by_model = json.dumps(result.content)
    assert "checkout latency p99 2.3s" in seen_by_model and "(org 7)" in seen_by_model
    assert token not in _unescaped(seen_by_model), seen_by_model
    assert "refused [REDACTED] (org 7)" in seen_by_model and "gw-[REDACTED]" in seen_by_model


@pytest.mark.parametrize("form", sorted(spellings("glc_ab/cd&<ef>+==")))
def test_every_spelling_of_a_clients_credential_is_taken_out_of_decoded_text(form: str) -> None:
    client = BoundedClient("prometheus", "http://127.0.0.1:9", timeout=1.0,
                           headers={"Authorization": "Bearer glc_ab/cd&<ef>+=="})
    try:
        assert client.without_secrets(f"refused {form}; retry") == "refused [REDACTED]; retry"
    finally:
        client.close()


class _Echo(ToolInput):
    pass


def _echoing_tool(token: str) -> ToolSpec:
    def run(args: _Echo, ctx: ToolContext) -> dict[str, Any]:
        # an upstream's words reaching an error past the source's own cleaning (a client library's
        # exception, a future source): only the pipeline stands between them and the model
        raise UpstreamError(f"gateway: token {token} has expired (sent at {datetime.now(UTC):%H:%M})")

    return ToolSpec(name="echo_upstream", description="quotes its upstream", input_model=_Echo, run=run,
                    redact=("x",))


def test_the_pipeline_takes_the_sources_credentials_out_of_any_error(harness_factory: Any, token: str) -> None:
    h = _harness(harness_factory, "prometheus", "http://127.0.0.1:9", token)
    registry = ToolRegistry([_echoing_tool(token)])
    pipeline = ToolPipeline(registry, ToolPolicy.build(None, registry))
    ctx = ToolContext(tenant_id="t1", session_id=None, turn_id=None, call_id="c1", step=0, now=datetime.now(UTC),
                      sources=h.k.sources)
    result = pipeline.run(ToolCall(id="c1", name="echo_upstream", arguments={}), ctx)
    assert result.is_error and result.error_code == "upstream"
    message = result.content["message"]
    assert token not in message and "has expired" in message and "[REDACTED]" in message, message
