"""What Kortex counts for Prometheus: turns, steps, tool calls, LLM calls, streams, queues, the
watchdog and refusals. Exposed by each process (api/main.py ``/metrics``; ``kortex worker
--metrics-port``, ``kortex beat --metrics-port``; see ``serve``).

Cost: everything here is touched per turn, step, tool call or LLM call, never per streamed
chunk. Labels are bounded: statuses, outcomes, queue and profile names, and provider/model/tool
names, which configuration bounds. No tenant label: tenants are unbounded (per-tenant figures
are in the audit rows).

Processes that fork (the API's uvicorn workers, a prefork tools worker) use prometheus-client's
multiprocess mode: the command line gives each such service a directory of its own, emptied at
start, in ``PROMETHEUS_MULTIPROC_DIR`` before anything imports prometheus-client (the client
picks its mode at import); every child writes its samples there and whichever process is
scraped adds them up. A dead child's live gauges are dropped (``child_exited``).
"""

from __future__ import annotations

import hmac
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client import multiprocess as _mp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

TURNS_STARTED = Counter("kortex_turns_started", "Turns whose first step began", ["profile"])
TURNS_FINISHED = Counter("kortex_turns_finished", "Turns that ended, by how", ["profile", "status"])
STEP_SECONDS = Histogram("kortex_step_duration_seconds", "One LLM step from claim to hand-off",
                         ["outcome"], buckets=_STEP_BUCKETS)
TOOL_SECONDS = Histogram("kortex_tool_duration_seconds", "One tool call through the pipeline",
                         ["tool", "outcome"], buckets=_TOOL_BUCKETS)
LLM_CALLS = Counter("kortex_llm_calls", "LLM calls, by provider, model and outcome", ["provider", "model", "outcome"])
LLM_FIRST_TOKEN = Histogram("kortex_llm_first_token_seconds", "From an LLM request to its first text or tool call",
                            ["provider", "model"], buckets=_TTFT_BUCKETS)
LLM_TOKENS = Counter("kortex_llm_tokens", "Tokens LLM calls used", ["provider", "model", "kind"])
LLM_COST = Counter("kortex_llm_cost_usd", "What LLM calls cost (list prices)", ["provider", "model"])
SSE_OPEN = Gauge("kortex_sse_streams_open", "Event streams open on this API", multiprocess_mode="livesum")
STREAM_LAG = Histogram("kortex_stream_lag_seconds", "From an event's append to its delivery to a client",
                       buckets=_LAG_BUCKETS)
WATCHDOG_ACTIONS = Counter("kortex_watchdog_actions", "What the watchdog did", ["action"])
REFUSALS = Counter("kortex_budget_refusals", "Requests refused by a limit or budget", ["limit"])


def turn_started(profile: str) -> None:
    TURNS_STARTED.labels(profile).inc()


def turn_finished(profile: str, status: str) -> None:
    TURNS_FINISHED.labels(profile, status).inc()


def step_done(seconds: float, outcome: str) -> None:
    STEP_SECONDS.labels(outcome).observe(seconds)


def tool_done(tool: str, seconds: float, outcome: str) -> None:
    TOOL_SECONDS.labels(tool, outcome).observe(seconds)


def llm_call(provider: str, model: str, *, ok: bool, first_token_s: float | None, input_tokens: int,
             output_tokens: int, cost_usd: float) -> None:
    LLM_CALLS.labels(provider, model, "ok" if ok else "error").inc()
    if first_token_s is not None:
        LLM_FIRST_TOKEN.labels(provider, model).observe(first_token_s)
    if input_tokens:
        LLM_TOKENS.labels(provider, model, "input").inc(input_tokens)
    if output_tokens:
        LLM_TOKENS.labels(provider, model, "output").inc(output_tokens)
    if cost_usd:
        LLM_COST.labels(provider, model).inc(cost_usd)


def refused(limit: str) -> None:
    REFUSALS.labels(limit).inc()


def watchdog(actions: dict[str, int]) -> None:
    for action, count in actions.items():
        if count:
            WATCHDOG_ACTIONS.labels(action).inc(count)


class QueueDepth(Collector):
    """Each queue's depth, read from the broker when Prometheus scrapes (``kortex beat``).

    ``read`` returns every queue's depth at once and must give up quickly (workers/dispatch.py
    ``CeleryQueue.depths``): a scrape waits for it. When it fails the scrape has no depth at
    all, rather than a stale figure that would read as current."""

    def __init__(self, read: Callable[[], Mapping[str, int]]) -> None:
        self._read = read

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("kortex_queue_depth", "Messages waiting in each queue", labels=["queue"])
        try:
            depths = self._read()
        except Exception:  # the broker is down: the scrape goes on without these figures
            depths = {}
        for queue, depth in depths.items():
            family.add_metric([queue], float(depth))
        yield family


def registry() -> CollectorRegistry | None:
    """What to expose: the samples of every process of this service in multiprocess mode, or
    None (the default registry) in a single process."""
    if not os.environ.get(MULTIPROC_ENV):
        return None
    merged = CollectorRegistry()
    _mp.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return merged


def child_exited(pid: int) -> None:
    if os.environ.get(MULTIPROC_ENV):
        _mp.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape."""


def _bearer(app: WSGIApplication, token: str) -> WSGIApplication:
    """``app`` for callers that send ``Authorization: Bearer <token>``; 401 for the others."""
    expected = token.encode()

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        scheme, _, given = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        # WSGI hands headers over as latin-1 text; bytes compare whatever a caller sent.
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("latin-1", "replace"), expected):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Bearer realm="metrics"')])
        return [b"send 'Authorization: Bearer <metrics token>'\n"]

    return guarded


def serve(port: int, host: str = "0.0.0.0", extra: Iterable[Collector] = (),
          token: str | None = None) -> WSGIServer:
    """An HTTP endpoint for Prometheus on a thread of this process (workers, beat). With a
    ``token`` (``[metrics] token``) a scrape must send ``Authorization: Bearer <token>``, as the
    API's ``/metrics`` requires: these ports listen on every address."""
    merged = registry()
    if merged is None:
        from prometheus_client import REGISTRY
        merged = REGISTRY
    for collector in extra:
        merged.register(collector)
    app = make_wsgi_app(merged)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, _bearer(app, token) if token else app, Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


__all__ = ["MULTIPROC_ENV", "QueueDepth", "child_exited", "llm_call", "refused",
           "registry", "serve", "step_done", "tool_done", "turn_finished", "turn_started", "watchdog"]
