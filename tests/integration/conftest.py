"""Real services for integration tests: a throwaway PostgreSQL database, a private Redis key
prefix, a real Celery worker process (prefork), the watchdog process and the API under uvicorn.

Everything created here is removed at the end of the session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from kortex.testing.fakellm import FakeLLM
from kortex.testing.scratch import throwaway_database, throwaway_prefix
from tests.conftest import SCRIPTS, Harness, make_settings

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("KORTEX_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KORTEX_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    try:
        with throwaway_database(PG_ADMIN, migrated=True) as (url, _name):
            yield url
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}: {exc}")


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL}: {exc}")
    finally:
        client.close()
    with throwaway_prefix(REDIS_URL) as prefix:
        yield prefix


def service_env(pg_url: str, redis_prefix: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KORTEX_")}
    env.update({
        "KORTEX_DATABASE_URL": pg_url,
        "KORTEX_REDIS_URL": REDIS_URL,
        "KORTEX_REDIS_PREFIX": redis_prefix,
        "KORTEX_TESTING__ENABLE_TEST_PROVIDERS": "true",
        "KORTEX_TESTING__ENABLE_TEST_TOOLS": "true",
        "KORTEX_TESTING__SCRIPTS_DIR": str(SCRIPTS),
        "KORTEX_TOOLS__ALLOWED": json.dumps(["get_logs", "get_metrics", "get_recent_deploys", "debug_sleep",
                                             "debug_echo", "debug_crash"]),
        "KORTEX_LLM__TOOLS__DEBUG_SLEEP__TIMEOUT": "1",
        "KORTEX_TOOLS__SOFT_GRACE": "1",
        "KORTEX_TOOLS__HARD_GRACE": "1",
        "KORTEX_TURN__WATCHDOG_EVERY": "1",
        "KORTEX_TURN__HEARTBEAT": "0.5",
        "KORTEX_TURN__TEXT_FLUSH_MS": "0",
        # model "auto" chooses among these (test_routing.py); pinned models are untouched
        "KORTEX_LLM__ROUTING__CANDIDATES": json.dumps(["anthropic::claude-haiku-4-6", "anthropic::claude-sonnet-4-6",
                                                       "anthropic::claude-opus-4-6"]),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeLLM]:
    """The fake LLM server (in this process) that the services' HTTP providers talk to."""
    with FakeLLM() as fake:
        yield fake


def provider_env(url: str) -> dict[str, str]:
    """Point the Anthropic, OpenAI and Ollama providers of a service at the fake server."""
    return {
        "KORTEX_LLM__PROVIDERS__ANTHROPIC__BASE_URL": url, "KORTEX_LLM__PROVIDERS__ANTHROPIC__API_KEY": "test-key",
        "KORTEX_LLM__PROVIDERS__OPENAI__BASE_URL": url + "/v1", "KORTEX_LLM__PROVIDERS__OPENAI__API_KEY": "test-key",
        "KORTEX_LLM__PROVIDERS__OLLAMA__ENDPOINT": url, "KORTEX_LLM__PROVIDERS__OLLAMA__MODEL": "llama3.2",
    }


class Service:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._file = log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=self._file, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate: Any, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.output()[-4000:]}")
            if predicate():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become ready:\n{self.output()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the main process shuts its children down warmly
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, 9)  # anything left in the group (a wedged child)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(5)
        self._file.close()


class OTLPReceiver:
    """A tiny OTLP/HTTP trace receiver: what the services export, decoded (test_tracing.py)."""

    def __init__(self) -> None:
        import http.server

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                got = []
                for resource in request.resource_spans:
                    service = {a.key: a.value.string_value for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            got.append({"name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                                        "parent_id": span.parent_span_id.hex() or None,
                                        "process": service.get("kortex.process"),
                                        "attributes": {a.key: _otlp_value(a.value) for a in span.attributes}})
                with receiver._lock:
                    receiver.spans.extend(got)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.spans)


def _otlp_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture(scope="session")
def otlp() -> Iterator[OTLPReceiver]:
    receiver = OTLPReceiver()
    yield receiver
    receiver.server.shutdown()


def tracing_env(receiver: OTLPReceiver) -> dict[str, str]:
    # Exported every 100 ms rather than every 5 s, so a test sees a turn's spans promptly.
    return {"KORTEX_TRACING__ENABLED": "true", "KORTEX_TRACING__ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="session")
def worker(pg_url: str, redis_prefix: str, fake_llm: FakeLLM, otlp: OTLPReceiver,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    logs = tmp_path_factory.mktemp("logs")
    argv = [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", "turns,tools", "-P", "prefork",
            "-c", "4", "-l", "INFO", "--without-mingle", "--without-gossip", "-n", f"test-{redis_prefix}@%h"]
    # Metrics as deployed under prefork: the parent serves its children's samples (multiprocess
    # mode, its directory named before the worker imports anything). test_metrics.py scrapes it.
    metrics_port = _free_port()
    metrics_dir = logs / "metrics"
    metrics_dir.mkdir()
    # JSON logs as an operator would turn them on (test_logs.py reads the ids off them).
    env = service_env(pg_url, redis_prefix, **provider_env(fake_llm.url), KORTEX_METRICS_PORT=str(metrics_port),
                      PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), KORTEX_LOG_FORMAT="json", **tracing_env(otlp))
    service = Service("celery worker", argv, env, logs / "worker.log")
    service.metrics_port = metrics_port  # type: ignore[attr-defined]
    # The watchdog's own process, as deployed (`kortex beat`).
    # --alive-file as compose's health check uses it (test_turns.py reads it).
    beat_env = {k: v for k, v in env.items()
                if k not in ("KORTEX_METRICS_PORT", "PROMETHEUS_MULTIPROC_DIR", "KORTEX_LOG_FORMAT")}
    watchdog = Service("watchdog", [sys.executable, "-m", "kortex_cli.main", "beat",
                                    "--alive-file", str(logs / "beat.alive")], beat_env, logs / "beat.log")
    service.alive_file = logs / "beat.alive"  # type: ignore[attr-defined]
    try:
        service.wait_for(lambda: " ready." in service.output())
        watchdog.wait_for(lambda: "watchdog took the lead" in watchdog.output())
        yield service
    finally:
        watchdog.stop()
        service.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def api_service(pg_url: str, redis_prefix: str, worker: Service, fake_llm: FakeLLM, otlp: OTLPReceiver,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    port = _free_port()
    logs = tmp_path_factory.mktemp("api")
    argv = [sys.executable, "-m", "uvicorn", "--factory", "api.main:create_app", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "info"]
    service = Service("api", argv, service_env(pg_url, redis_prefix, **provider_env(fake_llm.url), **tracing_env(otlp)),
                      logs / "api.log")
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        service.wait_for(healthy)
        service.url = url  # type: ignore[attr-defined]
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def api_url(api_service: Service) -> str:
    return api_service.url  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def pg(pg_url: str, redis_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """The test process's own container on the same PostgreSQL and Redis as the services."""
    tmp = tmp_path_factory.mktemp("harness")
    settings = make_settings(tmp, pg_url, redis_url=REDIS_URL, redis_prefix=redis_prefix,
                             tools={"allowed": ["get_logs", "get_metrics", "get_recent_deploys", "debug_sleep",
                                                "debug_echo"]})
    h = Harness(settings)
    yield h
    h.close()
